"""Export to a C++ header: selection, validation, atomic write, and the header compiled
for real (g++ host program calling select(); nvcc building the kernel from its rows)."""

from __future__ import annotations

import datetime as dt
import math
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from evotuner.compiler.cubin import read_meta
from evotuner.kernels.flashcore.params import META_FIELDS as FC_FIELDS
from evotuner.compiler.instantiate import compile_flags
from evotuner.compiler.nvcc import find_nvcc, run
from evotuner.errors import BuildError, EvotunerError, StorageError
from evotuner.export import BUCKET_EDGES, OPEN_BUCKET, ExportError, export_header, seqlen_bucket
from evotuner.header import read_header, row_instantiation
from evotuner.problem import Problem, Shape
from evotuner.family import get_family
from evotuner.space import load_space
from evotuner.storage.records import StudyRecord, StudySummary, TrialRecord

REPO = Path(__file__).resolve().parents[1]
TOY_ROOT = REPO / "tests" / "data" / "kernels"
NVCC_TIMEOUT_S = 300
CREATED = dt.datetime(2026, 11, 20, 12, 0, 0)
NVCC_VERSION = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\nBuild x"


def P(bm: int = 128, bn: int = 64, warps: int = 4, stages: int = 2, minb: int = 1) -> dict[str, object]:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "NUM_WARPS": warps, "STAGES": stages, "MIN_BLOCKS": minb}


def trial(number: int, value: float | None, params: dict[str, object], state: str = "COMPLETE",
          tflops: float | None = 100.0) -> TrialRecord:
    return TrialRecord(number=number, state=state, value=value, params=params, tflops=tflops,
                       datetime=CREATED + dt.timedelta(minutes=number))


def summary(name: str, trials: list[TrialRecord], *, s: int = 2048, d: int = 64, dtype: str = "fp16",
            causal: bool = False, device: str = "NVIDIA H100 80GB HBM3", family: str = "flashcore",
            rows: tuple[int, int, int] = (4, 16, 0)) -> StudySummary:
    """A study of B, H, Sq = ``rows`` (Sq 0: ``s``) and Sk = ``s``."""
    b, h, sq = rows
    return StudySummary(
        study=name, problem=Problem(Shape(b, h, sq or s, s, d), dtype, causal), space_name="default",
        space_fingerprint="f" * 16, kernel_family=family, sampler="tpe", seed=0, created=CREATED,
        source_hash="abc123def456", nvcc_version=NVCC_VERSION, evotuner_version="0.1.0",
        device={"name": device, "sm_count": 132}, devices=(), baselines={}, best=None, trials=tuple(trials),
    )


class FakeStore:
    """The StudyStore read side export uses (evotuner.export.ExportSource): each study was
    created with its family's packaged space; no `evotuner check` records; no database file."""

    def __init__(self, *summaries: StudySummary) -> None:
        self.summaries = {x.study: x for x in summaries}

    def summary(self, name: str) -> StudySummary:
        if name not in self.summaries:
            raise StorageError(f"study '{name}' not found", "check --study")
        return self.summaries[name]

    def study_info(self, name: str) -> StudyRecord:
        s = self.summary(name)
        space = load_space(get_family(s.kernel_family).default_space())
        return StudyRecord(name=name, problem=s.problem, space_name=s.space_name,
                           space_fingerprint=s.space_fingerprint, space_text=space.text,
                           kernel_family=s.kernel_family, sampler=s.sampler, seed=s.seed, source_hash=s.source_hash,
                           nvcc_version=s.nvcc_version, evotuner_version=s.evotuner_version, created=s.created)

    def latest_checks(self, study: str) -> dict[str, dict[str, object]]:
        return {}

    def value_damage(self, study_name: str, number: int) -> None:
        return None

    def database_files(self) -> tuple[Path, ...]:
        return ()


def three_studies() -> FakeStore:
    return FakeStore(
        summary("d64_s2k", [trial(0, 150.0, P()), trial(1, 120.5, P(bn=128, stages=3)),
                            trial(2, None, P(bm=64), state="FAIL"), trial(3, 99.0, P(bm=16), state="PRUNED")]),
        summary("d64_s512", [trial(0, 40.0, P(bm=64, bn=64, warps=4))], s=512),
        summary("d128_causal_bf16", [trial(5, 300.0, P(bm=128, bn=128, warps=8, minb=1))],
                s=16384, d=128, dtype="bf16", causal=True),
    )


def H(bn: int = 128, wgs: int = 3, stages: int = 2, rp: int = 32, rc: int = 160, sched: int = 0) -> dict[str, object]:
    """A hopper-family config (kernels/hopper/defaults.toml's D64 entry by default)."""
    return {"BLOCK_N": bn, "CONSUMER_WGS": wgs, "STAGES": stages, "REG_PROD": rp, "REG_CONS": rc, "OVERLAP": 1,
            "PINGPONG": 1, "SCHED": sched, "RESCALE_LOG2": 8, "EXP_EMU": 0}


#: hopper_split.toml's recommended config of a grouped decode at D=128 (one 64-row warpgroup,
#: packed query heads), with 8 splits: the split row of ``hopper_studies(split=True)``.
SPLIT_ROW = {"BLOCK_N": 128, "CONSUMER_WGS": 1, "STAGES": 3, "REG_PROD": 24, "REG_CONS": 256, "OVERLAP": 1,
             "PINGPONG": 0, "SCHED": 0, "RESCALE_LOG2": 0, "EXP_EMU": 0, "SPLITS": 8, "PACK_GQA": 1}


