"""The runtime's CPU-side contracts: the argument binder of the hot path, the family a config
names, and tuned configs served from a study database, an exported header and the shipped
table (tune -> use, with a replayed search). The GPU side (the launch, CUDA graphs,
torch.compile) is tests/gpu/test_runtime_path.py."""

from __future__ import annotations

import ctypes
import struct
from contextlib import ExitStack
from pathlib import Path

import pytest

from evotuner import defaults, session
from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError, SpaceError
from evotuner.family import AttentionArgs, DeviceInfo, TensorView, get_family
from evotuner.problem import Problem, Shape
from evotuner.runtime import attention as A
from evotuner.runtime import choice, inputs
from evotuner.runtime.binder import POINTER_LIMIT, ArgBinder
from evotuner.space import load_space
from evotuner import tuned

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
GRID = ROOT / "search_spaces" / "hopper_grid.toml"
H100 = "NVIDIA H100 80GB HBM3"


# --------------------------------------------------------------------------- the binder


def _flashcore_bytes(ptrs, lse=True):
    """FlashCore's real argument bytes (its launch is torch- and driver-free) at ``ptrs``."""
    fam = get_family("flashcore")
    meta = {"block_m": 128, "threads": 128, "smem_bytes": 1024}
    shape, strides = (2, 4, 100, 64), (4 * 100 * 64, 100 * 64, 64, 1)
    view = lambda p: TensorView(p, shape, strides)  # noqa: E731
    args = AttentionArgs(view(ptrs["q"]), view(ptrs["k"]), view(ptrs["v"]), view(ptrs["o"]),
                         TensorView(ptrs["lse"], shape[:3], strides[:3]) if lse else None, "fp16", 0.125)
    return fam.launch(meta, args, DeviceInfo(0, 132)).args[0]


BASE = {"q": 0x7F00_0000_0000, "k": 0x7F00_1000_0000, "v": 0x7F00_2000_0000, "o": 0x7F00_3000_0000,
        "lse": 0x7F00_4000_0000}


def test_binder_rebinds_raw_pointer_fields_byte_for_byte():
    binder = ArgBinder.derive(_flashcore_bytes, BASE)
    assert binder is not None and binder.roles == ("q", "k", "v", "o", "lse")
    for moved in ({**BASE, "q": 0x1234_5670}, {r: p + 0x1000 * (i + 1) for i, (r, p) in enumerate(BASE.items())}):
        assert binder.bind(moved) == _flashcore_bytes(moved)
    buf = ctypes.create_string_buffer(binder.template, len(binder.template))  # the hot path writes in place
    binder.bind_into(buf, tuple(p + 16 for p in BASE.values()))
    assert buf.raw == _flashcore_bytes({r: p + 16 for r, p in BASE.items()})


def _shifted_field(ptrs):
    """An encoding like a tensor map's address field: (ptr >> 4) at bit 12 of a 16-byte window
    that straddles two words, between constant bytes."""
    word = (0xABC | ((ptrs["q"] >> 4) << 12)) | (0x5 << 124)
    return b"\x11" * 8 + word.to_bytes(16, "little") + struct.pack("<Q", ptrs["o"]) + b"\x22" * 8


def test_binder_finds_a_shifted_field_that_straddles_words():
    binder = ArgBinder.derive(_shifted_field, {"q": BASE["q"], "o": BASE["o"]})
    assert binder is not None
    moved = {"q": 0x5555_5555_5550, "o": 0x10}
    assert binder.bind(moved) == _shifted_field(moved)


@pytest.mark.parametrize("encoding", [
    lambda p: struct.pack("<Q", p["q"] ^ (p["q"] >> 7)),                 # bits mixed: not one field
    lambda p: struct.pack("<Q", 7),                                      # the pointer nowhere
    lambda p: struct.pack("<Q", p["q"]) + bytes(8 * ((p["q"] >> 4) & 1)),  # the size depends on it
])
def test_binder_refuses_an_encoding_it_cannot_reproduce(encoding):
    assert ArgBinder.derive(encoding, {"q": BASE["q"]}) is None


