"""evotuner: an Optuna-driven autotuner for the FlashCore attention kernel.

``import evotuner`` stays cheap and works without CUDA: ``flash_attention``
(which pulls in torch and the driver binding) is imported on first access.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["flash_attention", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "flash_attention":
        from evotuner.runtime.attention import flash_attention

        globals()["flash_attention"] = flash_attention
        return flash_attention
    raise AttributeError(f"module 'evotuner' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"flash_attention"})
