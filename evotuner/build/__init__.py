"""The build stage: KernelConfig + Problem -> BuildResult (a cached cubin or a recorded failure)."""

from evotuner.build.builder import Builder, packaged_kernels_root
from evotuner.build.cache import BuildCache, default_cache_root
from evotuner.build.cubin import CubinError, read_meta
from evotuner.build.instantiate import render_source
from evotuner.build.nvcc import Toolchain, find_nvcc
from evotuner.build.result import Artifact, BuildResult

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
    "read_meta",
    "render_source",
]