def test_binder_rebinds_a_pointer_held_in_two_places():
    """A pointer in two fields (the hopper kernel's SCHED 3 holds O in its map and as o_ptr):
    both are found, and every rebinding writes both."""
    both = lambda p: struct.pack("<QQ", p["q"], p["q"])   # noqa: E731
    binder = ArgBinder.derive(both, {"q": BASE["q"]})
    assert binder is not None and binder.roles == ("q",) and [f.offset for f in binder.fields] == [0, 8]
    assert binder.bind({"q": 0x5555_5555_5550}) == both({"q": 0x5555_5555_5550})


def test_binder_refuses_unaligned_or_out_of_range_pointers():
    assert ArgBinder.derive(_flashcore_bytes, {**BASE, "q": BASE["q"] + 8}) is None
    assert ArgBinder.derive(_flashcore_bytes, {**BASE, "q": POINTER_LIMIT}) is None


# --------------------------------------------------------------------------- a config names its family


@pytest.fixture
def packaged_families(monkeypatch):
    """Only the two packaged families (other tests register toy families of their own)."""
    two = (get_family("flashcore"), get_family("hopper"))
    for module in (choice, inputs, defaults):
        monkeypatch.setattr(module, "families", lambda: two)


def test_a_config_runs_the_family_its_parameters_name(packaged_families):
    problem = Problem(Shape.parse("B=1,H=8,S=512,D=64"))
    hopper = A.choose(problem, {"CONSUMER_WGS": 2, "BLOCK_N": 128})
    assert hopper.family == "hopper" and hopper.config["CONSUMER_WGS"] == 2 and "hopper" in hopper.why
    assert A.choose(problem, "NUM_WARPS=4").family == "flashcore"
    assert A.choose(problem, KernelConfig.of({"SCHED": 1})).family == "hopper"
    # names both families have: the default family, as before; family= decides otherwise
    assert A.choose(problem, {"BLOCK_N": 64}).family == "flashcore"
    assert A.choose(problem, {"BLOCK_N": 128}, family="hopper").family == "hopper"


def test_a_partial_config_changes_only_its_keys_of_what_the_problem_would_run():
    """Missing keys come from the config recommended for this problem, size-dependent entries
    included (hopper's [d128.mid] up to 131072 query rows), not from the head dim's base entry."""
    mid = Problem(Shape(1, 32, 4096, 4096, 128, 8), "fp16", False)          # 131072 query rows
    big = Problem(Shape(8, 16, 2048, 2048, 128), "fp16", False)             # 262144: [d128]
    for problem in (mid, big):
        (recommended,) = get_family("hopper").recommended_configs(problem)
        chosen = A.choose(problem, {"SCHED": 0}, family="hopper").config
        assert chosen.as_dict() == {**recommended.as_dict(), "SCHED": 0}
    assert A.choose(mid, "SCHED=0", family="hopper").config["CONSUMER_WGS"] == 2
    assert A.choose(big, "SCHED=0", family="hopper").config["CONSUMER_WGS"] == 3
    # the Choice says where the other keys came from; a config naming every parameter runs as given
    partial = A.choose(mid, "SCHED=0")
    assert partial.partial and A.PARTIAL_NOTE in partial.why
    full = KernelConfig.of({**get_family("hopper").recommended_configs(big)[0].as_dict(), "SCHED": 0})
    given = A.choose(mid, full)
    assert given.config == full and not given.partial and A.PARTIAL_NOTE not in given.why


@pytest.mark.parametrize("config, fragments", [
    ({"NUM_WARPS": 4, "CONSUMER_WGS": 2}, ("no kernel family takes all of", "CONSUMER_WGS", "NUM_WARPS")),
    ("TILE=4", ("no kernel family", "TILE", "hopper: ", "flashcore: ")),
])
def test_a_config_of_no_single_family_is_an_error_naming_them(config, fragments, packaged_families):
    with pytest.raises(SpaceError) as info:
        A.choose(Problem(Shape.parse("B=1,H=8,S=512,D=64")), config)
    for fragment in fragments:
        assert fragment in str(info.value)


# --------------------------------------------------------------------------- tuned tables