def hopper_studies(pack: bool = False, split: bool = False) -> FakeStore:
    """One hopper row per scheduler: D64 fp16 (SCHED 0), D64 causal (SCHED 2), D128 bf16
    (SCHED 1), D128 causal fp16 (3 stages, SCHED 0) - the family's recommended configs.
    ``pack``: the D128 bf16 row packs grouped query heads (PACK_GQA=1), the others take the
    knob's default. ``split``: a fifth study, ``h_d128_split`` (bf16, D128, non-causal, the
    8192 bucket, a decode of B=1, H=32, Sq=1: query-rows bucket 5, the others' is 17 or 18:
    rows 4), whose row is split-KV (:data:`SPLIT_ROW`)."""
    d128 = dict(wgs=2, rp=24, rc=240)
    packed = {"PACK_GQA": 1} if pack else {}
    studies = [
        summary("h_d64", [trial(0, 500.0, H())], family="hopper"),
        summary("h_d64_causal", [trial(0, 300.0, H(sched=2))], s=4096, causal=True, family="hopper"),
        summary("h_d128_bf16", [trial(0, 400.0, {**H(**d128, sched=1), **packed})], d=128, dtype="bf16",
                family="hopper"),
        summary("h_d128_causal", [trial(0, 900.0, H(**d128, stages=3))], s=4096, d=128, causal=True,
                family="hopper"),
    ]
    if split:
        studies.append(summary("h_d128_split", [trial(0, 60.0, SPLIT_ROW)], s=8192, d=128, dtype="bf16",
                               rows=(1, 32, 1),
                               family="hopper"))
    return FakeStore(*studies)


HOPPER_STUDIES = ["h_d64", "h_d64_causal", "h_d128_bf16", "h_d128_causal"]
HOPPER_SPLIT_STUDIES = [*HOPPER_STUDIES, "h_d128_split"]


# ------------------------------------------------------------------------------------------ selection


@pytest.mark.parametrize("seqlen,bucket", [
    (1, 512), (512, 512), (513, 1024), (1024, 1024), (2047, 2048), (4096, 4096), (8192, 8192),
    (8193, OPEN_BUCKET), (1 << 20, OPEN_BUCKET),
])
def test_seqlen_bucket_edges(seqlen: int, bucket: int) -> None:
    assert BUCKET_EDGES == (512, 1024, 2048, 4096, 8192)
    assert seqlen_bucket(seqlen) == bucket


def test_header_content(tmp_path: Path) -> None:
    out = tmp_path / "flashcore_config.h"
    result = export_header(three_studies(), ["d64_s2k", "d64_s512", "d128_causal_bf16"], out)
    text = out.read_text()
    assert result.path == out and result.skipped == ()
    # header order: dtype, head_dim, causal, bucket
    assert [(r.study, r.trial, r.max_seqlen) for r in result.rows] == [
        ("d64_s512", 0, 512), ("d64_s2k", 1, 2048), ("d128_causal_bf16", 5, OPEN_BUCKET)]
    assert text.startswith("// generated by evotuner export")
    assert "#pragma once" in text and "#include <cstdint>" in text
    assert "namespace flashcore::tuned {" in text
    for field in ("int head_dim;", "int dtype;", "bool causal;", "int query_rows_bucket;", "int max_seqlen;",
                  "int block_m;",
                  "int block_n;", "int min_blocks;", "int num_warps;", "int stages;"):
        assert field in text
    # fields in FlashCore's order: BLOCK_M, BLOCK_N, NUM_WARPS, STAGES, MIN_BLOCKS
    assert text.index("int block_n;") < text.index("int num_warps;") < text.index("int stages;") < text.index(
        "int min_blocks;")
    # B*H*Sq 4*16*512 -> query-rows bucket 15, 4*16*2048 -> 17, 4*16*16384 -> 20
    assert "    {64, 0, false, 15, 512, 64, 64, 4, 2, 1}," in text
    assert "    {64, 0, false, 17, 2048, 128, 128, 4, 3, 1}," in text
    assert f"    {{128, 1, true, 20, {OPEN_BUCKET}, 128, 128, 8, 2, 1}}," in text
    assert "// [1] study d64_s2k, trial 1: 120.500 us, 100.00 TFLOPS (B*H*Sq 131072, seqlen_k 2048)" in text
    assert "2026-11-20T12:01:00; nvcc 13.0, V13.0.88; source abc123def456; device NVIDIA H100 80GB HBM3" in text
    assert "#define FLASHCORE_TUNED_COUNT 3" in text
    assert '#define FLASHCORE_TUNED_ARCH "sm_90a"' in text
    assert re.search(r"^#define FLASHCORE_TUNED_2_IS_CAUSAL +1$", text, re.M)
    assert re.search(r"^#define FLASHCORE_TUNED_2_QUERY_ROWS_BUCKET +20$", text, re.M)
    info = read_header(out)
    assert info.arch == "sm_90a" and len(info.rows) == 3
    assert info.rows[0] == ("HEAD_DIM", "IS_CAUSAL", "DTYPE", "QUERY_ROWS_BUCKET", "MAX_SEQLEN",
                            "BLOCK_M", "BLOCK_N", "NUM_WARPS", "STAGES", "MIN_BLOCKS")
    # deterministic: the same studies give byte-identical headers
    again = export_header(three_studies(), ["d64_s2k", "d64_s512", "d128_causal_bf16"], tmp_path / "b.h")
    assert again.sha256 == result.sha256


def test_same_key_keeps_the_faster_study(tmp_path: Path) -> None:
    # seqlen 1500 and 2048 both fall in the <= 2048 bucket, B*H*Sq 96000..131072 in query-rows bucket 17
    store = FakeStore(summary("slow", [trial(0, 200.0, P(bm=64))], s=2048),
                      summary("fast", [trial(7, 180.0, P(bm=128))], s=1500),
                      summary("slower", [trial(0, 250.0, P(bm=16))], s=2000))
    result = export_header(store, ["slow", "fast", "slower"], tmp_path / "h.h")
    assert [(r.study, r.trial) for r in result.rows] == [("fast", 7)]
    assert result.rows[0].beat == (("slow", 200.0), ("slower", 250.0))
    text = (tmp_path / "h.h").read_text()
    assert "won its key over study slow (200.000 us), study slower (250.000 us)" in text
    assert "#define FLASHCORE_TUNED_COUNT 1" in text


def test_equal_speed_keeps_the_first_named(tmp_path: Path) -> None:
    store = FakeStore(summary("a", [trial(0, 100.0, P(bm=64))]), summary("b", [trial(0, 100.0, P(bm=128))]))
    assert export_header(store, ["b", "a"], tmp_path / "h.h").rows[0].study == "b"


