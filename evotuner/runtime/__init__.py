"""The GPU runtime: the CUDA driver binding (cuda), the launch ABI (params), cubin
loading and launching (loader), ``flash_attention`` (attention) and its C++ hot path
(fastpath), the correctness rule (check) and event timing (timing). Import the submodule
you need; nothing here touches CUDA at import time."""

from __future__ import annotations


def build_fastpath(timeout_s: float | None = None) -> str:
    """Build (unless cached) and load the C++ hot path of ``evotuner.flash_attention`` now,
    blocking; returns its one-line status (:func:`evotuner.runtime.fastpath.status`). Without
    this, the first eager call starts it in the background."""
    from evotuner.runtime import fastpath

    return fastpath.build() if timeout_s is None else fastpath.build(timeout_s=timeout_s)


def fastpath_status() -> str:
    """One line: whether the C++ hot path serves calls, is building, or why it does not."""
    from evotuner.runtime import fastpath

    return fastpath.status()
