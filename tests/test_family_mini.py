"""A second kernel family through the whole CLI with no change to generic code.

``mini`` (tests/families/mini.py, kernels in tests/families/kernels/mini/) has its own
parameter names, macros, symbols, meta fields, Params (plus a second kernel argument)
and launch grid. It is registered by tests/conftest.py through the same registry as
FlashCore. Here it goes through ``evotuner compile`` (real nvcc), a sweep recorded
with the real Builder and gate (made-up timings), a replayed ``search``, ``resume``,
``show --json`` and ``export`` (the header compiles with g++ and, with FlashCore's
rows beside it, holds both families)."""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import run
from evotuner import cli
from evotuner.compiler import Builder
from evotuner.family import AttentionArgs, DeviceInfo, TensorView, get_family
from evotuner.measure.base import Measurement, MeasureStage
from evotuner.problem import Problem, Shape
from evotuner.space import load_space
from families.mini import SPACE, MiniParams

REPO = Path(__file__).resolve().parents[1]
SHAPE = "B=2,H=4,S=256,D=32"
PROBLEM = Problem(Shape.parse(SHAPE), dtype="fp16", causal=False)
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


class MadeUpMeasure(MeasureStage):
    """Deterministic made-up timings (never reported): a function of the meta table."""

    def measure(self, artifact, problem):
        m = artifact.meta
        us = 50.0 + m["rows"] / 8 + 7 * m["persistent"] + int(hashlib.sha256(str(m).encode()).hexdigest()[:2], 16) / 50
        return Measurement(median_us=us, p20_us=us * 0.99, p80_us=us * 1.01, tflops=problem.tflops(us),
                           max_error=1e-4, tolerance=4e-3, repetitions=10)

    def baselines(self, problem):
        return {"sdpa_default": 80.0, "sdpa_flash": 80.0, "sdpa_efficient": 120.0}

    def device(self):
        return {"name": "MADE-UP (test only)", "sm_count": 132}