def _row(family="hopper", device=H100, d=64, dtype="fp16", causal=False, sk=2048, rows=16 * 16 * 2048,
         config="SCHED=1", us=100.0, source="study 'a' trial 3"):
    return tuned.TunedRow(family, device, d, dtype, causal, sk, rows, KernelConfig.parse(config), us, source)


def test_pick_takes_the_size_bucket_then_the_nearest_size_then_nothing():
    table = tuned.TunedTable((_row(config="SCHED=1"), _row(sk=512, rows=4096, config="SCHED=0",
                                                             source="study 'small' trial 1")), "db")
    same_bucket = Problem(Shape.parse("B=8,H=32,S=1500,D=64"))          # 384k rows -> 2**19 bucket, Sk 2**11
    pick = table.pick(same_bucket, H100, "hopper")
    assert pick.row.config == KernelConfig.parse("SCHED=1") and "same size bucket" in pick.why and "db" in pick.why
    near = Problem(Shape.parse("B=1,H=8,S=1024,D=64"))                  # 8192 rows, Sk 1024: nearest is 'small'
    pick = table.pick(near, H100, "hopper")
    assert pick.row.source == "study 'small' trial 1" and "nearest tuned size" in pick.why
    far = Problem(Shape.parse("B=64,H=64,S=32768,D=64"))
    assert table.pick(far, H100, "hopper") is None
    assert "doublings" in table.nearest_note(far, H100, "hopper")
    # another GPU model, head dim, dtype, causal flag or family: nothing
    assert table.pick(same_bucket, "NVIDIA H200", "hopper") is None
    assert "not NVIDIA H200" in table.nearest_note(same_bucket, "NVIDIA H200", "hopper")
    for other in (Problem(Shape.parse("B=8,H=32,S=1500,D=128")), Problem(Shape.parse("B=8,H=32,S=1500,D=64"), "bf16"),
                  Problem(Shape.parse("B=8,H=32,S=1500,D=64"), causal=True)):
        assert table.pick(other, H100, "hopper") is None
    assert table.pick(same_bucket, H100, "flashcore") is None


def test_pick_prefers_the_same_gpu_model_over_an_unnamed_one():
    table = tuned.TunedTable((_row(device="", config="SCHED=0"), _row(config="SCHED=2")), "db")
    assert table.pick(Problem(Shape.parse("B=16,H=16,S=2048,D=64")), H100).row.config["SCHED"] == 2
    assert table.pick(Problem(Shape.parse("B=16,H=16,S=2048,D=64")), "NVIDIA H200").row.config["SCHED"] == 0


def test_choose_serves_the_table_then_falls_back_to_the_recommended_config_with_the_reason():
    table = tuned.TunedTable((_row(config="BLOCK_N=80,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,"
                                          "PINGPONG=1,SCHED=1,RESCALE_LOG2=0,EXP_EMU=0"),), "sqlite:///x.db")
    problem = Problem(Shape.parse("B=16,H=16,S=2048,D=64"))
    served = A.choose(problem, device=H100, tables=(table,))
    assert served.family == "hopper" and served.config["BLOCK_N"] == 80 and served.why.startswith("tuned: ")
    other = Problem(Shape.parse("B=16,H=16,S=2048,D=128"))
    fallback = A.choose(other, device=H100, tables=(table,))
    assert fallback.config == A.choose(other, tables=()).config
    assert "recommended config" in fallback.why and "no tuned row for D=128" in fallback.why
    # an explicit config or family beats the table
    assert A.choose(problem, "SCHED=0", device=H100, tables=(table,)).config["SCHED"] == 0
    assert A.choose(problem, family="flashcore", device=H100, tables=(table,)).family == "flashcore"


