"""Which family `evotuner search` tunes and `evotuner compile` builds when no space file is
named: the family evotuner.flash_attention runs for the problem (search), the family whose
parameters the config names (compile), the study's own space (an existing study), the space
a replayed sweep was recorded with; --family NAME and --space NAME pick one by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from evotuner import cli, session
from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError
from evotuner.problem import Problem, Shape
from cli_helpers import assert_one_line_error, run

DATA = Path(__file__).parent / "data"
HOPPER_SWEEP = DATA / "sweep_h100_hopper_d64.csv"
SHAPE = "B=16,H=16,S=2048,D=64"


@pytest.fixture(autouse=True)
def env(monkeypatch, tmp_path):
    monkeypatch.delenv(cli.STORAGE_ENV, raising=False)
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


def test_a_space_folder_named_without_a_suffix_is_said_to_be_a_folder(capsys, tmp_path):
    """--space DIR used to say 'no such file and no packaged space of that name'."""
    (tmp_path / "spaces").mkdir()
    code, out, err = run(capsys, "compile", "--config", "BLOCK_M=64", "--shape", "D=64", "--space", "spaces")
    assert_one_line_error(code, out, err, "spaces: is a folder")
    assert "no such file" not in err
    (tmp_path / "hopper").mkdir()                    # a folder does not hide the packaged space of its name
    assert session.pick_space("hopper")[0].name == "hopper"


def test_without_a_space_search_picks_the_family_flash_attention_runs():
    space, note = session.pick_space(problem=Problem(Shape.parse(SHAPE)))
    assert space.kernel == "hopper" and "hopper family" in note and "--family or --space" in note


@pytest.mark.parametrize("given, kernel", [("hopper", "hopper"), ("hopper_grid", "hopper"),
                                           ("flashcore", "flashcore"), ("default", "flashcore")])
def test_a_packaged_space_is_addressed_by_name(given, kernel):
    space, note = session.pick_space(given)
    assert space.kernel == kernel and note is None
    assert session.pick_space(family=kernel)[0].kernel == kernel


def test_an_unknown_space_name_lists_the_packaged_ones():
    with pytest.raises(EvotunerError) as info:
        session.pick_space("hoper")
    assert "no packaged space" in info.value.message and "hopper_grid" in (info.value.remedy or "")
    with pytest.raises(EvotunerError, match="tunes the hopper family, not --family flashcore"):
        session.pick_space("hopper", family="flashcore")


def test_replayed_hopper_search_without_space_says_which_space_and_shows_a_hopper_table(capsys, tmp_path):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    code, out, err = run(capsys, "search", "--study", "x", "--shape", SHAPE, "--trials", 4, "--replay", HOPPER_SWEEP,
                         "--storage", db, "--no-transfer")
    assert code == 0, err
    flat = " ".join(out.split())                          # the note wraps at the terminal's width
    assert "space hopper_grid: the packaged space sweep_h100_hopper_d64.csv was recorded with" in flat
    assert "CW = CONSUMER_WGS" in out                     # the hopper family's table
    # running it again without --space continues the study with its own space
    code, out, err = run(capsys, "search", "--study", "x", "--shape", SHAPE, "--trials", 6, "--replay", HOPPER_SWEEP,
                         "--storage", db, "--no-transfer")
    assert code == 0, err


def test_a_replayed_flashcore_study_started_before_keeps_its_space_without_space(capsys, tmp_path):
    """A study made with the FlashCore space (the old default) is continued with that space
    when --space is left out, not refused for the family flash_attention would pick."""
    db = f"sqlite:///{tmp_path / 'f.db'}"
    sweep = DATA / "replay" / "synthetic_d64.csv"
    code, out, err = run(capsys, "search", "--study", "f", "--shape", SHAPE, "--trials", 3, "--replay", sweep,
                         "--storage", db, "--space", "flashcore")
    assert code == 0, err
    code, out, err = run(capsys, "search", "--study", "f", "--shape", SHAPE, "--trials", 5, "--replay", sweep,
                         "--storage", db)
    assert code == 0, err


def test_compile_without_space_builds_the_family_its_config_names(capsys):
    hopper = "BLOCK_N=128,CONSUMER_WGS=3,STAGES=2,REG_PROD=32,REG_CONS=160,OVERLAP=1,PINGPONG=1,SCHED=2," \
             "RESCALE_LOG2=0,EXP_EMU=0"
    code, out, err = run(capsys, "compile", "--config", hopper, "--shape", "D=64", "--json")
    assert code == 0, err
    # a split-KV config (hopper_split.toml's parameters) at a small grouped-query problem
    code, out, err = run(capsys, "compile", "--config", hopper.replace("SCHED=2", "SCHED=0") + ",SPLITS=4,PACK_GQA=1",
                         "--shape", "H=8,HKV=2,D=64", "--json")
    assert code == 0, err
    # packing where there is nothing to pack is refused, naming the constraint
    code, out, err = run(capsys, "compile", "--config", hopper.replace("SCHED=2", "SCHED=0") + ",SPLITS=4,PACK_GQA=1",
                         "--shape", "D=64")
    assert_one_line_error(code, out, err, "breaks constraint pack_gqa", "KV_GROUP=1")
    code, out, err = run(capsys, "compile", "--config", "NUM_WARPS=4,CONSUMER_WGS=2", "--shape", "D=64")
    assert_one_line_error(code, out, err, "no kernel family takes all of", "CONSUMER_WGS", "NUM_WARPS")


HOPPER_D64 = "BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,RESCALE_LOG2=8"


@pytest.mark.parametrize("config, shape, space, fragments", [
    # a value outside every space: the space listing most of that parameter's values (0, 1, 2), not the
    # problem's hopper_split.toml (0 only), though --shape D=64 alone is a small problem
    (HOPPER_D64 + ",SCHED=3,EXP_EMU=0", "D=64", "hopper.toml", ("SCHED=3", "allowed values of SCHED: 0, 1, 2")),
    (HOPPER_D64 + ",SCHED=9,EXP_EMU=0", "D=64", "hopper.toml", ("SCHED=9", "copy of hopper.toml")),
    # hopper_d96.toml lists EXP_EMU=4 but refuses D=64 itself: not picked (no "D=96" in the error)
    (HOPPER_D64 + ",SCHED=1,EXP_EMU=4", "D=64", "hopper.toml", ("EXP_EMU=4", "allowed values of EXP_EMU: 0")),
    ("SCHED=3", "D=64", "hopper.toml", ("missing parameter BLOCK_N",)),
    ("CLUSTER=2", "D=64", "hopper.toml", ("missing parameter BLOCK_N",)),
    ("EXP_EMU=4", "D=64", "hopper.toml", ("missing parameter BLOCK_N",)),
    ("SPLITS=4", "D=64", "hopper_split.toml", ("missing parameter BLOCK_N",)),
    (HOPPER_D64 + ",SCHED=1,EXP_EMU=0,SPLITS=4", "D=64", "hopper_split.toml", ("SCHED=1", "allowed values of SCHED: 0;")),
    (HOPPER_D64 + ",SCHED=3,EXP_EMU=0", "D=96", "hopper_d96.toml", ("SCHED=3",)),
    ("SCHED=3", "D=256", "hopper_wide.toml", ("missing parameter BLOCK_N",)),
])
def test_compile_names_the_space_that_fits_the_problem_and_lists_most_values(capsys, config, shape, space, fragments):
    code, out, err = run(capsys, "compile", "--config", config, "--shape", shape)
    assert_one_line_error(code, out, err, f"search_spaces/{space}", *fragments)
    assert "D=96" not in err or shape == "D=96"


def test_compile_picks_the_space_a_valid_config_fits_at_its_head_dim():
    for config, shape, name in [(HOPPER_D64 + ",SCHED=1,EXP_EMU=0", "D=64", "hopper"),
                                (HOPPER_D64 + ",SCHED=0,EXP_EMU=0,SPLITS=4", "D=64", "hopper_split"),
                                (HOPPER_D64 + ",SCHED=1,EXP_EMU=4", "D=96", "hopper_d96"),
                                (HOPPER_D64 + ",SCHED=1,EXP_EMU=4", "D=256", "hopper_wide")]:
        space = session.space_for_config(KernelConfig.parse(config), Problem(Shape.parse(shape, require=("D",))))
        assert space.name == name, (config, shape, space.name)


def test_the_space_option_names_every_packaged_space():
    from evotuner.cli_options import PACKAGED_SPACES
    from evotuner.family.base import packaged

    named = {name.strip(" ,") for name in PACKAGED_SPACES.replace("(also named default)", "default").split()}
    files = {path.stem for path in packaged("evotuner.search_spaces").glob("*.toml")}
    assert named == files | {"default"} and named <= set(session.packaged_spaces())


HOPPER_CONFIG = "BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,SCHED=0," \
                "RESCALE_LOG2=8,EXP_EMU=0"


@pytest.mark.parametrize("space, name", [(None, "hopper"), (Path("hopper"), "hopper"),
                                         (Path("hopper_grid"), "hopper_grid")])
def test_check_and_profile_take_a_config_of_either_family_and_a_space_by_name(space, name):
    """check/profile --config without --study: the config's own family (as compile), or
    --space as a file or a packaged space's name."""
    from evotuner.cli_diagnostics import _select

    sel = _select(None, None, 3, HOPPER_CONFIG, SHAPE, "fp16", False, space)
    assert sel.space.kernel == "hopper" and sel.space.name == name
    fc = _select(None, None, 3, "BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4,STAGES=2,MIN_BLOCKS=1", SHAPE, "fp16", False, None)
    assert fc.space.kernel == "flashcore"


def test_check_refuses_a_space_other_than_the_studys(capsys, tmp_path):
    from evotuner.cli_diagnostics import _select
    from evotuner.errors import StudyMismatchError

    db = f"sqlite:///{tmp_path / 'c.db'}"
    code, out, err = run(capsys, "search", "--study", "x", "--shape", SHAPE, "--trials", 2, "--replay", HOPPER_SWEEP,
                         "--storage", db, "--no-transfer")
    assert code == 0, err
    assert _select(db, "x", 1, None, None, "fp16", False, Path("hopper_grid")).space.name == "hopper_grid"
    with pytest.raises(StudyMismatchError, match="another search space than --space hopper"):
        _select(db, "x", 1, None, None, "fp16", False, Path("hopper"))
