"""Transfer between studies (evotuner/transfer.py), sub-grid spaces ([space] base) and the
recorded hopper sweeps (tests/data/sweep_h100_hopper_*.csv) they are tested on."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest

from cli_helpers import run
from evotuner import cli, session
from evotuner.defaults import recommended
from evotuner.errors import SpaceError
from evotuner.measure.replay import ReplayMeasure, read_sweep
from evotuner.problem import Problem, Shape
from evotuner.space import load_space, parse_space
from evotuner.transfer import plan_transfer, similarity

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
GRID = ROOT / "search_spaces" / "hopper_grid.toml"
SWEEPS = {
    "d64": (DATA / "sweep_h100_hopper_d64.csv", Problem(Shape.parse("B=16,H=16,S=2048,D=64"))),
    "d128": (DATA / "sweep_h100_hopper_d128.csv", Problem(Shape.parse("B=8,H=16,S=2048,D=128"))),
    "d64_causal": (DATA / "sweep_h100_hopper_d64_causal.csv",
                   Problem(Shape.parse("B=4,H=16,S=4096,D=64"), causal=True)),
    "d128_bf16": (DATA / "sweep_h100_hopper_d128_bf16.csv", Problem(Shape.parse("B=8,H=16,S=2048,D=128"), "bf16")),
}


# --------------------------------------------------------------------------- sub-grid spaces


def test_the_grid_narrows_hopper_and_keeps_everything_else():
    grid, full = load_space(GRID), load_space(ROOT / "search_spaces" / "hopper.toml")
    assert grid.kernel == full.kernel == "hopper" and grid.name == "hopper_grid"
    assert grid.param("BLOCK_N").values == (64, 96, 128, 160, 192) and grid.param("EXP_EMU").values == (0,)
    assert grid.gate == full.gate and grid.device == full.device and grid.fingerprint() != full.fingerprint()
    # hopper.toml may have grown knobs since the sweeps (CTAS_PER_SM): each has a family default
    from evotuner.family import get_family
    extra = set(full.names) - set(grid.names)
    assert extra <= set(get_family("hopper").optional_params) and set(grid.names) <= set(full.names)
    problem = Problem(Shape.parse("B=8,H=16,S=2048,D=128"))
    for config in list(grid.configs())[::97]:   # every grid config is a config of hopper.toml, as feasible
        full.validate(config)
        assert (grid.violated(config, problem) is None) == (full.violated(full.complete(config), problem) is None)


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "base.toml").write_text((ROOT / "search_spaces" / "hopper.toml").read_text())
    path = tmp_path / "sub.toml"
    path.write_text('[space]\nname = "sub"\nbase = "base.toml"\n' + text)
    return path


@pytest.mark.parametrize("text, says", [
    ("[params.BLOCK_N]\nvalues = [64, 72]\n", "[72] not among the base's"),
    ("[params.WARPS]\nvalues = [4]\n", "no parameter WARPS"),
    ("[gate]\nmax_spill_bytes = 8\n", "takes its [gate] from the base"),
    ('[params.BLOCK_N]\nvalues = []\n', "missing, empty"),
])
def test_a_sub_grid_may_only_narrow_its_base(tmp_path, text, says):
    with pytest.raises(SpaceError, match=None) as info:
        load_space(_write(tmp_path, text))
    assert says in str(info.value) and "sub.toml" in str(info.value)


def test_a_sub_grid_names_a_missing_base_and_needs_its_file(tmp_path):
    path = tmp_path / "sub.toml"
    path.write_text('[space]\nname = "sub"\nbase = "nowhere.toml"\n')
    with pytest.raises(SpaceError, match="nowhere.toml not found"):
        load_space(path)
    with pytest.raises(SpaceError, match="must be read from its file"):
        parse_space(path.read_text())


def test_a_sub_grid_reads_back_from_the_text_a_study_stores(tmp_path):
    """A study stores its space's text: a sub-grid's is its file's, then its base's, so it is
    read back without the files (evotuner show, resume, bench, check ran it through parse_space,
    which refused the joined text as TOML with two [space] tables until 2026-11-25); sub-grids
    of sub-grids too."""
    sub = _write(tmp_path, "[params.BLOCK_N]\nvalues = [64, 96, 128]\n")
    (tmp_path / "subsub.toml").write_text('[space]\nname = "subsub"\nbase = "sub.toml"\n'
                                          "[params.BLOCK_N]\nvalues = [96, 128]\n")
    for path in (GRID, sub, tmp_path / "subsub.toml"):
        space = load_space(path)
        again = parse_space(space.text, "stored")
        assert again.fingerprint() == space.fingerprint() and again.params == space.params
        assert again.constraints == space.constraints and again.gate == space.gate
    assert parse_space(load_space(tmp_path / "subsub.toml").text).param("BLOCK_N").values == (96, 128)
    with pytest.raises(SpaceError, match="not among the base's"):   # a stored text is checked as a file is
        parse_space(load_space(sub).text.replace("values = [64, 96, 128]", "values = [64, 72]", 1))


# --------------------------------------------------------------------------- the recorded sweeps


@pytest.mark.parametrize("key", list(SWEEPS))
def test_hopper_sweeps_cover_the_grid_and_are_measurements(key):
    path, problem = SWEEPS[key]
    grid = load_space(GRID)
    replay = ReplayMeasure(path, problem, grid)          # every grid config has a row, same fingerprint
    header = replay.table.header
    assert header["complete"] is True and not header.get("synthetic")
    assert header["device"]["name"] == "NVIDIA H100 80GB HBM3"
    assert all(isinstance(v, float) and v > 0 for v in header["baselines"].values())
    counts = Counter(r.status for r in replay.table.rows.values())
    feasible = sum(1 for c in grid.configs() if grid.violated(c, problem) is None)
    assert feasible >= 500 and counts["ok"] >= 500
    best = replay.table.optimum()
    assert best.max_error <= best.tolerance
    for config in recommended(problem, "hopper"):
        try:
            grid.validate(config)
        except SpaceError:
            # found later outside the grid (eager rescale at D=64, BLOCK_N=80 at D=128:
            # kernels/hopper/defaults.toml); a replayed study skips it as a start config
            assert config["RESCALE_LOG2"] not in grid.param("RESCALE_LOG2").values or \
                config["BLOCK_N"] not in grid.param("BLOCK_N").values, config
            continue
        assert replay.lookup(config).value is not None  # a recommended config of the grid was timed there


# --------------------------------------------------------------------------- transfer


def test_similarity_weighs_causal_most_then_rows_and_keys_then_dtype_and_needs_the_head_dim():
    target = Problem(Shape.parse("B=4,H=32,S=4096,D=128"), causal=True)
    near = {name: similarity(target, p) for name, p in [
        ("same", Problem(Shape.parse("B=4,H=32,S=4096,D=128"), causal=True)),
        ("other D", Problem(Shape.parse("B=4,H=32,S=4096,D=64"), causal=True)),
        ("bf16", Problem(Shape.parse("B=4,H=32,S=4096,D=128"), "bf16", True)),
        ("not causal", Problem(Shape.parse("B=4,H=32,S=4096,D=128"))),
        ("2x seq", Problem(Shape.parse("B=4,H=32,S=2048,D=128"), causal=True)),
        ("8x seq", Problem(Shape.parse("B=4,H=32,S=32768,D=128"), causal=True)),
        ("2x batch", Problem(Shape.parse("B=8,H=32,S=4096,D=128"), causal=True)),
    ]}
    assert near["same"] == 1.0 and near["other D"] == 0.0
    assert near["bf16"] > near["2x batch"] > near["2x seq"] > near["not causal"] > near["8x seq"] > 0.5
    assert near["2x seq"] == pytest.approx(math.exp(-0.1))     # query rows and key length both double
    assert near["2x batch"] == pytest.approx(math.exp(-0.05))  # query rows double
    assert similarity(near_p := Problem(Shape.parse("B=8,H=32,S=4096,D=128")), target) == similarity(target, near_p)
    # the sizes are the query rows B x H x Sq (how many tiles) and the key length (each tile's loop):
    # how the rows split into batches and heads does not matter, and Sq counts through the rows only
    split = Problem(Shape.parse("B=8,H=16,S=4096,D=128"), causal=True)
    assert similarity(target, split) == 1.0
    longer_q = Problem(Shape(batch=2, heads=32, seqlen_q=8192, seqlen_k=4096, head_dim=128), causal=True)
    assert similarity(target, longer_q) == 1.0
    assert similarity(target, Problem(Shape(batch=4, heads=32, seqlen_q=4096, seqlen_k=8192, head_dim=128),
                                      causal=True)) == pytest.approx(math.exp(-0.05))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A database with replayed studies of three sweeps (tpe-masked, 24 trials each: plain TPE's
    static prunes would leave a study a few COMPLETE trials) and a FlashCore one."""
    folder = tmp_path_factory.mktemp("transfer")
    url = f"sqlite:///{folder / 'sources.db'}"
    store = session.open_store(url)
    grid = load_space(GRID)
    for key in ("d64", "d128", "d128_bf16"):
        path, problem = SWEEPS[key]
        with ExitStack() as stack:
            builder, measure = session.StageFactory(replay=path).stages(problem, grid, 2, stack)
            session.start_study(store, key, problem, grid, "tpe-masked", 0, builder)
            session.run_study(store, key, problem, grid, "tpe-masked", 0, 24, builder, measure, transfer=False)
    flash = load_space(None)
    fc_problem = Problem(Shape.parse("B=16,H=16,S=2048,D=64"))
    with ExitStack() as stack:
        builder, measure = session.StageFactory(replay=DATA / "sweep_h100_d64.csv").stages(fc_problem, flash, 2, stack)
        session.start_study(store, "flashcore", fc_problem, flash, "tpe", 0, builder)
        session.run_study(store, "flashcore", fc_problem, flash, "tpe", 0, 8, builder, measure, transfer=False)
    yield url, store
    store.close()