# ------------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize("bad,why", [
    ({"BLOCK_M": 128.0}, "BLOCK_M=128.0 is not an integer"),
    ({"BLOCK_M": "128"}, "BLOCK_M='128' is not an integer"),
    ({"BLOCK_M": True}, "BLOCK_M=True is not an integer"),
    ({"BLOCK_M": math.nan}, "BLOCK_M=nan is not an integer"),
    ({"BLOCK_M": 2**31}, "BLOCK_M=2147483648 is out of range"),
    ({"BLOCK_M": -16}, "BLOCK_M=-16 is out of range"),
    ({"block-m": 1}, "parameter name 'block-m' cannot become a C++ field"),
    ({"MAX_SEQLEN": 1}, "parameter name 'MAX_SEQLEN' cannot become a C++ field"),
    ({"QUERY_ROWS_BUCKET": 1}, "parameter name 'QUERY_ROWS_BUCKET' cannot become a C++ field"),
])
def test_invalid_param_values_are_refused(tmp_path: Path, bad: dict[str, object], why: str) -> None:
    store = FakeStore(summary("s", [trial(0, 100.0, {**P(), **bad})]))
    out = tmp_path / "h.h"
    with pytest.raises(ExportError, match="study 's': trial 0: ") as exc:
        export_header(store, ["s"], out)
    assert why in str(exc.value)
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, 0.0, "12"])
def test_invalid_median_is_refused(tmp_path: Path, value: object) -> None:
    store = FakeStore(summary("s", [trial(0, 100.0, P()), trial(1, value, P(bm=64))]))  # type: ignore[arg-type]
    with pytest.raises(ExportError, match=r"study 's': trial 1: median µs .* is not a positive finite number"):
        export_header(store, ["s"], tmp_path / "h.h")


def test_invalid_tflops_is_refused(tmp_path: Path) -> None:
    store = FakeStore(summary("s", [trial(0, 100.0, P(), tflops=math.nan)]))
    with pytest.raises(ExportError, match="tflops=nan is not a finite number"):
        export_header(store, ["s"], tmp_path / "h.h")


def test_unknown_study(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="study 'nope' not found"):   # the store's own error
        export_header(three_studies(), ["d64_s2k", "nope"], tmp_path / "h.h")


def test_study_without_complete_trial_is_named(tmp_path: Path) -> None:
    store = FakeStore(summary("ok", [trial(0, 1.0, P())]),
                      summary("empty", [trial(0, None, P(), state="FAIL"), trial(1, None, P(bm=64), "PRUNED")]))
    with pytest.raises(ExportError, match=r"study 'empty': has no COMPLETE trial \(FAIL, PRUNED\)"):
        export_header(store, ["ok", "empty"], tmp_path / "h.h")


def test_output_directory_missing(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="output directory .*missing.* does not exist"):
        export_header(three_studies(), ["d64_s2k"], tmp_path / "missing" / "h.h")


def test_different_parameter_names_are_refused(tmp_path: Path) -> None:
    store = FakeStore(summary("a", [trial(0, 1.0, P())]),
                      summary("b", [trial(0, 1.0, {**P(), "SPLIT_K": 2})], s=512))
    with pytest.raises(ExportError, match="study 'b' has parameters .*SPLIT_K.* but study 'a' has"):
        export_header(store, ["a", "b"], tmp_path / "h.h")


def test_one_familys_knobs_with_defaults_fill_in_across_its_spaces(tmp_path: Path) -> None:
    """A hopper.toml study from before CTAS_PER_SM, one with it and a hopper_split.toml one
    (SPLITS, PACK_GQA) export together: each row takes the family's default for a knob its
    space lacks (what its build compiled), and every row has the same fields."""
    store = FakeStore(
        summary("old", [trial(0, 500.0, H())], family="hopper"),
        summary("two_ctas", [trial(0, 300.0, {**H(wgs=1, rp=24, rc=232), "CTAS_PER_SM": 2})], s=4096,
                family="hopper"),
        summary("split", [trial(0, 20.0, {**H(wgs=1, rp=24, rc=256), "SPLITS": 8, "PACK_GQA": 1,
                                           "CTAS_PER_SM": 1})], s=512, d=128, family="hopper"),
    )
    result = export_header(store, ["old", "two_ctas", "split"], tmp_path / "h.h")
    by_study = {r.study: dict(r.params) for r in result.rows}
    assert by_study["old"]["CTAS_PER_SM"] == 1 and by_study["old"]["SPLITS"] == 1 and by_study["old"]["PACK_GQA"] == 0
    assert by_study["two_ctas"]["CTAS_PER_SM"] == 2 and by_study["two_ctas"]["SPLITS"] == 1
    assert by_study["split"]["SPLITS"] == 8 and by_study["split"]["PACK_GQA"] == 1
    assert len({r.order for r in result.rows}) == 1
    text = (tmp_path / "h.h").read_text()
    assert text.count("CTAS_PER_SM") >= 3 and "SPLITS" in text
    # a knob without a default still splits the studies apart
    store = FakeStore(summary("a", [trial(0, 1.0, H())], family="hopper"),
                      summary("b", [trial(0, 1.0, {**H(), "FAKE": 1})], s=512, family="hopper"))
    with pytest.raises(ExportError, match="study 'b' has parameters .*FAKE.* but study 'a' has"):
        export_header(store, ["a", "b"], tmp_path / "h2.h")


def test_arch_filter(tmp_path: Path) -> None:
    result = export_header(three_studies(), ["d64_s2k"], tmp_path / "h.h", arch="sm_90a")
    assert len(result.rows) == 1 and result.skipped == ()
    with pytest.raises(ExportError, match="none of the studies targets arch sm_100a"):
        export_header(three_studies(), ["d64_s2k"], tmp_path / "h2.h", arch="sm_100a")


# ------------------------------------------------------------------------------------------ atomic write


