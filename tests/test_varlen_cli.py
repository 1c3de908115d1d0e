"""The command line with a packed variable-length problem (--lengths), without a GPU: a
search (the hopper family, its guided sampler on the cost model, real nvcc builds of the
packed kernel, the scaffold measure stage), the study storing the lengths, resume, show,
report, bench, compile --varlen, and every bad option ending in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evotuner.problem import Problem
from cli_helpers import assert_one_line_error, run, scaffold_env
from scaffold import PACKED_BASELINES

SHAPE = "H=4,HKV=2,D=64"
LENGTHS = "5,300,0,77,129"
LENGTHS_K = "9,300,12,0,64"
HOPPER = ("BLOCK_N=128,CONSUMER_WGS=3,STAGES=2,REG_PROD=32,REG_CONS=160,OVERLAP=1,PINGPONG=1,SCHED=2,"
          "RESCALE_LOG2=8,EXP_EMU=0")


@pytest.fixture(autouse=True)
def env(monkeypatch, build_cache_dir, tmp_path):
    scaffold_env(monkeypatch, build_cache_dir, tmp_path)


def _search(capsys, db: Path, *extra, study="v", trials=3, shape=SHAPE, lengths=LENGTHS):
    return run(capsys, "search", "--study", study, "--shape", shape, "--lengths", lengths, "--trials", trials,
               "--jobs", 2, "--storage", f"sqlite:///{db}", *extra)


def test_search_resume_show_report_bench_of_a_packed_study(capsys, tmp_path):
    db = tmp_path / "studies.db"
    code, out, err = _search(capsys, db, "--lengths-k", LENGTHS_K, "--causal")
    assert code == 0, err
    flat = " ".join(out.split())
    assert "study 'v' has 3 finished trials" in out
    assert "flash_attention_varlen" in flat and "hopper family" in flat        # the family with a packed kernel
    assert "sdpa_padded 900.0 µs" in flat and "sdpa_jagged 700.0 µs" in flat

    code, out, err = run(capsys, "show", "--study", "v", "--json", "--storage", f"sqlite:///{db}")
    assert code == 0, err
    data = json.loads(out)
    stored = Problem.from_dict(data["problem"])
    assert stored.varlen and stored.causal and stored.lengths_q == (5, 300, 0, 77, 129)
    assert stored.lengths_k == (9, 300, 12, 0, 64) and stored.shape.heads_kv == 2
    assert data["sampler"] == "guided"                  # the hopper family's, on its cost model
    assert set(data["baselines"]) == set(PACKED_BASELINES)
    # a packed study searches hopper.toml: no split-KV or query-head packing knob
    assert data["space"]["name"] == "hopper" and data["trials"]
    # no split-KV in hopper.toml; its PACK_GQA knob is refused for packed batches (constraint pack_gqa)
    assert all("SPLITS" not in t["params"] and t["params"].get("PACK_GQA", 0) == 0 for t in data["trials"])

    code, out, err = run(capsys, "show", "--study", "v", "--storage", f"sqlite:///{db}")
    assert code == 0, err
    flat = " ".join(out.split())
    assert "H=4,HKV=2,D=64 fp16 causal packed, 5 sequences, q 0..300 (total 511), k 0..300 (total 385)" in flat
    assert "lengths 5, 300, 0, 77, 129" in flat and "key lengths 9, 300, 12, 0, 64" in flat

    code, out, err = run(capsys, "resume", "--study", "v", "--trials", 4, "--storage", f"sqlite:///{db}")
    assert code == 0, err
    assert "study 'v' has 4 finished trials" in out

    code, out, err = run(capsys, "report", "--study", "v", "--output", tmp_path / "rep",
                         "--storage", f"sqlite:///{db}")
    assert code == 0, err
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert "history.png" in report["files"] and (tmp_path / "rep" / "history.png").is_file()

    code, out, err = run(capsys, "bench", "--study", "v", "--top", 2, "--json", "--storage", f"sqlite:///{db}")
    assert code == 0, err
    bench = json.loads(out)
    assert set(bench["baselines"]) == set(PACKED_BASELINES) and len(bench["rows"]) == 2

    # the same study asked for other lengths is refused, naming both problems
    code, out, err = _search(capsys, db, "--lengths-k", LENGTHS_K, "--causal", lengths="5,300,0,77,130",
                             trials=5)
    assert_one_line_error(code, out, err, "study 'v' was created for", "5 sequences")


def test_a_seeded_draw_is_stored_and_not_drawn_again(capsys, tmp_path):
    db = tmp_path / "studies.db"
    code, out, err = _search(capsys, db, "--sampler", "random", lengths="random:6:64..700:seed=3", trials=2)
    assert code == 0, err
    code, out, err = run(capsys, "show", "--study", "v", "--json", "--storage", f"sqlite:///{db}")
    drawn = json.loads(out)["problem"]["lengths_q"]
    assert len(drawn) == 6 and all(64 <= n <= 700 for n in drawn)
    # the same draw again is the same problem: the study continues
    code, out, err = _search(capsys, db, "--sampler", "random", lengths="random:6:64..700:seed=3", trials=3)
    assert code == 0, err
    assert "has 3 finished trials" in out
    # a recorded batch of those lengths is that problem too
    batch = tmp_path / "batch.txt"
    batch.write_text("\n".join(map(str, drawn)) + "\n")
    code, out, err = _search(capsys, db, "--sampler", "random", lengths=f"@{batch}", trials=3)
    assert code == 0, err
    assert "already has 3 finished trials" in out


@pytest.mark.parametrize("argv, fragments", [
    (["--shape", "B=3,H=4,D=64", "--lengths", "5,300"], ["--shape: B=3 contradicts the lengths", "drop B and S"]),
    (["--shape", "H=4,D=64", "--lengths", "5,x"], ["--lengths", "'x' is not a sequence length"]),
    (["--shape", "H=4,D=64", "--lengths", "0,0"], ["every sequence is empty"]),
    (["--shape", "H=4,D=64", "--lengths", "random:4:900..100"], ["LO=900 is above HI=100"]),
    (["--shape", "H=4,D=64", "--lengths", "5,6", "--lengths-k", "1"], ["1 key lengths for 2 sequences"]),
    (["--shape", "B=1,H=4,S=64,D=64", "--lengths-k", "5"], ["--lengths-k: key lengths without --lengths"]),
    (["--shape", "D=64", "--lengths", "5"], ["missing dimension H"]),
    (["--shape", "H=4,D=96", "--lengths", "5", "--family", "flashcore"], ["packed variable-length"]),
])
def test_bad_packed_options_end_in_one_line_and_write_nothing(capsys, tmp_path, argv, fragments):
    db = tmp_path / "studies.db"
    code, out, err = run(capsys, "search", "--study", "v", *argv, "--storage", f"sqlite:///{db}")
    assert_one_line_error(code, out, err, *fragments)
    assert not db.exists()


def test_search_help_documents_the_lengths(capsys):
    code, out, err = run(capsys, "search", "--help")
    flat = " ".join(out.split())
    assert code == 0
    assert "--lengths" in flat and "random:N:LO..HI" in flat and "@FILE" in flat and "--lengths-k" in flat


def test_compile_builds_the_packed_kernel(capsys):
    code, out, err = run(capsys, "compile", "--config", HOPPER, "--shape", "D=64", "--varlen", "--causal", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["passed"]
    code, out, err = run(capsys, "compile", "--config", HOPPER, "--shape", "D=64", "--varlen")
    assert code == 0, err
    assert "packed variable-length" in " ".join(out.split())
    split = HOPPER.replace("SCHED=2", "SCHED=0") + ",SPLITS=4,PACK_GQA=0"
    code, out, err = run(capsys, "compile", "--config", split, "--shape", "D=64", "--varlen")
    assert_one_line_error(code, out, err, "split_varlen", "not built for packed variable-length batches")
    code, out, err = run(capsys, "compile", "--config", "BLOCK_M=64,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1",
                         "--shape", "D=64", "--varlen")
    assert_one_line_error(code, out, err, "no kernel for packed variable-length batches")
