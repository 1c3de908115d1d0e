"""Helper scripts fail cleanly: one-line usage errors (exit 2) and runtime errors (exit 1), no
traceback, nothing written where not asked, never through a link, never truncating data."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SWEEP = REPO / "tests" / "data" / "sweep_h100_hopper_d64.csv"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"safety_{name}", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _usage(capsys, fn, argv, says: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        fn(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def _fails(capsys, fn, argv, says: str) -> None:
    assert fn(argv) == 1
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err


@pytest.fixture()
def no_gpu(monkeypatch):
    import evotuner.measure

    monkeypatch.setattr(evotuner.measure, "gpu_available", lambda *a, **k: False)


# ------------------------------------------------------------------------------ make_tuned_table.py

def test_make_tuned_table_refuses_bad_outputs_and_names_storage(tmp_path, capsys, monkeypatch):
    mt = _script("make_tuned_table")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "target.toml").write_text("precious\n")
    os.symlink(tmp_path / "target.toml", tmp_path / "link.toml")
    (tmp_path / "adir").mkdir()
    common = ["--storage", str(tmp_path / "missing.db"), "--family", "flashcore", "--device", "X"]
    for out, says in (("link.toml", "symbolic link"), ("-", "standard output"), ("adir", "not a regular file"),
                      ("nofolder/t.toml", "does not exist"), ("", "the path is empty")):
        _usage(capsys, mt.main, [*common, "--output", out], says)
    assert (tmp_path / "target.toml").read_text() == "precious\n" and not (tmp_path / "-").exists()
    (tmp_path / "notes.toml").write_text("my notes\n")
    _fails(capsys, mt.main, [*common, "--output", "notes.toml"], "not a tuned table this script wrote")
    assert (tmp_path / "notes.toml").read_text() == "my notes\n"
    out = ["--output", str(tmp_path / "t.toml")]
    _fails(capsys, mt.main, [*common, *out], "point --storage at")
    (tmp_path / "empty.db").write_bytes(b"")
    common[1] = str(tmp_path / "empty.db")
    _fails(capsys, mt.main, [*common, *out], "point --storage at")
    import sqlite3

    con = sqlite3.connect(tmp_path / "other.db")
    con.execute("CREATE TABLE foo (x)")
    con.commit()
    con.close()
    common[1] = str(tmp_path / "other.db")
    _fails(capsys, mt.main, [*common, *out], "--storage")
    (tmp_path / "notes.db").write_text("not a database\n")           # refused by the database layer
    for storage in (tmp_path / "notes.db", tmp_path / "adir"):
        common[1] = str(storage)
        _fails(capsys, mt.main, [*common, *out], "point --storage at")
    assert (tmp_path / "notes.db").read_text() == "not a database\n"
    assert not (tmp_path / "t.toml").exists()


# ------------------------------------------------------------------------------ build_extension.py

def test_build_extension_refuses_an_empty_or_linked_output(tmp_path, capsys, monkeypatch):
    bx = _script("build_extension")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "h.h").write_text("#pragma once\n")
    os.symlink(tmp_path / "target", tmp_path / "dangling")
    _usage(capsys, bx.main, ["--header", "h.h", "--output", ""], "the path is empty")
    _usage(capsys, bx.main, ["--header", "h.h", "--output", "dangling"], "symbolic link")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "h.h"]


def _header(tmp_path: Path, arch: str) -> Path:
    from tests.test_export import P, FakeStore, summary, trial
    from evotuner.export import export_header

    header = tmp_path / "flashcore_config.h"
    export_header(FakeStore(summary("ok", [trial(0, 1.0, P())])), ["ok"], header)
    header.write_text(header.read_text().replace('"sm_90a"', f'"{arch}"'))
    return header


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_build_extension_names_an_unsupported_arch_and_leaves_nothing(tmp_path):
    from evotuner.errors import BuildError

    bx = _script("build_extension")
    header = _header(tmp_path, "sm_999")
    with pytest.raises(BuildError, match=r"arch sm_999.*e\.g\. sm_90a"):
        bx.build(header, tmp_path / "ext")
    assert not (tmp_path / "ext").exists()
    # the row compile says the same when the arch check is bypassed, and removes only what it made
    bx.check_arch = lambda nvcc, arch: None
    (tmp_path / "pre").mkdir()
    (tmp_path / "pre" / "keep").write_text("mine")
    with pytest.raises(BuildError, match=r"not one this nvcc supports"):
        bx.build(header, tmp_path / "pre", jobs=1)
    assert [p.name for p in (tmp_path / "pre").iterdir()] == ["keep"]
    with pytest.raises(BuildError):
        bx.build(header, tmp_path / "fresh" / "ext", jobs=1)
    assert not (tmp_path / "fresh" / "ext").exists()


# ------------------------------------------------------------------------------ sweep.py

def test_sweep_usage_errors_name_the_flag_given(tmp_path, capsys, monkeypatch):
    sw = _script("sweep")
    monkeypatch.chdir(tmp_path)
    for shape, says in (("1,2,3", "cannot read"), ("B=4,H=16,S=128,D=100", "D=100"),
                        ("B=0,H=16,S=128,D=64", "B must be"), ("B=1,H=16,HKV=3,S=128,D=64", "HKV=3")):
        with pytest.raises(SystemExit) as exit_:
            sw.main(["--shape", shape, "--output", "x.csv"])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"--shape {shape!r}" in err and "--sweep" not in err, err
        assert len(err.strip().splitlines()) == 1
    _usage(capsys, sw.main, ["--sweep", "B=0,H=16,S=128,D=64:fp16:y.csv"], "argument --sweep")
    job = sw.SweepJob(sw._problem("B=1,H=1,S=128,D=64", "fp16", False, "--shape"),
                      sw._job_output("a:b.csv", "--output"))       # ':' is fine in --output
    assert job.output == Path("a:b.csv")


def test_sweep_refuses_an_output_it_would_truncate(tmp_path, capsys, monkeypatch):
    sw = _script("sweep")
    import evotuner.compiler

    def no_builder(*a, **k):
        raise AssertionError("the refusal must come before any build or GPU")

    monkeypatch.setattr(evotuner.compiler, "Builder", no_builder)
    data = REPO / "tests" / "data" / "sweep_h100_d64.csv"
    copy = tmp_path / "sweep.csv"
    shutil.copy(data, copy)
    shutil.copy(str(data) + ".json", str(copy) + ".json")
    before = copy.read_bytes()
    _fails(capsys, sw.main, ["--shape", "B=8,H=16,S=2048,D=64", "--output", str(copy)], "another problem")
    (tmp_path / "plain.csv").write_text("a,b\n1,2\n")
    _fails(capsys, sw.main, ["--shape", "B=8,H=16,S=2048,D=64", "--output", str(tmp_path / "plain.csv")],
           "no sidecar")
    assert copy.read_bytes() == before and (tmp_path / "plain.csv").read_text() == "a,b\n1,2\n"


# ------------------------------------------------------------------------------ kernel_smoke.py

def test_kernel_smoke_needs_out_a_gpu_and_a_matching_match(tmp_path, capsys, monkeypatch, no_gpu):
    ks = _script("kernel_smoke")
    monkeypatch.chdir(tmp_path)
    _usage(capsys, ks.main, [], "--out")
    _usage(capsys, ks.main, ["--out", "o", "--jobs", "0"], "--jobs")
    _usage(capsys, ks.main, ["--out", ""], "the path is empty")
    _fails(capsys, ks.main, ["--out", "o"], "--build-only")
    _fails(capsys, ks.main, ["--out", "o", "--build-only", "--match", "zzz"], "--match")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ bench_gpus.py / two_workers.py

def test_bench_gpus_refuses_up_front(tmp_path, capsys, monkeypatch, no_gpu):
    bg = _script("bench_gpus")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **k: pytest.fail("made a work folder"))
    (tmp_path / "adir").mkdir()
    (tmp_path / "notdb.txt").write_text("x")
    for argv, says in ((["--output", "adir"], "not a regular file"), (["--output", "no/x.json"], "does not exist"),
                       (["--output", ""], "the path is empty"), (["--workdir", "notdb.txt"], "not a folder"),
                       (["--extra", "'unbalanced"], "--extra"), (["--run-timeout", "-5"], "--run-timeout")):
        _usage(capsys, bg.main, argv, says)
    _fails(capsys, bg.main, [], "--replay")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "notdb.txt"]


def test_two_workers_refuses_up_front(tmp_path, capsys, monkeypatch, no_gpu):
    tw = _script("two_workers")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **k: pytest.fail("made a work folder"))
    (tmp_path / "notdb.txt").write_text("x")
    _usage(capsys, tw.main, ["--workdir", "notdb.txt"], "not a folder")
    _fails(capsys, tw.main, [], "--replay")
    assert [p.name for p in tmp_path.iterdir()] == ["notdb.txt"]