def test_a_table_with_both_families_serves_the_faster_row_not_the_first_family(packaged_families):
    """One database holding a FlashCore and a hopper study of one problem serves the row with the
    higher TFLOP/s at its tuned problem, whatever the families' order; a row of the problem's
    size bucket beats another family's nearest size; with no figure, the family order."""
    problem = Problem(Shape.parse("B=16,H=16,S=2048,D=64"))
    hop = "BLOCK_N=80,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,SCHED=1,RESCALE_LOG2=0,EXP_EMU=0"
    fc = ",".join(f"{k}={v}" for k, v in defaults.default_config(64, "fp16", False, family="flashcore").as_dict().items())
    for fc_us, hop_us, want in ((300.0, 200.0, "hopper"), (200.0, 300.0, "flashcore")):
        table = tuned.TunedTable((_row("flashcore", config=fc, us=fc_us, source="study 'fc' trial 1"),
                                  _row(config=hop, us=hop_us, source="study 'hop' trial 2")), "db")
        served = A.choose(problem, device=H100, tables=(table,))
        other = "flashcore" if want == "hopper" else "hopper"
        assert served.family == want and f"over the {other} family's tuned row" in served.why, served.why
        assert "TFLOPS" in served.why
    # a row of another size bucket loses to the other family's row of this one, even if faster
    table = tuned.TunedTable((_row("flashcore", config=fc, us=300.0),
                              _row(config=hop, rows=16 * 16 * 512, sk=1024, us=1.0)), "db")
    served = A.choose(problem, device=H100, tables=(table,))
    assert served.family == "flashcore" and "a nearest size" in served.why
    # the families' shipped tables (one file each) are ranked as one; a user's table still comes first
    shipped = tuple(tuned.TunedTable((row,), f"the shipped table of {row.family}", shipped=True)
                    for row in (_row("flashcore", config=fc, us=300.0), _row(config=hop, us=200.0)))
    assert A.choose(problem, device=H100, tables=shipped).family == "hopper"
    user = tuned.TunedTable((_row("flashcore", config=fc, us=900.0),), "db")
    assert A.choose(problem, device=H100, tables=(user, *shipped)).family == "flashcore"
    # rows with no figure: the family order, said so
    table = tuned.TunedTable((_row("flashcore", config=fc, us=None), _row(config=hop, us=None)), "db")
    served = A.choose(problem, device=H100, tables=(table,))
    assert served.family == "flashcore" and "family order" in served.why
    # a study's rate is its problem's, causal counted half
    assert _row(us=100.0).rate == pytest.approx(4 * 16 * 16 * 2048 * 2048 * 64 / 100e-6 / 1e12)
    assert _row(us=100.0, causal=True).rate == pytest.approx(_row(us=100.0).rate / 2)


@pytest.fixture(scope="module")
def replayed_db(tmp_path_factory):
    """A database with a replayed 8-trial guided study of the D=64 hopper sweep."""
    url = f"sqlite:///{tmp_path_factory.mktemp('serve') / 'studies.db'}"
    problem = Problem(Shape.parse("B=16,H=16,S=2048,D=64"))
    grid = load_space(GRID)
    store = session.open_store(url)
    with ExitStack() as stack:
        builder, measure = session.StageFactory(replay=DATA / "sweep_h100_hopper_d64.csv").stages(problem, grid, 2, stack)
        session.start_study(store, "d64", problem, grid, "guided", 0, builder)
        session.run_study(store, "d64", problem, grid, "guided", 0, 8, builder, measure, transfer=False)
    best = store.summary("d64").best
    store.close()
    return url, best


def test_the_benchmarks_find_each_studys_best_at_its_exact_problem(replayed_db):
    """What bench_attention/bench_decode --tuned time: a study's best at the very problem it
    tuned, keyed by (problem, family); a missing database is one clear error."""
    url, best = replayed_db
    bests = tuned.study_bests(url)
    assert bests == {(Problem(Shape.parse("B=16,H=16,S=2048,D=64")), "hopper"): [("d64", best.kernel_config)]}
    with pytest.raises(EvotunerError):
        tuned.study_bests("sqlite:////nonexistent/dir/none.db")