def test_show_reads_a_study_of_the_grid_and_its_ten_parameters_fit_80_columns(sources, capsys, monkeypatch):
    """The hopper grid's ten parameters, the trial number and three figures in 80 columns,
    every value whole (the boxed table of before cut trial numbers to "…" and left some
    parameter columns empty there): the one-word headers shorten (STAGES -> STAG); the two the
    grid fixes (RESCALE_LOG2=8, EXP_EMU=0) are named once under the table, not as columns."""
    url, _ = sources
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run(capsys, "show", "--study", "d64", "--storage", url, "--top", "10")
    assert code == 0, err
    assert "hopper_grid" in out and "B=16,H=16,S=2048,D=64" in out
    lines = out.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), out
    assert "…" not in out and "STAG = STAGES" in out and "CW = CONSUMER_WGS" in out
    rule = next(i for i, line in enumerate(lines) if line.startswith("───"))
    header, rows = lines[rule - 1].split(), [line.split() for line in lines[rule + 1:rule + 11]]
    assert header[:3] == ["#", "BN", "CW"] and header[-4:] == ["µs", "TFLOPS", "vs", "SDPA"]
    assert len(rows) == 10 and all(len(r) == 1 + 8 + 3 for r in rows), rows
    assert all(all(v.isdigit() for v in r[:9]) and r[-1].endswith("x") for r in rows), rows
    assert len({tuple(r[1:9]) for r in rows}) == 10                   # ten distinct configs, all visible
    assert "every config here: RESCALE_LOG2=8, EXP_EMU=0" in out and "RL" not in header


