"""evotuner: an Optuna-driven autotuner for fused attention CUDA kernels on NVIDIA Hopper,
in two kernel families: hopper (wgmma + TMA + warp specialization) and FlashCore (mma.sync).

``import evotuner`` stays cheap and works without CUDA: ``flash_attention``,
``flash_attention_varlen`` and ``use_tuned`` (which pull in torch and the driver binding) are imported on first access.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["flash_attention", "flash_attention_varlen", "use_tuned", "__version__"]
_LAZY = ("flash_attention", "use_tuned")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from evotuner.runtime import attention

        value = getattr(attention, name)
        globals()[name] = value
        return value
    if name == "flash_attention_varlen":
        from evotuner.runtime.varlen import flash_attention_varlen

        globals()[name] = flash_attention_varlen
        return flash_attention_varlen
    raise AttributeError(f"module 'evotuner' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names and the module's dunders (not ``Any`` or ``annotations``)."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__") and n.endswith("__"))})
