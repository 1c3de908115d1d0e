"""Transfer between studies (evotuner/transfer.py), sub-grid spaces ([space] base) and the
recorded hopper sweeps (tests/data/sweep_h100_hopper_*.csv) they are tested on."""

from __future__ import annotations

import json
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
from evotuner.transfer import distance, plan_transfer

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
    assert grid.constraints == full.constraints and grid.derived == full.derived and grid.gate == full.gate
    assert grid.fingerprint() != full.fingerprint()
    for config in list(grid.configs())[::97]:           # every grid config is a config of the base
        full.validate(config)


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


def test_distance_orders_head_dim_then_dtype_then_causal_then_sizes():
    target = Problem(Shape.parse("B=4,H=32,S=4096,D=128"), causal=True)
    order = sorted([
        ("other D", Problem(Shape.parse("B=4,H=32,S=4096,D=64"), causal=True)),
        ("bf16", Problem(Shape.parse("B=4,H=32,S=4096,D=128"), "bf16", True)),
        ("not causal", Problem(Shape.parse("B=4,H=32,S=4096,D=128"))),
        ("2x seq", Problem(Shape.parse("B=4,H=32,S=2048,D=128"), causal=True)),
        ("4x seq", Problem(Shape.parse("B=4,H=32,S=16384,D=128"), causal=True)),
    ], key=lambda p: distance(target, p[1]))
    assert [name for name, _ in order] == ["2x seq", "4x seq", "not causal", "bf16", "other D"]


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


def test_plan_takes_the_nearest_studies_of_the_family_and_device(sources):
    _, store = sources
    path, problem = SWEEPS["d64_causal"]
    grid = load_space(GRID)
    device = read_sweep(path).header["device"]
    plan = plan_transfer(store, "new", problem, grid, device)
    assert [s.study for s in plan.sources] == ["d64", "d128"]            # same D first, then the nearer dtype
    assert 2 <= len(plan.configs) == len(set(plan.configs)) <= 8              # <= 4 each, never twice
    assert all(1 <= len(s.configs) <= 4 for s in plan.sources)
    best_d64 = store.summary("d64").best.kernel_config
    assert plan.configs[0] == best_d64
    assert all(grid.violated(c, problem) is None for c in plan.configs)
    skipped = dict(plan.skipped)
    assert "family flashcore" in skipped["flashcore"]
    assert plan_transfer(store, "new", problem, grid, {"name": "NVIDIA A100"}).configs == ()
    assert plan_transfer(store, "new", problem, grid, None).configs == ()


def test_search_seeds_a_new_study_and_says_so(sources, capsys, tmp_path, monkeypatch, build_cache_dir):
    url, _ = sources
    monkeypatch.delenv(cli.STORAGE_ENV, raising=False)
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(build_cache_dir))
    path, problem = SWEEPS["d64_causal"]
    common = ["--shape", "B=4,H=16,S=4096,D=64", "--causal", "--space", GRID, "--replay", path, "--storage", url]
    store = session.open_store(url, read_only=True)
    try:
        plan = plan_transfer(store, "seeded", problem, load_space(GRID), read_sweep(path).header["device"])
    finally:
        store.close()
    code, out, err = run(capsys, "search", "--study", "seeded", "--trials", 6, *common)
    assert code == 0, err
    assert "seeded from studies d64 (B=16,H=16,S=2048,D=64 fp16 non-causal, " in out
    store = session.open_store(url, read_only=True)
    try:
        first = [t.kernel_config for t in store.summary("seeded").trials[:3]]
    finally:
        store.close()
    # the recommended config stays first where the space has it (the D=64 one lies outside the grid)
    starts = [c for c in recommended(problem, "hopper") if load_space(GRID).admits(c, problem)]
    assert first == (starts + [c for c in plan.configs if c not in starts])[:3]
    code, out, err = run(capsys, "search", "--study", "cold", "--trials", 3, "--no-transfer", *common)
    assert code == 0, err
    assert "seeded from" not in out
    code, out, err = run(capsys, "search", "--study", "seeded", "--trials", 8, *common)
    assert code == 0, err
    assert "seeded from" not in out                                       # only a new study is seeded


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
        trial = NS(number=0, state="COMPLETE", value=100.0, kernel_config=config)
        return NS(name=name, kernel_family="hopper", device=device, best=trial, trials=[trial],
                  problem=Problem(Shape.parse(shape), causal=True))

    studies = {s.name: s for s in (study("near", "B=4,H=16,S=4096,D=64", outside),
                                   study("far", "B=4,H=16,S=8192,D=64", admitted))}
    store = NS(list_studies=lambda: [NS(name=n) for n in studies], summary=studies.__getitem__)
    plan = plan_transfer(store, "new", problem, grid, device, studies=1)
    assert [s.study for s in plan.sources] == ["far"] and plan.configs == (admitted,)
    assert "no config of its best" in dict(plan.skipped)["near"]
