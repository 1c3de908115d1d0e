"""What the build stage produces (frozen values)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evotuner.config import KernelConfig


@dataclass(frozen=True)
class Artifact:
    """A compiled config the GPU stage can load: a cubin with the family's entry.

    ``meta`` is the kernel's meta table read from the cubin (evotuner/abi.py: abi,
    threads, smem_bytes, head_dim, is_causal, dtype, min_blocks, then the family's
    own fields): the launch geometry comes from here, never recomputed. ``entry``
    and ``family`` name the kernel and its :class:`~evotuner.family.KernelFamily`
    (empty: the only entry of the ptxas report / unknown).
    """

    cubin: Path
    key: str                 # content-addressed cache key
    sha256: str              # of the cubin bytes
    meta: dict[str, int] = field(hash=False, compare=False)
    entry: str = ""
    family: str = ""


@dataclass(frozen=True)
class BuildResult:
    config: KernelConfig
    key: str
    ok: bool
    artifact: Artifact | None
    ptxas_log: str           # the -Xptxas -v report (and any compiler output)
    seconds: float
    cached: bool
    error: str | None = None  # why the build failed (compiler error tail, timeout)
