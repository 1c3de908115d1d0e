"""The benchmark helper scripts fail cleanly, on CPU: usage errors are one line (exit 2) at
parse time, before any GPU work; runtime errors one line (exit 1); nothing created first."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
D64 = REPO / "tests" / "data" / "sweep_h100_d64.csv"


def _script(name: str):
    sys.path.insert(0, str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}_under_test", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def no_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _usage(capsys, fn, argv, says: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        fn(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and "--help" in err and "Traceback" not in err


def _fails(capsys, fn, argv, says: str) -> None:
    assert fn(argv) == 1
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    return err


@pytest.mark.parametrize("name", ["bench_attention", "bench_runtime", "bench_extension"])
def test_a_bad_output_stem_is_refused_at_parse_time(name, tmp_path, capsys, monkeypatch, no_gpu):
    module = _script(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    (tmp_path / "taken.json").mkdir()           # the derived STEM.json is a folder
    extra = ["--module", "adir"] if name == "bench_extension" else []
    for bad, says in (("", "the path is empty"), (".", "not a regular file"), ("/", "not a regular file"),
                      ("newdir/sub/out", "does not exist"), ("taken", "taken.json")):
        _usage(capsys, module.main, extra + ["--output", bad], says)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "taken.json"]     # nothing created
    _fails(capsys, module.main, extra + ["--output", "ok"], "needs a CUDA GPU")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "taken.json"]


@pytest.mark.parametrize("name,shape,says", [
    ("bench_attention", "1,2,3,4,maybe", "CAUSAL 'maybe'"), ("bench_attention", "1,0,3,4,1", "at least 1"),
    ("bench_attention", "1,8,64,64,1,3", "multiple of HKV"), ("bench_attention", "a,b,c,d,e", "integers"),
    ("bench_runtime", "1,2,3", "is not B,H,S,D"), ("bench_runtime", "1,-8,64,64,0", "at least 1"),
    ("bench_runtime", "1,8,64,64,0,3", "multiple of HKV"), ("bench_runtime", "1,8,64,64,2", "CAUSAL"),
])
def test_a_bad_shape_is_one_plain_line(name, shape, says, capsys, no_gpu):
    module = _script(name)
    with pytest.raises(SystemExit) as exit_:
        module.main(["--shapes", shape])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert "parse_shape" not in err and err.count("--shapes") == 1, err


def test_an_empty_dtype_item_is_named(tmp_path, capsys, monkeypatch, no_gpu):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    _usage(capsys, _script("bench_extension").main, ["--module", "adir", "--dtypes", "fp16,"], "an empty item")
    _usage(capsys, _script("bench_attention").main, ["--dtypes", "fp16,"], "an empty item")
    _fails(capsys, _script("bench_attention").main, ["--output", str(tmp_path / "o")], "needs a CUDA GPU")


@pytest.mark.parametrize("argv,says", [
    (["--batch", "0"], "at least 1"), (["--batch", "-1"], "at least 1"), (["--min", "-5"], "at least 1"),
    (["--heads", "0"], "at least 1"), (["--min", "100", "--max", "10"], "above --max"),
    (["--heads", "16", "--heads-kv", "3"], "multiple of --heads-kv"), (["--output", ""], "the path is empty"),
])
def test_bench_varlen_checks_its_arguments_before_the_gpu(argv, says, capsys, no_gpu):
    _usage(capsys, _script("bench_varlen").main, argv, says)


def test_bench_varlen_says_it_needs_a_gpu(tmp_path, capsys, monkeypatch, no_gpu):
    monkeypatch.chdir(tmp_path)
    _fails(capsys, _script("bench_varlen").main, [], "needs a CUDA GPU")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv,says", [
    (["--groups", "0"], "at least 1"), (["--groups", "3"], "must divide --heads"), (["--sq", "-1"], "at least 1"),
    (["--sq", "1,,2"], "not a comma-separated list"), (["--bases", "nope"], "is not one of"),
])
def test_bench_decode_checks_its_arguments_before_the_gpu(argv, says, capsys, no_gpu):
    _usage(capsys, _script("bench_decode").main, argv, says)


def test_bench_decode_refuses_a_file_as_its_output_folder(tmp_path, capsys, no_gpu):
    (tmp_path / "f").write_text("x")
    _usage(capsys, _script("bench_decode").main, ["--output", str(tmp_path / "f")], "not a folder")
    _fails(capsys, _script("bench_decode").main, [], "needs a CUDA GPU")


def test_eager_clock_probe_help_works_without_a_gpu(capsys, no_gpu):
    module = _script("eager_clock_probe")
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0 and "usage" in capsys.readouterr().out
    _fails(capsys, module.main, [], "needs a CUDA GPU")


def test_bench_tuner_no_gpu_message_names_no_test_detail(monkeypatch):
    import evotuner.measure
    from evotuner.errors import EvotunerError

    monkeypatch.setattr(evotuner.measure, "gpu_available", lambda *a, **k: False)
    with pytest.raises(EvotunerError) as exc:
        _script("bench_tuner")._gpu_factory(1.0, 1.0)
    assert "measure_factory" not in str(exc.value) and "test" not in str(exc.value)


@pytest.mark.parametrize("argv", [["bogus"], ["tests", "bogus"]])
def test_gpu_verify_refuses_an_unknown_step_and_creates_nothing(argv, tmp_path):
    ran = subprocess.run(["bash", str(REPO / "scripts" / "gpu_verify.sh"), *argv], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2 and "unknown step 'bogus'" in ran.stderr and "decode" in ran.stderr, ran
    assert not list(tmp_path.iterdir())
    helped = subprocess.run(["bash", str(REPO / "scripts" / "gpu_verify.sh"), "--help"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "usage:" in helped.stdout and "runtime" in helped.stdout
    assert not list(tmp_path.iterdir())


# -- scripts/sampler_benchmark.py ------------------------------------------------------------

@pytest.mark.parametrize("argv,says", [
    (["--seeds", "0"], "at least 1"), (["--seeds", "-1"], "at least 1"), (["--batch", "0"], "at least 1"),
    (["--workers", "0"], "at least 1"), (["--max-budget", "-1"], "fraction"), (["--samplers", ","], "empty item"),
    (["--samplers", "tpe:foo=1"], "no setting 'foo'"), (["--samplers", "nope"], "unknown sampler"),
])
def test_sampler_benchmark_usage_errors(argv, says, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _usage(capsys, _script("sampler_benchmark").main, [str(D64), *argv], says)
    assert not list(tmp_path.iterdir())


def test_sampler_benchmark_sweep_errors_are_one_line_and_create_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bench = _script("sampler_benchmark")
    (tmp_path / "nosidecar.csv").write_text(D64.read_text())
    (tmp_path / "adir").mkdir()
    (tmp_path / "notdb.txt").write_text("x")
    for argv, says in ((["missing.csv"], "missing.csv: sweep file not found"), (["nosidecar.csv"], "nosidecar.csv"),
                       (["adir"], "adir"), ([str(REPO / "tests" / "data" / "sweep_h100_hopper_d64.csv"),
                                             "--space", "flashcore"], "--space hopper_grid")):
        assert "--replay" not in _fails(capsys, bench.main, argv, says)
    _usage(capsys, bench.main, [str(D64), "--output-dir", "notdb.txt"], "not a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "nosidecar.csv", "notdb.txt"]


def test_sampler_benchmark_takes_the_space_a_sweep_was_recorded_with():
    bench = _script("sampler_benchmark")
    space, replay = bench._load(str(REPO / "tests" / "data" / "sweep_h100_hopper_d64.csv"), None)
    assert space.kernel == "hopper" and Path(str(space.path)).stem == "hopper_grid"
    assert bench._load(str(D64), None)[0].kernel == "flashcore"


def test_sampler_benchmark_leaves_out_a_default_sampler_the_family_cannot_run(tmp_path, capsys, monkeypatch):
    bench = _script("sampler_benchmark")
    monkeypatch.setattr(bench, "ProcessPoolExecutor", _Serial)
    monkeypatch.setattr(bench, "plot", lambda runs, results, output: output)
    from evotuner.propose import SAMPLERS

    monkeypatch.setattr(bench, "simulate", None)      # never reached: _job is replaced below
    ran: list[str] = []
    monkeypatch.setattr(bench, "_job", lambda job: ran.append(job[1]) or bench.Run(
        Path(job[0]).name, job[1], job[2], 1, (1.0,) * len(job[5]), 1, 1, 0.0, (1.0,)))
    monkeypatch.setattr(bench, "summarize", lambda *a, **k: {})
    monkeypatch.setattr(bench, "random_exact", lambda *a, **k: {})
    monkeypatch.setattr(bench, "table_text", lambda results: "table")
    assert bench.main([str(D64), "--seeds", "1", "--output-dir", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "leaving out guided" in err and "guided" not in ran and set(ran) == set(SAMPLERS) - {"guided"}
    _fails(capsys, bench.main, [str(D64), "--samplers", "guided", "--output-dir", str(tmp_path / "p")],
           "cost model")
    assert not (tmp_path / "p").exists()


class _Serial:
    def __init__(self, max_workers=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, jobs, chunksize=1):
        return map(fn, jobs)
