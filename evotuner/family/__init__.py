"""Kernel families as plug-ins: the contract (:class:`KernelFamily`) and the registry."""

from evotuner.family.base import (
    BUILD_RESERVED,
    AttentionArgs,
    DeviceInfo,
    KernelFamily,
    LaunchSpec,
    TensorView,
    VarlenArgs,
)
from evotuner.family.registry import DEFAULT_FAMILY, families, family_names, get_family, register, unregister

__all__ = [
    "BUILD_RESERVED", "AttentionArgs", "DeviceInfo", "KernelFamily", "LaunchSpec", "TensorView", "VarlenArgs",
    "DEFAULT_FAMILY", "families", "family_names", "get_family", "register", "unregister",
]
