"""The build stage: KernelConfig + Problem -> BuildResult (a cached cubin or a recorded failure)."""

from evotuner.compiler.builder import Builder, packaged_kernels_root
from evotuner.compiler.cache import BuildCache, default_cache_root
from evotuner.compiler.cubin import CubinError, read_family_meta, read_meta
from evotuner.compiler.instantiate import render_source
from evotuner.compiler.nvcc import Toolchain, find_nvcc
from evotuner.compiler.result import Artifact, BuildResult

__all__ = [
    "Artifact",
    "BuildCache",
    "BuildResult",
    "Builder",
    "CubinError",
    "Toolchain",
    "default_cache_root",
    "find_nvcc",
    "packaged_kernels_root",
    "read_family_meta",
    "read_meta",
    "render_source",
]