def test_tune_then_use_serves_the_studys_best_config(replayed_db, monkeypatch):
    url, best = replayed_db
    table = tuned.load(url)
    assert len(table) == 1 and table.rows[0].device == H100 and table.rows[0].config == best.kernel_config
    problem = Problem(Shape.parse("B=16,H=16,S=2048,D=64"))
    choice = A.choose(problem, device=H100, tables=(table,))
    assert choice.config == best.kernel_config and "study 'd64'" in choice.why and "same size bucket" in choice.why
    nearest = A.choose(Problem(Shape.parse("B=4,H=16,S=2048,D=64")), device=H100, tables=(table,))
    assert nearest.config == best.kernel_config and "nearest tuned size" in nearest.why
    fallback = A.choose(Problem(Shape.parse("B=1,H=1,S=64,D=64")), device=H100, tables=(table,))
    assert fallback.config != best.kernel_config and "recommended config" in fallback.why
    # use_tuned reads it once and serves it; None goes back to the default (environment + shipped)
    try:
        assert A.use_tuned(url, shipped=False) is not None
        assert A.served_tables()[0].source == table.source
        assert A.choose(problem, device=H100).config == best.kernel_config
        monkeypatch.setenv(tuned.ENV_VAR, url.replace("sqlite:///", ""))   # a plain path works too
        A.use_tuned(None)
        assert A.served_tables()[0].rows == table.rows
    finally:
        monkeypatch.delenv(tuned.ENV_VAR)
        A.use_tuned(None)


def test_an_exported_header_is_served_by_its_own_select_rule(replayed_db, tmp_path, capsys):
    from evotuner import cli

    url, best = replayed_db
    header = tmp_path / "tuned.h"
    assert cli.main(["export", "--study", "d64", "--storage", url, "--output", str(header)]) == 0
    capsys.readouterr()
    table = tuned.load(header)
    assert len(table) == 1 and table.rows[0].config == best.kernel_config and table.rows[0].device == H100
    pick = table.pick(Problem(Shape.parse("B=1,H=1,S=1024,D=64")), H100)
    assert pick is not None and "Sk <= 2048" in pick.why
    pick = table.pick(Problem(Shape.parse("B=1,H=1,S=9000,D=64")), H100)
    assert pick is not None and "largest bucket" in pick.why


def test_a_database_and_its_header_with_both_families_serve_the_faster_family(tmp_path, capsys, packaged_families):
    """A hopper and a FlashCore study of one problem in one database (replayed synthetic sweeps
    of one made-up device): the database and the header exported from it serve the row with
    the higher TFLOPS (the header's comment keeps it), not the first family."""
    from evotuner import cli

    db = f"sqlite:///{tmp_path / 'both.db'}"
    replay = DATA / "replay"
    for argv in (["--study", "hop", "--space", str(DATA / "spaces" / "hopper_small.toml"), "--replay",
                  str(replay / "hopper_synthetic_d64.csv")],
                 ["--study", "fc", "--replay", str(replay / "synthetic_d64.csv")]):
        assert cli.main(["search", *argv, "--shape", "B=16,H=16,S=2048,D=64", "--trials", "4", "--storage", db]) == 0
    header = tmp_path / "both.h"
    assert cli.main(["export", "--study", "hop", "--study", "fc", "--storage", db, "--output", str(header)]) == 0
    capsys.readouterr()
    problem = Problem(Shape.parse("B=16,H=16,S=2048,D=64"))
    for table in (tuned.load(db), tuned.load(header)):
        rates = {r.family: r.rate for r in table.rows if r.family in ("flashcore", "hopper")}   # not test toys
        assert len(rates) == 2 and all(rates.values()), rates
        served = A.choose(problem, device=table.rows[0].device, tables=(table,))
        assert served.family == max(rates, key=rates.get), (rates, served.why)
        assert "over the" in served.why and "TFLOPS" in served.why


@pytest.mark.parametrize("source, fragment", [("", "empty source"), ("/nonexistent/t.db", "no such file")])
def test_a_tuned_source_that_cannot_be_read_is_one_clear_error(source, fragment):
    with pytest.raises(tuned.TunedError, match=fragment):
        tuned.load(source)


def test_a_bad_environment_table_names_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv(tuned.ENV_VAR, "/nonexistent/studies.db")
    try:
        A.use_tuned(None)
        with pytest.raises(tuned.TunedError, match=r"\$EVOTUNER_TUNED: tuned table"):
            A.served_tables()
        # a database URL with no database, or an empty file: the remedy points at the variable, not --storage
        (tmp_path / "empty.db").write_bytes(b"")
        for source in (f"sqlite:///{tmp_path / 'none.db'}", str(tmp_path / "empty.db")):
            monkeypatch.setenv(tuned.ENV_VAR, source)
            A.use_tuned(None)
            with pytest.raises(EvotunerError) as info:
                A.served_tables()
            assert info.value.message.startswith("$EVOTUNER_TUNED: "), info.value.message
            assert "$EVOTUNER_TUNED" in info.value.remedy and "--storage" not in info.value.remedy, info.value.remedy
    finally:
        monkeypatch.delenv(tuned.ENV_VAR)
        A.use_tuned(None)