def test_plan_takes_the_nearest_studies_of_the_family_device_and_head_dim(sources):
    _, store = sources
    path, problem = SWEEPS["d64_causal"]
    grid = load_space(GRID)
    device = read_sweep(path).header["device"]
    plan = plan_transfer(store, "new", problem, grid, device)
    assert [s.study for s in plan.sources] == ["d64"]
    skipped = dict(plan.skipped)
    assert "family flashcore" in skipped["flashcore"]
    assert "head dim 128, not 64" in skipped["d128"] and "head dim 128" in skipped["d128_bf16"]
    source = plan.sources[0]
    assert source.similarity == pytest.approx(similarity(problem, store.summary("d64").problem))
    assert 1 <= len(source.configs) <= 4 and plan.configs == source.configs
    assert plan.configs[0] == store.summary("d64").best.kernel_config
    assert all(grid.violated(c, problem) is None for c in plan.configs)
    # every compiled config once, the fastest first; statically pruned and repeated trials left out
    trials = store.summary("d64").trials
    measured = {t.kernel_config: t.value for t in trials if t.state == "COMPLETE" and t.duplicate_of is None}
    times = [o.median_us for o in source.observations if o.median_us is not None]
    assert times == sorted(times) and len(times) == len(measured) and times[0] == min(measured.values())
    failed = [o.config for o in source.observations if o.median_us is None]
    pruned = {t.kernel_config: t for t in trials if t.state == "PRUNED"}
    assert all(pruned[c].gate is not None and pruned[c].gate["passed"] is False for c in failed if c in pruned)
    assert len({o.config for o in source.observations}) == len(source.observations)
    assert plan_transfer(store, "new", problem, grid, {"name": "NVIDIA A100"}).sources == ()
    assert plan_transfer(store, "new", problem, grid, None).sources == ()
    d128 = plan_transfer(store, "new", SWEEPS["d128_bf16"][1], grid, device)
    assert [s.study for s in d128.sources] == ["d128_bf16", "d128"]       # same problem first, then the fp16 one
    assert [s.study for s in plan_transfer(store, "new", SWEEPS["d128_bf16"][1], grid, device,
                                           only=["d128_bf16"]).sources] == ["d128_bf16"]


