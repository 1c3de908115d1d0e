"""What the build stage produces (frozen values)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from evotuner.config import KernelConfig


@dataclass(frozen=True)
class Artifact:
    """A compiled config the GPU stage can load: a cubin with entry ``flashcore_fwd``.

    ``meta`` is the kernel's ``flashcore_meta`` table read from the cubin
    (threads, smem_bytes, block_m, block_n, head_dim, is_causal, dtype,
    min_blocks, abi): the launch geometry comes from here, never recomputed.
    """

    cubin: Path
    key: str                 # content-addressed cache key
    sha256: str              # of the cubin bytes
    meta: dict[str, int] = field(hash=False, compare=False)
    entry: str = "flashcore_fwd"


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