def test_failed_write_leaves_the_old_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "flashcore_config.h"
    out.write_text("// the previous export\n")

    def boom(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("evotuner.atomicfile.os.replace", boom)
    with pytest.raises(ExportError, match="No space left"):   # one line naming the file, not a bare OSError
        export_header(three_studies(), ["d64_s2k"], out)
    assert out.read_text() == "// the previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flashcore_config.h"]   # no temp file left
    monkeypatch.undo()
    # a refused export also leaves it alone
    with pytest.raises(StorageError):
        export_header(three_studies(), ["d64_s2k", "nope"], out)
    assert out.read_text() == "// the previous export\n"
    export_header(three_studies(), ["d64_s2k"], out)
    assert "kConfigs" in out.read_text()


# ------------------------------------------------------------------------------------------ compiled for real

HOST_PROGRAM = r"""
#include "flashcore_config.h"
#include <cstdio>
using namespace flashcore::tuned;
// select() is constexpr: checked at compile time too. Rows 0 and 1 are of query-rows buckets
// 15 and 17 (B*H*Sq 4*16*512 and 4*16*2048): a call takes its own bucket, else the nearest.
constexpr long long R = 4 * 16 * 2048;
static_assert(select(64, 0, false, 100, 4 * 16 * 512) == &kConfigs[0], "bucket 512");
static_assert(select(64, 0, false, 513, R) == &kConfigs[1], "bucket 2048 (no 1024 row)");
static_assert(select(64, 0, false, 9000, R) == &kConfigs[1], "above every bucket: the largest");
static_assert(select(64, 0, false, 100, R) == &kConfigs[1], "the call's query-rows bucket before Sk");
static_assert(select(64, 0, false, 2048, 1) == &kConfigs[0], "one query row: bucket 15 is nearest");
static_assert(select(64, 0, false, 100, 1LL << 16) == &kConfigs[1], "bucket 16: 15 and 17 tie, the larger wins");
static_assert(select(128, 1, true, 100, 1) == &kConfigs[2], "only the open bucket");
static_assert(select(128, 1, false, 100, R) == nullptr, "causal must match");
static_assert(select(64, 1, false, 100, R) == nullptr, "dtype must match");
static_assert(select(96, 0, false, 100, R) == nullptr, "head_dim must match");
int check(int d, int dtype, bool causal, int s, int want) {
    const Config* c = select(d, dtype, causal, s, R);
    int got = index_of(c);
    if (got != want) { std::printf("select(%d,%d,%d,%d) = %d, want %d\n", d, dtype, causal, s, got, want); return 1; }
    return 0;
}
int main(int argc, char**) {
    int bad = 0;
    // argc keeps these runtime calls (not folded)
    bad += check(64, 0, false, 512 * argc, 1);   // R: bucket 17, row 1 alone
    if (index_of(select(64, 0, false, 512 * argc, 4 * 16 * 512 * argc)) != 0) bad += 1;
    bad += check(64, 0, false, 512 * argc + 1, 1);
    bad += check(64, 0, false, 2048 * argc, 1);
    bad += check(64, 0, false, 1 << 30, 1);
    bad += check(128, 1, true, 70000 * argc, 2);
    bad += check(128, 0, true, 1, -1);
    const Config* c = select(64, 0, false, 2000 * argc, R);
    if (c->block_m != 128 || c->block_n != 128 || c->num_warps != 4 || c->stages != 3 || c->min_blocks != 1) {
        std::printf("row 1 fields wrong\n");
        bad += 1;
    }
    if (kNumConfigs != 3 || FLASHCORE_TUNED_COUNT != 3) bad += 1;
    std::printf(bad ? "FAIL\n" : "OK\n");
    return bad;
}
"""


def _gxx() -> str:
    gxx = shutil.which("g++") or shutil.which("c++")
    assert gxx, "a host C++ compiler (g++) is needed for this test"
    return gxx