def test_a_shipped_table_serves_its_own_size_buckets_only(replayed_db, tmp_path):
    """scripts/make_tuned_table.py writes it from studies; it reads back and serves the same
    bucket, never a nearest size (the recommended configs cover the sizes between)."""
    import subprocess
    import sys

    url, best = replayed_db
    out = tmp_path / "tuned_h100.toml"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tuned_table.py"), "--storage", url,
                           "--family", "hopper", "--device", H100, "--output", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    table = tuned.load(out)
    assert table.shipped and len(table) == 1 and table.rows[0].config == best.kernel_config
    assert table.pick(Problem(Shape.parse("B=16,H=16,S=2048,D=64")), H100) is not None
    assert table.pick(Problem(Shape.parse("B=4,H=16,S=2048,D=64")), H100) is None      # nearest: not shipped
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tuned_table.py"), "--storage", url,
                           "--family", "hopper", "--device", "NVIDIA H200", "--output", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.startswith("error: ") and "NVIDIA H200" in proc.stderr


def test_the_plan_key_covers_every_argument_that_changes_the_launch():
    """Tensors of another shape, stride, dtype or device, another causal flag, scale, config,
    layout, lse or family: another key (so another plan, resolved and validated afresh)."""
    import torch

    q = torch.empty(1, 2, 8, 64, dtype=torch.float16)
    base = A._plan_key(q, q, q, False, None, None, "bhsd", False, None)
    others = [
        A._plan_key(torch.empty(1, 2, 9, 64, dtype=torch.float16), q, q, False, None, None, "bhsd", False, None),
        A._plan_key(q.transpose(2, 3).contiguous().transpose(2, 3), q, q, False, None, None, "bhsd", False, None),
        A._plan_key(q, q.to(torch.bfloat16), q, False, None, None, "bhsd", False, None),
        A._plan_key(q, q, torch.empty(1, 1, 8, 64, dtype=torch.float16), False, None, None, "bhsd", False, None),
        A._plan_key(q, q, q, True, None, None, "bhsd", False, None),
        A._plan_key(q, q, q, False, 0.5, None, "bhsd", False, None),
        A._plan_key(q, q, q, False, None, "SCHED=1", "bhsd", False, None),
        A._plan_key(q, q, q, False, None, {"sched": 1}, "bhsd", False, None),
        A._plan_key(q, q, q, False, None, None, "bshd", False, None),
        A._plan_key(q, q, q, False, None, None, "bhsd", True, None),
        A._plan_key(q, q, q, False, None, None, "bhsd", False, "hopper"),
    ]
    assert base is not None and all(k is not None and k != base for k in others)
    assert len(set(others)) == len(others)
    # the same mapping config in another order or case is the same key
    assert A._plan_key(q, q, q, False, None, {"SCHED": 1, "STAGES": 2}, "bhsd", False, None) == \
        A._plan_key(q, q, q, False, None, {"stages": 2, "sched": 1}, "bhsd", False, None)
    # what must take the full path (and its clear errors): no key
    assert A._plan_key(q, q, q, 1, None, None, "bhsd", False, None) is None          # causal not a bool
    assert A._plan_key("q", q, q, False, None, None, "bhsd", False, None) is None    # not a tensor
    assert A._plan_key(q, q, q, False, None, {"SCHED": [1]}, "bhsd", False, None) is None


def test_another_familys_config_with_family_given_names_the_family_it_belongs_to(packaged_families):
    with pytest.raises(SpaceError) as info:
        A.choose(Problem(Shape.parse("B=1,H=8,S=512,D=64")), {"CONSUMER_WGS": 2}, family="flashcore")
    assert "unknown kernel parameter CONSUMER_WGS for the flashcore family" in info.value.message
    assert "family='hopper'" in (info.value.remedy or "")