def _search(capsys, url, study, trials, *extra):
    path, _ = SWEEPS["d64_causal"]
    return run(capsys, "search", "--study", study, "--trials", trials, "--shape", "B=4,H=16,S=4096,D=64", "--causal",
               "--space", GRID, "--replay", path, "--storage", url, *extra)


def _first(url, study, n):
    store = session.open_store(url, read_only=True)
    try:
        return [t.kernel_config for t in store.summary(study).trials[:n]], store.transfer_sources(study)
    finally:
        store.close()


def test_guided_search_takes_the_nearest_studies_measurements_and_keeps_them(sources, capsys, monkeypatch,
                                                                             build_cache_dir):
    url, _ = sources
    monkeypatch.delenv(cli.STORAGE_ENV, raising=False)
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(build_cache_dir))
    _, problem = SWEEPS["d64_causal"]
    code, out, err = _search(capsys, url, "seeded", 4)
    assert code == 0, err
    words = " ".join(out.split())                 # the log lines wrap at the console's width
    assert "seeded from studies d64 (B=16,H=16,S=2048,D=64 fp16 non-causal, " in words
    assert "measured): the sampler weighs their measurements against its cost model" in words
    first, recorded = _first(url, "seeded", 4)
    assert recorded == ("d64",)
    # nothing enqueued: after the recommended configs of the grid (none here at D=64), the sampler's picks
    starts = [c for c in recommended(problem, "hopper") if load_space(GRID).admits(c, problem)]
    assert first[:len(starts)] == starts
    store = session.open_store(url, read_only=True)
    try:
        replay = ReplayMeasure(SWEEPS["d64_causal"][0], problem, load_space(GRID))
        related = session.related_studies(store, "seeded", problem, load_space(GRID), replay)
        assert [r.name for r in related] == ["d64"] and len(related[0].points) >= 10
        assert all(math.isfinite(est) for _, us, est in related[0].points if us is not None)
        assert session.related_studies(store, "d64", problem, load_space(GRID), replay) == ()   # started cold
    finally:
        store.close()
    code, out, err = _search(capsys, url, "cold", 3, "--no-transfer")
    assert code == 0, err
    assert "seeded from" not in out and _first(url, "cold", 0)[1] == ()
    code, out, err = _search(capsys, url, "seeded", 8)
    assert code == 0, err
    assert "seeded from" not in out                                       # only a new study is seeded ...
    assert _first(url, "seeded", 0)[1] == ("d64",)                        # ... and it keeps its sources