def test_header_compiles_on_the_host_and_select_works(tmp_path: Path) -> None:
    export_header(three_studies(), ["d64_s2k", "d64_s512", "d128_causal_bf16"], tmp_path / "flashcore_config.h")
    gxx = _gxx()
    # included twice: #pragma once holds
    (tmp_path / "twice.cpp").write_text('#include "flashcore_config.h"\n#include "flashcore_config.h"\n')
    syntax = subprocess.run([gxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only",
                             str(tmp_path / "twice.cpp")], capture_output=True, text=True, timeout=120)
    assert syntax.returncode == 0, syntax.stderr
    (tmp_path / "main.cpp").write_text(HOST_PROGRAM)
    build = subprocess.run([gxx, "-std=c++17", "-Wall", "-Werror", "-I", str(tmp_path), str(tmp_path / "main.cpp"),
                            "-o", str(tmp_path / "main")], capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    ran = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0 and ran.stdout.strip() == "OK", ran.stdout


def test_edited_header_is_caught_by_its_static_asserts(tmp_path: Path) -> None:
    out = tmp_path / "flashcore_config.h"
    export_header(three_studies(), ["d64_s2k"], out)
    text, n = re.subn(r"(#define FLASHCORE_TUNED_0_BLOCK_M +)128\n", r"\g<1>64\n", out.read_text())
    assert n == 1
    out.write_text(text)
    (tmp_path / "use.cpp").write_text('#include "flashcore_config.h"\n')
    r = subprocess.run([_gxx(), "-std=c++17", "-fsyntax-only", str(tmp_path / "use.cpp")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "row 0 macros disagree with kConfigs" in r.stderr


def _kernel(family: str) -> tuple[str, list[Path]]:
    """(family, include dirs) for the kernel the rows are compiled with."""
    if family == "toy":
        return "toy", [TOY_ROOT, REPO / "kernels"]
    return "flashcore", [REPO / "kernels"]


@pytest.mark.parametrize("family", ["toy", "flashcore"])
def test_nvcc_builds_every_row_of_the_header(tmp_path: Path, family: str) -> None:
    """The header drives the kernel build: each row's FLASHCORE_* come from FLASHCORE_TUNED_<i>_*,
    and the compiled cubin's flashcore_meta reports the row's values back."""
    store = FakeStore(
        summary("d64", [trial(0, 100.0, P(bm=128, bn=64, warps=4, stages=2, minb=1))], s=1024),
        summary("d128c", [trial(3, 200.0, P(bm=64, bn=32, warps=4, stages=2, minb=2))],
                s=4096, d=128, dtype="bf16", causal=True),
    )
    header = tmp_path / "flashcore_config.h"
    result = export_header(store, ["d64", "d128c"], header)
    info = read_header(header)
    family, includes = _kernel(family)
    nvcc = find_nvcc()

    def build(i: int) -> tuple[int, Path, str]:
        src = tmp_path / f"row{i}.cu"
        src.write_text(row_instantiation(header.name, i, info.rows[i], family,
                                         kernel_name=f"flashcore_fwd_{i}", meta_name=f"flashcore_meta_{i}"))
        cubin = tmp_path / f"row{i}.cubin"
        argv = [str(nvcc), *compile_flags(info.arch), "-I", str(tmp_path), *[f"-I{p}" for p in includes],
                str(src), "-o", str(cubin)]
        out = run(argv, cwd=tmp_path, timeout_s=NVCC_TIMEOUT_S)
        assert not out.timed_out and out.returncode == 0, out.output[-3000:]
        return i, cubin, out.output

    with ThreadPoolExecutor(max_workers=2) as pool:
        built = list(pool.map(build, range(len(result.rows))))
    for i, cubin, log in built:
        row = result.rows[i]
        params = dict(row.params)
        assert f"flashcore_fwd_{i}" in log   # ptxas -v names the renamed entry
        meta = read_meta(cubin, f"flashcore_meta_{i}", FC_FIELDS)
        assert meta["block_m"] == params["BLOCK_M"] and meta["block_n"] == params["BLOCK_N"]
        assert meta["threads"] == 32 * params["NUM_WARPS"] and meta["min_blocks"] == params["MIN_BLOCKS"]
        assert meta["head_dim"] == row.head_dim and meta["is_causal"] == int(row.causal)
        assert meta["dtype"] == {"fp16": 0, "bf16": 1}[row.dtype]


def test_nvcc_reports_a_bad_row_from_the_header(tmp_path: Path) -> None:
    """A value FlashCore's traits reject (STAGES=7) reaches the kernel through the header and fails there."""
    store = FakeStore(summary("odd", [trial(0, 100.0, P(stages=7))]))
    header = tmp_path / "flashcore_config.h"
    export_header(store, ["odd"], header)
    info = read_header(header)
    (tmp_path / "row0.cu").write_text(row_instantiation(header.name, 0, info.rows[0], "flashcore"))
    argv = [str(find_nvcc()), *compile_flags(info.arch), "-I", str(tmp_path), f"-I{REPO / 'kernels'}",
            str(tmp_path / "row0.cu"), "-o", str(tmp_path / "row0.cubin")]
    out = run(argv, cwd=tmp_path, timeout_s=NVCC_TIMEOUT_S)
    assert out.returncode != 0 and "STAGES must be in 1..4" in out.output


def test_read_header_refuses_a_foreign_file(tmp_path: Path) -> None:
    (tmp_path / "x.h").write_text("#pragma once\n")
    with pytest.raises(ExportError, match="no FLASHCORE_TUNED_COUNT"):
        read_header(tmp_path / "x.h")
    with pytest.raises(ExportError, match="cannot read it"):
        read_header(tmp_path / "missing.h")



# ------------------------------------------------------------------------------------------ production build


def _build_extension_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_extension", REPO / "scripts" / "build_extension.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_build_extension_refuses_bad_inputs(tmp_path: Path) -> None:
    bx = _build_extension_module()
    (tmp_path / "foreign.h").write_text("#pragma once\n")
    assert bx.main(["--header", str(tmp_path / "foreign.h"), "--output", str(tmp_path / "o")]) == 1
    header = tmp_path / "flashcore_config.h"
    export_header(three_studies(), ["d64_s2k"], header)
    with pytest.raises(EvotunerError, match="no nope/instantiate.cuh under"):
        bx.build(header, tmp_path / "o", family="nope")
    with pytest.raises(EvotunerError, match="no HOPPER_TUNED_COUNT"):   # a header without a hopper section
        bx.build(header, tmp_path / "o", family="hopper")
    (tmp_path / "file").write_text("")
    with pytest.raises(EvotunerError, match="exists and is not a folder"):
        bx.build(header, tmp_path / "file")


def test_build_extension_reports_the_row_nvcc_rejects(tmp_path: Path) -> None:
    bx = _build_extension_module()
    header = tmp_path / "flashcore_config.h"
    export_header(FakeStore(summary("ok", [trial(0, 1.0, P())]), summary("bad", [trial(0, 1.0, P(stages=7))], s=512)),
                  ["ok", "bad"], header)
    with pytest.raises(BuildError, match=r"nvcc failed on row_0\.cu: .*STAGES must be in 1\.\.4"):
        bx.build(header, tmp_path / "ext", jobs=2)


def _probe_on_cpu(ext: Path, module: str, body: str) -> None:
    """Import the built ``module`` from ``ext`` with this (CPU) torch, run ``body`` on it (as
    ``f``), then check attention() refuses CPU tensors with a message naming the module."""
    probe = (f"import sys, torch; sys.path.insert(0, sys.argv[1]); import {module} as f\n{body}"
             "q = torch.zeros(1, 1, 4, 64, dtype=torch.float16)\n"
             "try:\n"
             "    f.attention(q, q, q, False, None)\n"
             "except RuntimeError as e:\n"
             f"    assert '{module}.attention: q, k and v must be CUDA tensors' in str(e), e\n"
             "else:\n"
             "    raise AssertionError('CPU tensors accepted')\n"
             "print('OK')\n")
    ran = subprocess.run([sys.executable, "-c", probe, str(ext)], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and ran.stdout.strip() == "OK", ran.stderr[-3000:]


@pytest.mark.slow
def test_build_extension_builds_an_importable_module(tmp_path: Path) -> None:
    """The whole production build (row objects + torch binding, about a minute) with the toy
    kernel; the module imports with any torch and answers select()/configs() from the header.
    Running attention() needs a CUDA torch and a GPU (tests/gpu)."""
    bx = _build_extension_module()
    header = tmp_path / "flashcore_config.h"
    export_header(three_studies(), ["d64_s2k", "d64_s512", "d128_causal_bf16"], header)
    built = bx.build(header, tmp_path / "ext", family="toy", kernels_root=REPO / "kernels", includes=(TOY_ROOT,),
                     jobs=2)
    assert built.module == tmp_path / "ext" / "flashcore_ext.so" and built.rows == 3 and built.arch == "sm_90a"
    for i in range(3):
        assert f"flashcore_fwd_{i}" in (tmp_path / "ext" / "src" / f"row_{i}.cu").read_text()
    _probe_on_cpu(tmp_path / "ext", "flashcore_ext", (
        "assert f.arch == 'sm_90a', f.arch\n"
        "assert [c['max_seqlen'] for c in f.configs()] == [512, 2048, 2**31 - 1], f.configs()\n"
        "assert [c['query_rows_bucket'] for c in f.configs()] == [15, 17, 20], f.configs()\n"
        "assert [c['kernel'] for c in f.configs()] == ['flashcore_fwd_0', 'flashcore_fwd_1', 'flashcore_fwd_2']\n"
        "R = 4 * 16 * 2048\n"
        "assert (f.select(64, 'fp16', False, 100, 4 * 16 * 512), f.select(64, 'fp16', False, 600, R),\n"
        "        f.select(64, 'fp16', False, 10**6, R), f.select(64, 'fp16', False, 100, R),\n"
        "        f.select(128, 'bf16', True, 5, 1), f.select(128, 'fp16', True, 5, R)) == (0, 1, 1, 1, 2, -1)\n"
    ))


@pytest.mark.slow
def test_build_extension_builds_the_hopper_module(tmp_path: Path) -> None:
    """The hopper family's production build: real kernel rows (TMA launcher) + the torch binding;
    the module imports with the CPU torch wheel and answers select()/configs() from the header's
    hopper section (the FlashCore section of the same header is left to flashcore_ext)."""
    bx = _build_extension_module()
    header = tmp_path / "tuned.h"
    store = hopper_studies(split=True)
    store.summaries.update(three_studies().summaries)
    export_header(store, [*HOPPER_SPLIT_STUDIES, "d64_s2k"], header)
    built = bx.build(header, tmp_path / "ext", family="hopper", jobs=2)
    assert built.module == tmp_path / "ext" / "hopper_ext.so" and built.rows == 5
    rows_h = (tmp_path / "ext" / "src" / "hopper_rows.h").read_text()
    assert "hopper_ext_launch_4" in rows_h and "hopper_meta_4" in rows_h and "cuda.h" not in rows_h
    assert "#define HOPPER_SPLITS HOPPER_TUNED_4_SPLITS" in (tmp_path / "ext" / "src" / "row_4.cu").read_text()
    assert re.search(r"#define HOPPER_TUNED_4_SPLITS +8\b", header.read_text())   # the split row
    _probe_on_cpu(tmp_path / "ext", "hopper_ext", (
        "rows = f.configs()\n"
        "assert [(c['head_dim'], c['dtype'], c['causal'], c['query_rows_bucket'], c['max_seqlen']) for c in rows] == [\n"
        "    (64, 'fp16', False, 17, 2048), (64, 'fp16', True, 18, 4096), (128, 'fp16', True, 18, 4096),\n"
        "    (128, 'bf16', False, 17, 2048), (128, 'bf16', False, 5, 8192)], rows\n"
        "R = 4 * 16 * 2048\n"   # the prefill rows' query rows; the split row's study is a decode of 32 rows
        "assert (f.select(64, 'fp16', True, 100, 1000), f.select(128, 'bf16', False, 2048, R),\n"
        "        f.select(128, 'bf16', False, 2049, R), f.select(128, 'bf16', False, 2049, 32),\n"
        "        f.select(128, 'bf16', False, 10**5, 1), f.select(96, 'fp16', False, 5, 1),\n"
        "        f.select(64, 'bf16', False, 5, 1)) == (1, 3, 3, 4, 4, -1, -1)\n"
        "try:\n"
        "    f.select(128, 'bf16', False, 2048)\n"
        "except TypeError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('select without query_rows accepted')\n"
        "assert callable(f.plan) and 'launches' in f.plan.__doc__\n"
    ))


# ------------------------------------------------------------------------------------------ a real study database


def _sqlite_studies(tmp_path: Path, bad_config: dict[str, object] | None = None):
    import optuna
    from optuna.distributions import CategoricalDistribution

    from evotuner.space import load_space
    from evotuner.storage import StudyStore

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = load_space(None)
    dists = {p.name: CategoricalDistribution(list(p.values)) for p in space.params}
    store = StudyStore(f"sqlite:///{tmp_path / 'studies.db'}")

    def add(study: optuna.Study, value: float | None, config: dict[str, object], state: str = "COMPLETE") -> None:
        attrs: dict[str, object] = {"config": config}
        if state == "COMPLETE":
            attrs["tflops"] = 250.0
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState[state], value=value, user_attrs=attrs,
            params={k: v for k, v in config.items() if k in dists and v in dists[k].choices},
            distributions={k: d for k, d in dists.items() if config.get(k) in d.choices}))

    a = store.create_study("h100_d64", Problem(Shape(8, 16, 4096, 4096, 64)), space, "tpe", 0,
                           source_hash="5ca1ab1e", nvcc_version=NVCC_VERSION)
    add(a, 90.0, P(bm=128, bn=64, warps=4, stages=2, minb=1))
    add(a, 80.0, P(bm=128, bn=128, warps=8, stages=3, minb=1))
    add(a, None, P(bm=64, bn=32, warps=4, stages=1, minb=2), state="FAIL")
    add(a, 70.0, bad_config or P(bm=256, bn=64, warps=8, stages=2, minb=1),
        state="COMPLETE" if bad_config else "PRUNED")
    store.record_device("h100_d64", {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132})
    b = store.create_study("h100_d128_causal", Problem(Shape(2, 8, 1000, 1000, 128), "bf16", True), space, "tpe", 0,
                           source_hash="5ca1ab1e", nvcc_version=NVCC_VERSION)
    add(b, 55.5, P(bm=64, bn=64, warps=4, stages=2, minb=2))
    store.create_study("empty", Problem(Shape(1, 1, 128, 128, 64)), space, "tpe", 0,
                       source_hash="5ca1ab1e", nvcc_version=NVCC_VERSION)
    return store


def test_export_from_a_real_sqlite_study(tmp_path: Path) -> None:
    store = _sqlite_studies(tmp_path)
    try:
        out = tmp_path / "flashcore_config.h"
        result = export_header(store, ["h100_d64", "h100_d128_causal"], out)
    finally:
        store.close()
    assert [(r.study, r.trial, r.max_seqlen, r.arch) for r in result.rows] == [
        ("h100_d64", 1, 4096, "sm_90a"), ("h100_d128_causal", 0, 1024, "sm_90a")]
    text = out.read_text()
    assert "    {64, 0, false, 19, 4096, 128, 128, 8, 3, 1}," in text     # B*H*Sq 8*16*4096: bucket 19
    assert "    {128, 1, true, 14, 1024, 64, 64, 4, 2, 2}," in text      # 2*8*1000: bucket 14
    assert "// [0] study h100_d64, trial 1: 80.000 us, 250.00 TFLOPS (B*H*Sq 524288, seqlen_k 4096)" in text
    assert "nvcc 13.0, V13.0.88; source 5ca1ab1e; device NVIDIA H100 80GB HBM3" in text
    assert "source 5ca1ab1e; device unknown" in text      # the d128 study never recorded a device


def test_real_study_errors(tmp_path: Path) -> None:
    store = _sqlite_studies(tmp_path, bad_config={**P(), "BLOCK_M": 128.5})
    try:
        with pytest.raises(ExportError, match=r"study 'h100_d64': trial 3: BLOCK_M=128.5 is not an integer"):
            export_header(store, ["h100_d64"], tmp_path / "a.h")
        with pytest.raises(ExportError, match=r"study 'empty': has no COMPLETE trial \(no trials\)"):
            export_header(store, ["h100_d128_causal", "empty"], tmp_path / "b.h")
        with pytest.raises(EvotunerError, match="nope"):
            export_header(store, ["nope"], tmp_path / "c.h")
    finally:
        store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["studies.db"]


#: The start of the GPU probes of a built extension (MODULE: its name): on_side_stream calls
#: attention() on a side stream that waits for the inputs; check_cases runs every (B, H, Sq, Sk, D,
#: dtype, causal, row) that way against fp32 SDPA; replays_checked captures one call in a CUDA
#: graph and replays it on fresh inputs, checking each output; check_unserved expects the error
#: for a head dim no row serves.
_GPU_PROBE = r"""
import sys, torch
sys.path.insert(0, sys.argv[1]); import MODULE as f
F = torch.nn.functional
torch.manual_seed(0)

def on_side_stream(q, k, v, causal, scale):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())   # the inputs are written on the default stream
    with torch.cuda.stream(side):
        o = f.attention(q, k, v, causal, scale)
    side.synchronize()
    return o

def replays_checked(q, k, v, check):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = f.attention(q, k, v, False, 0.1)
    for _ in range(3):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        check(o)

def check_cases(cases):
    for B, H, Sq, Sk, D, dt, causal, row in cases:
        assert f.select(D, "bf16" if dt == torch.bfloat16 else "fp16", causal, Sk, B * H * Sq) == row
        q = torch.randn(B, H, Sq, D, device="cuda", dtype=dt)
        k, v = (torch.randn(B, H, Sk, D, device="cuda", dtype=dt) for _ in range(2))
        o = on_side_stream(q, k, v, causal, 0.1)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal, scale=0.1)
        err = (o.float() - ref).abs().max().item()
        assert err < (2e-2 if dt == torch.bfloat16 else 2e-3), (B, H, Sq, Sk, D, causal, err)

def check_unserved():
    q = torch.randn(1, 1, 4, 96, device="cuda", dtype=torch.float16)
    try:
        f.attention(q, q, q, False, None)
    except RuntimeError as e:
        assert "no tuned config for head_dim=96 fp16 non-causal" in str(e), e
    else:
        raise AssertionError("head_dim 96 accepted")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_production_extension_on_the_gpu(tmp_path: Path) -> None:
    """Export -> build with the real FlashCore kernel -> attention() matches fp32 SDPA for every
    row, on the caller's stream; a shape no row serves is a clear error."""
    bx = _build_extension_module()
    header = tmp_path / "flashcore_config.h"
    export_header(three_studies(), ["d64_s2k", "d64_s512", "d128_causal_bf16"], header)
    built = bx.build(header, tmp_path / "ext")
    probe = _GPU_PROBE.replace("MODULE", "flashcore_ext") + r"""
check_cases([(2, 4, 500, 500, 64, torch.float16, False, 0), (8, 16, 1000, 1000, 64, torch.float16, False, 1),
             (2, 4, 1000, 1000, 64, torch.float16, False, 0),   # 8000 query rows: row 0's bucket (15) is nearer
             (2, 3, 9000, 9000, 64, torch.float16, False, 1), (1, 2, 300, 300, 128, torch.bfloat16, True, 2),
             (1, 2, 3000, 3000, 128, torch.bfloat16, True, 2)])
check_unserved()
print("OK")
"""
    ran = subprocess.run([sys.executable, "-c", probe, str(built.module.parent)], capture_output=True, text=True,
                         timeout=600)
    assert ran.returncode == 0 and ran.stdout.strip() == "OK", (ran.stdout + ran.stderr)[-3000:]


@pytest.mark.gpu
@pytest.mark.slow
def test_hopper_production_extension_on_the_gpu(tmp_path: Path) -> None:
    """Export -> build hopper_ext -> attention() matches fp32 SDPA for every row (each
    scheduler), ragged and Sq != Sk shapes, a [B,S,H,D] tensor seen as [B,H,S,D], grouped
    heads through a PACK_GQA=1 row (packed where the layout allows: [B,H,S,D], one query row;
    unpacked: [B,S,H,D]), on the caller's stream; a split-KV row (decode and short prompts,
    grouped heads packed and not, called again on the same scratch sizes, captured in a CUDA
    graph and replayed on new inputs); each call's row by its query rows B*H*Sq, then its
    seqlen_k (a call of few query rows takes the decode study's split row); a stride TMA cannot
    take and a shape no row serves are clear errors."""
    bx = _build_extension_module()
    header = tmp_path / "tuned.h"
    export_header(hopper_studies(pack=True, split=True), HOPPER_SPLIT_STUDIES, header)
    built = bx.build(header, tmp_path / "ext", family="hopper")
    probe = _GPU_PROBE.replace("MODULE", "hopper_ext") + r"""
check_cases([(2, 4, 500, 500, 64, torch.float16, False, 0), (3, 5, 2047, 2047, 64, torch.float16, False, 0),
             (1, 3, 97, 513, 64, torch.float16, False, 0), (2, 4, 1000, 1000, 64, torch.float16, True, 1),
             (1, 3, 513, 97, 64, torch.float16, True, 1), (2, 2, 3000, 3000, 128, torch.float16, True, 2),
             (2, 4, 1000, 1000, 128, torch.bfloat16, False, 3), (8, 16, 17, 300, 128, torch.bfloat16, False, 3),
             (1, 3, 17, 300, 128, torch.bfloat16, False, 4)])   # 51 query rows: the decode row's bucket is nearer
x = torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.float16).transpose(1, 2)   # [B,S,H,D] storage
o = f.attention(x, x, x, False, None)
ref = F.scaled_dot_product_attention(x.float(), x.float(), x.float())
assert (o.float() - ref).abs().max().item() < 2e-3

def grouped(B, H, HKV, Sq, Sk, bshd):
    # fresh bf16 q, k, v at D=128 ([B,S,H,D] storage seen as [B,H,S,D] when bshd), run non-causal
    # with scale 0.1 and checked against fp32 SDPA; returns them
    shapes = ((B, Sq, H, 128), (B, Sk, HKV, 128), (B, Sk, HKV, 128)) if bshd else \
        ((B, H, Sq, 128), (B, HKV, Sk, 128), (B, HKV, Sk, 128))
    q, k, v = (torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in shapes)
    if bshd:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    o = f.attention(q, k, v, False, 0.1)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.1, enable_gqa=True)
    err = (o.float() - ref).abs().max().item()
    assert err < 2e-2, (B, H, HKV, Sq, Sk, bshd, err)
    return q, k, v

for B, H, HKV, Sq, Sk, bshd in ((2, 8, 2, 1000, 1000, False), (1, 12, 4, 300, 777, False), (64, 64, 1, 1, 300, False),
                                (2, 8, 2, 500, 500, True)):
    assert f.select(128, "bf16", False, Sk, B * H * Sq) == 3
    q, k, v = grouped(B, H, HKV, Sq, Sk, bshd)
    p = f.plan(q, k, v, False, 0.1)   # packed where the layout allows it: [B,H,S,D], or one query row
    packed = HKV < H and (not bshd or Sq == 1)
    assert p["row"] == 3 and p["launches"] and p["packed"] == packed and p["splits"] == 1, (B, H, HKV, Sq, bshd, p)
    assert (p["heads"], p["seqlen_q"]) == ((HKV, H // HKV * Sq) if packed else (H, Sq)), p
# the split-KV row: each call's partials combined by the tile's last CTA, its counters back at 0
for B, H, HKV, Sq, Sk, bshd in ((1, 8, 2, 1, 8000, False), (2, 4, 4, 37, 2100, False), (1, 8, 1, 3, 5000, False),
                                (2, 8, 2, 5, 7000, True), (1, 2, 2, 300, 4100, False), (3, 4, 2, 1, 2049, False)):
    assert f.select(128, "bf16", False, Sk, B * H * Sq) == 4
    for _ in range(2):   # fresh inputs, the same scratch sizes
        q, k, v = grouped(B, H, HKV, Sq, Sk, bshd)
    p = f.plan(q, k, v, False, 0.1)
    assert p["row"] == 4 and p["splits"] == 8 and p["scratch_bytes"] > 0 and p["grid"][0] % 8 == 0, p
    assert p["packed"] == (HKV < H and (not bshd or Sq == 1)), (B, H, HKV, Sq, bshd, p)
q, k, v = (torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in ((2, 8, 1, 128), (2, 2, 6000, 128),
                                                                             (2, 2, 6000, 128)))
def split_in_a_graph(o):
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.1, enable_gqa=True)
    err = (o.float() - ref).abs().max().item()
    assert err < 2e-2, ("split in a graph", err)
replays_checked(q, k, v, split_in_a_graph)
x = torch.randn(1, 3, 513, 64, device="cuda", dtype=torch.float16)   # row 1: SCHED 2, a 4-byte tile counter per call
p = f.plan(x, x, x, True, None)
assert (p["row"], p["sched"], p["splits"], p["scratch_bytes"]) == (1, 2, 1, 4), p
empty = torch.randn(0, 4, 8, 64, device="cuda", dtype=torch.float16)
assert f.plan(empty, empty, empty, False, None) == {"row": 0, "kernel": "hopper_fwd_0", "launches": False}
bad = torch.randn(1, 2, 64, 68, device="cuda", dtype=torch.float16)[..., :64]        # row stride 68
try:
    f.attention(bad, bad, bad, False, None)
except RuntimeError as e:
    assert "q's row (S) stride breaks a TMA rule" in str(e) and "multiple of 8" in str(e), e
else:
    raise AssertionError("row stride 68 accepted")
try:
    f.plan(bad, bad, bad, False, None)   # plan checks as attention does
except RuntimeError as e:
    assert "hopper_ext.plan" in str(e) and "q's row (S) stride breaks a TMA rule" in str(e), e
else:
    raise AssertionError("plan: row stride 68 accepted")
check_unserved()
print("OK")
"""
    ran = subprocess.run([sys.executable, "-c", probe, str(built.module.parent)], capture_output=True, text=True,
                         timeout=600)
    assert ran.returncode == 0 and ran.stdout.strip() == "OK", (ran.stdout + ran.stderr)[-3000:]
