"""The PTX of one hopper kernel instantiation, for tests that read the instructions nvcc emits
(no GPU: ``nvcc -ptx`` for sm_90a over kernels/hopper/instantiate.cuh)."""

from __future__ import annotations

import shutil
from pathlib import Path

from evotuner import childproc
from evotuner.kernels.hopper import launch

KERNELS = Path(launch.__file__).resolve().parent.parent

#: The knobs a test does not name: D=128 non-causal fp16, three consumer warpgroups.
BASE = dict(HEAD_DIM=128, IS_CAUSAL=0, DTYPE=0, BLOCK_N=80, CONSUMER_WGS=3, STAGES=2, REG_PROD=24, REG_CONS=160,
            OVERLAP=1, PINGPONG=1, SCHED=2)


def hopper_ptx(tmp_path: Path, extra: str = "", **knobs: int) -> str:
    """The PTX of instantiate.cuh with ``knobs`` over :data:`BASE` as HOPPER_* macros (``extra``:
    source lines before them, e.g. a dev macro); fails the test with nvcc's output (nvcc runs
    through :func:`evotuner.childproc.run`: bounded, its process group killed)."""
    defines = "".join(f"#define HOPPER_{name} {value}\n" for name, value in {**BASE, **knobs}.items())
    src, out = tmp_path / "kernel.cu", tmp_path / "kernel.ptx"
    src.write_text(f"{extra}{defines}#include \"hopper/instantiate.cuh\"\n")
    run = childproc.run([shutil.which("nvcc"), "-ptx", "-arch=sm_90a", "-O3", "-std=c++17", "-I", str(KERNELS),
                         str(src), "-o", str(out)], timeout_s=600)
    assert run.returncode == 0, run.output.decode(errors="replace")
    return out.read_text()