def _sweep_module():
    spec = importlib.util.spec_from_file_location("evotuner_sweep_script", REPO / "scripts" / "sweep.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, build_cache_dir):
    """Every config of the mini space at SHAPE, built and gated for real, timings made up."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    out = tmp_path_factory.mktemp("mini") / "mini_d32.csv"
    space = load_space(SPACE)
    with Builder(space.kernel, arch=space.arch, cache_dir=build_cache_dir, jobs=2) as builder:
        summary = _sweep_module().run_sweep(space=space, problem=PROBLEM, builder=builder, measure=MadeUpMeasure(),
                                            output=out, fresh=True)
    assert summary.counts.get("ok", 0) >= 2, summary.counts
    return out


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path, build_cache_dir):
    monkeypatch.delenv(cli.STORAGE_ENV, raising=False)
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(build_cache_dir))
    monkeypatch.chdir(tmp_path)


def test_the_family_is_registered_and_differs_from_flashcore():
    mini, flashcore = get_family("mini"), get_family("flashcore")
    space = load_space(SPACE)
    assert space.kernel == "mini" and set(space.names).isdisjoint(load_space(None).names)
    assert mini.macro_prefix != flashcore.macro_prefix and mini.entry != flashcore.entry


def test_launch_packs_its_own_params_and_a_persistent_grid():
    mini = get_family("mini")
    t = TensorView(ptr=4096, shape=(2, 4, 300, 32), strides=(4 * 300 * 32, 300 * 32, 32, 1))
    args = AttentionArgs(q=t, k=t, v=t, o=t, lse=None, dtype="fp16", scale=0.25)
    meta = {"threads": 64, "smem_bytes": 0, "rows": 64, "persistent": 1}
    spec = mini.launch(meta, args, DeviceInfo(index=0, sm_count=3))
    assert spec.grid == (12, 1, 1) and spec.block == (64, 1, 1)      # min(tiles=40, 3 SMs x 4)
    assert len(spec.args) == 2 and spec.args[1] == bytes(ctypes.c_float(0.25))
    p = MiniParams.from_buffer_copy(spec.args[0])
    assert (p.q_row, p.q_head, p.tiles, p.seqlen_q) == (32, 300 * 32, 5 * 4 * 2, 300)
    spec = mini.launch({**meta, "persistent": 0}, args, DeviceInfo(index=0, sm_count=3))
    assert spec.grid == (5, 4, 2)


@needs_nvcc
def test_compile_json(capsys):
    code, out, err = run(capsys, "compile", "--space", SPACE, "--config", "ROWS=64,UNROLL=1,PERSISTENT=1",
                         "--shape", "D=32", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["passed"] is True, shown
    assert shown["params"] == {"ROWS": 64, "UNROLL": 1, "PERSISTENT": 1}
    assert shown["gate"]["registers"] > 0 and shown["gate"]["spill_stores"] == 0


@needs_nvcc
def test_compile_reports_the_family_gate_rule(capsys):
    code, out, err = run(capsys, "compile", "--space", SPACE, "--config", "ROWS=256,UNROLL=1,PERSISTENT=0",
                         "--shape", "D=32", "--json")
    shown = json.loads(out)
    assert code == cli.GATE_REJECTED_EXIT, err              # builds, but the gate rejects it
    assert shown["passed"] is False and "mini" not in shown["reason"] and "lower ROWS" in shown["reason"], shown


def test_replayed_search_resume_show_and_export(capsys, tmp_path, sweep):
    db = f"sqlite:///{tmp_path / 'm.db'}"
    code, out, err = run(capsys, "search", "--study", "m", "--shape", SHAPE, "--space", SPACE, "--trials", 4,
                         "--replay", sweep, "--storage", db)
    assert code == 0, err
    code, out, err = run(capsys, "resume", "--study", "m", "--trials", 8, "--replay", sweep, "--storage", db)
    assert code == 0, err
    code, out, err = run(capsys, "show", "--study", "m", "--json", "--storage", db)
    assert code == 0, err
    shown = json.loads(out)
    assert len(shown["trials"]) == 8 and shown["best"] is not None
    assert set(shown["best"]["params"]) == {"ROWS", "UNROLL", "PERSISTENT"}

    # FlashCore's replayed study in the same database: one header holds both families.
    fc_sweep = REPO / "tests" / "data" / "replay" / "synthetic_d64.csv"
    code, out, err = run(capsys, "search", "--study", "fc", "--shape", "B=16,H=16,S=2048,D=64", "--trials", 3,
                         "--replay", fc_sweep, "--storage", db)
    assert code == 0, err
    header = tmp_path / "tuned.h"
    code, out, err = run(capsys, "export", "--study", "m", "--study", "fc", "--output", header, "--storage", db)
    assert code == 0, err
    text = header.read_text()
    assert "namespace mini::tuned {" in text and "namespace flashcore::tuned {" in text
    assert "#define MINI_TUNED_COUNT 1" in text and "#define FLASHCORE_TUNED_COUNT 1" in text
    assert "MINI_TUNED_0_ROWS" in text and "FLASHCORE_TUNED_0_BLOCK_M" in text

    gxx = shutil.which("g++") or shutil.which("c++")
    if gxx is None:
        pytest.skip("no host C++ compiler")
    src = tmp_path / "use.cpp"
    src.write_text('#include "tuned.h"\nint main() {\n'
                   '  const auto* m = mini::tuned::select(32, 0, false, 256, 256);\n'
                   '  const auto* f = flashcore::tuned::select(64, 0, false, 2048, 16 * 16 * 2048);\n'
                   '  return (m != nullptr && f != nullptr && m->rows > 0 && f->block_m > 0) ? 0 : 1;\n}\n')
    build = subprocess.run([gxx, "-std=c++17", str(src), "-I", str(tmp_path), "-o", str(tmp_path / "use")],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    assert subprocess.run([str(tmp_path / "use")], timeout=30).returncode == 0


def test_flash_attention_picks_the_fastest_family_and_falls_back_to_flashcore(monkeypatch):
    attention = pytest.importorskip("evotuner.runtime.attention")
    mini = get_family("mini")
    d32 = Problem(Shape(1, 2, 64, 64, 32), "fp16", False)
    tie = attention.choose(d32)
    assert tie.family == "flashcore"                                   # no figure: the default family
    monkeypatch.setattr(mini, "expected_speed", lambda problem: 1.0)   # mini's figure beats FlashCore's
    fast = attention.choose(d32)
    assert fast.family == "mini" and fast.config["ROWS"] == 64 and "fastest" in fast.why
    d96 = attention.choose(Problem(Shape(1, 2, 64, 64, 96), "fp16", False), exclude={"hopper": "set aside"})
    assert d96.family == "flashcore" and "mini" in d96.why              # mini does not support D=96
    bf16 = attention.choose(Problem(Shape(1, 2, 64, 64, 32), "bf16", False))
    assert bf16.family == "flashcore"
    asked = attention.choose(d32, family="flashcore")
    assert asked.family == "flashcore" and asked.why == "asked for"
