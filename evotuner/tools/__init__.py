"""External NVIDIA tools evotuner drives on the GPU machine: compute-sanitizer
(:mod:`evotuner.tools.sanitizer`) and Nsight Compute (:mod:`evotuner.tools.ncu`).

Each module owns one tool: how to find it, the command line evotuner runs, and
a parser for what the tool writes (tested on real outputs saved from an H100,
``tests/data/tools/``). Nothing here runs a GPU or a subprocess; running them
is :mod:`evotuner.diagnose`'s business (through the GPU worker).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from evotuner.errors import EvotunerError


#: Toolkit roots searched after PATH ($CUDA_HOME and $CUDA_PATH come first).
CUDA_ROOTS: tuple[str, ...] = ("/usr/local/cuda",)


class ToolError(EvotunerError):
    """An external tool is missing, cannot run, or said something evotuner cannot use."""


class ToolMissingError(ToolError):
    """The tool is not on PATH (nor in $CUDA_HOME/bin)."""


class ProfilerPermissionError(ToolError):
    """Nsight Compute may not read the GPU's performance counters (ERR_NVGPUCTRPERM)."""


def find_tool(name: str, env_var: str) -> Path:
    """The tool's executable, as an absolute path (it runs from a folder of its own):
    ``$<env_var>``, else PATH, else ``$CUDA_HOME/bin`` / /usr/local/cuda/bin.

    Raises :class:`ToolMissingError` naming the tool and where it looked.
    """
    return _find_tool(name, env_var).absolute()


def _find_tool(name: str, env_var: str) -> Path:
    given = os.environ.get(env_var)
    if given:
        path = Path(given)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise ToolMissingError(f"{env_var}={given} is not an executable file",
                               f"point {env_var} at the {name} binary, or unset it")
    found = shutil.which(name)
    if found:
        return Path(found)
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), *CUDA_ROOTS]
    for root in filter(None, roots):
        candidate = Path(root) / "bin" / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ToolMissingError(
        f"{name} not found on PATH (nor in $CUDA_HOME/bin or /usr/local/cuda/bin)",
        f"install the CUDA toolkit's {name} (it ships with CUDA 12+) and put it on PATH, or set {env_var}",
    )