def test_a_sampler_without_a_model_gets_the_best_configs_enqueued(sources, capsys, monkeypatch, build_cache_dir):
    url, _ = sources
    monkeypatch.delenv(cli.STORAGE_ENV, raising=False)
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(build_cache_dir))
    path, problem = SWEEPS["d64_causal"]
    store = session.open_store(url, read_only=True)
    try:
        plan = plan_transfer(store, "masked", problem, load_space(GRID), read_sweep(path).header["device"],
                             observations=False)
    finally:
        store.close()
    code, out, err = _search(capsys, url, "masked", 6, "--sampler", "tpe-masked")
    assert code == 0, err
    words = " ".join(out.split())                 # the log lines wrap at the console's width
    assert "seeded with the best configs of studies" in words and "run right after the recommended one" in words
    assert re.search(r"d64 \(B=16,H=16,S=2048,D=64 fp16 non-causal: \d+ configs?\)", words)   # a labelled count
    first, recorded = _first(url, "masked", 3)
    starts = [c for c in recommended(problem, "hopper") if load_space(GRID).admits(c, problem)]
    assert first == (starts + [c for c in plan.configs if c not in starts])[:3]
    assert "d64" in recorded and recorded == plan.studies


def test_transfer_benchmark_script_runs_leave_one_out(tmp_path):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("transfer_benchmark", ROOT / "scripts" / "transfer_benchmark.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["transfer_benchmark"] = module
    spec.loader.exec_module(module)
    out = tmp_path / "t.json"
    assert module.main([str(SWEEPS["d64"][0]), str(SWEEPS["d64_causal"][0]), "--space", str(GRID), "--seeds", "1",
                        "--source-trials", "8", "--workers", "1", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["problems"]) == {"sweep_h100_hopper_d64.csv", "sweep_h100_hopper_d64_causal.csv"}
    for row in result["problems"].values():
        assert row["cold_median"] >= 1 and row["transfer_median"] >= 1 and len(row["transfer"]) == 1


def test_a_study_with_nothing_to_give_is_skipped_and_the_next_takes_its_place():
    from types import SimpleNamespace as NS

    from evotuner.config import KernelConfig

    grid = load_space(GRID)
    path, problem = SWEEPS["d64_causal"]
    device = read_sweep(path).header["device"]
    base = dict(BLOCK_N=128, CONSUMER_WGS=3, STAGES=2, REG_PROD=32, REG_CONS=160, OVERLAP=1, PINGPONG=1, SCHED=2,
                RESCALE_LOG2=8, EXP_EMU=0)
    outside = KernelConfig.of({**base, "RESCALE_LOG2": 0})            # not a value of the grid
    admitted = KernelConfig.of(base)
    assert not grid.admits(outside, problem) and grid.admits(admitted, problem)

    def study(name, shape, config):
        trial = NS(number=0, state="COMPLETE", value=100.0, kernel_config=config, duplicate_of=None)
        return NS(name=name, kernel_family="hopper", device=device, best=trial, trials=[trial],
                  problem=Problem(Shape.parse(shape), causal=True))

    studies = {s.name: s for s in (study("near", "B=4,H=16,S=4096,D=64", outside),
                                   study("far", "B=4,H=16,S=8192,D=64", admitted))}
    store = NS(list_studies=lambda: [NS(name=n) for n in studies], summary=studies.__getitem__)
    plan = plan_transfer(store, "new", problem, grid, device, studies=1, observations=False)
    assert [s.study for s in plan.sources] == ["far"] and plan.configs == (admitted,)
    assert "no config of its best" in dict(plan.skipped)["near"]
    # a sampler that takes measurements learns from the nearest one all the same
    plan = plan_transfer(store, "new", problem, grid, device, studies=1)
    assert [s.study for s in plan.sources] == ["near"] and plan.sources[0].observations[0].config == outside
