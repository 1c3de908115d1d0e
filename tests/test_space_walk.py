"""A hostile kernel engineer's walk of custom space files: broken or adversarial TOML run
through the loader (evotuner.space.load_space) and `evotuner compile --space`. Each test
is a misbehaviour the walk found (a traceback, a file accepted that cannot run, a message
without a remedy or a false one); the loader's other refusals are in tests/test_space.py
and tests/test_hardening*.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, run
from evotuner.errors import SpaceError
from evotuner.problem import Problem, Shape
from evotuner.space import load_space
from test_hardening_walk import cli_env  # noqa: F401 -- the same fixture

REPO = Path(__file__).resolve().parents[1]
TINY = (REPO / "tests" / "data" / "loop_tiny.toml").read_text()
HOPPER = (REPO / "search_spaces" / "hopper.toml").read_text()
TINY_CONFIG = "BLOCK_M=128,BLOCK_N=32,NUM_WARPS=4,STAGES=1,MIN_BLOCKS=1"
D64 = Problem(Shape.parse("B=1,H=8,S=128,D=64"))


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _with_derived(text: str, lines: str) -> str:
    return text.replace("[derived]\n", "[derived]\n" + lines, 1)


def _with_constraint(text: str, expr: str, message: str = "walk") -> str:
    return text + f'\n[[constraints]]\nname = "walk"\nexpr = "{expr}"\nmessage = "{message}"\n'


def _loop(folder: Path) -> Path:
    """a.toml -> b.toml -> a.toml: a symbolic link loop."""
    os.symlink(folder / "b.toml", folder / "a.toml")
    os.symlink(folder / "a.toml", folder / "b.toml")
    return folder / "a.toml"


# -- files that are not space files --------------------------------------------------------

def test_a_symlink_loop_as_the_space_is_named_as_such(tmp_path):
    with pytest.raises(SpaceError) as e:
        load_space(_loop(tmp_path))
    assert "symbolic link" in e.value.message and "not found" not in e.value.message


def test_a_base_that_is_a_symlink_loop_is_one_line_not_a_runtime_error(tmp_path, capsys, cli_env):
    _loop(tmp_path)
    sub = _write(tmp_path, "sub.toml", '[space]\nname = "s"\nbase = "a.toml"\n')
    with pytest.raises(SpaceError, match=r"\[space\] base: a\.toml is a symbolic link"):
        load_space(sub)
    code, out, err = run(capsys, "compile", "--space", sub, "--config", TINY_CONFIG, "--shape", "D=64")
    assert_one_line_error(code, out, err, "[space] base", "symbolic link")
    assert "unexpected" not in err


def test_a_base_that_is_a_folder_is_not_called_missing(tmp_path):
    (tmp_path / "dir.toml").mkdir()
    sub = _write(tmp_path, "sub.toml", '[space]\nname = "s"\nbase = "dir.toml"\n')
    with pytest.raises(SpaceError, match="is not a regular file"):
        load_space(sub)


def test_a_byte_order_mark_is_read_past(tmp_path):
    plain = load_space(_write(tmp_path, "plain.toml", TINY))
    marked = load_space(_write(tmp_path, "bom.toml", "\ufeff" + TINY))
    assert marked.fingerprint() == plain.fingerprint()


def test_a_file_larger_than_any_space_is_refused_before_it_is_read(tmp_path, monkeypatch):
    import evotuner.spacefile as spacefile

    big = _write(tmp_path, "big.toml", TINY + "#" * 100 + "\n")
    sub = _write(tmp_path, "sub.toml", '[space]\nname = "s"\nbase = "big.toml"\n')
    monkeypatch.setattr(spacefile, "MAX_SPACE_BYTES", len(TINY) + 10)
    with pytest.raises(SpaceError, match=r"\[space\] base: .*big\.toml: \d+ bytes, more than"):
        load_space(sub)
    monkeypatch.setattr(Path, "read_text", lambda *a, **k: pytest.fail("read a file over the limit"))
    with pytest.raises(SpaceError, match="big.toml: \\d+ bytes, more than") as e:
        load_space(big)
    assert e.value.remedy


def test_a_1_mb_line_still_loads(tmp_path):
    space = load_space(_write(tmp_path, "long.toml", TINY + "# " + "x" * (1 << 20) + "\n"))
    assert space.size == 8


# -- names ----------------------------------------------------------------------------------

def test_a_build_stage_macro_as_a_placeholder_is_refused_not_a_key_error(tmp_path, capsys, cli_env):
    path = _write(tmp_path, "ph.toml", _with_constraint(TINY, "BLOCK_M < 128", "{ABI_VERSION}"))
    with pytest.raises(SpaceError, match=r"unknown placeholder \{ABI_VERSION\}") as e:
        load_space(path)
    assert "ABI_VERSION" not in e.value.remedy and "BLOCK_M" in e.value.remedy
    code, out, err = run(capsys, "compile", "--space", path, "--config", TINY_CONFIG, "--shape", "D=64")
    assert_one_line_error(code, out, err, "unknown placeholder {ABI_VERSION}")


def test_a_parameter_named_varlen_is_refused(tmp_path):
    text = HOPPER.replace("\n[derived]\n", "\n[params.VARLEN]\nvalues = [0, 1]\n\n[derived]\n", 1)
    text = text.replace("values = [1, 2, 3, 4]", "values = [1, 2]", 1)   # STAGES: stay under the size limit
    with pytest.raises(SpaceError, match=r"\[params\.VARLEN\]: the name VARLEN is reserved for the build stage"):
        load_space(_write(tmp_path, "varlen.toml", text))


@pytest.mark.parametrize("lines, fragment", [
    ('a = "a + 1"\n', "'a' refers to itself"),
    ('a = "b + 1"\nb = "a + 1"\n', "'b' is defined below it in [derived]"),
    ('a = "threads * 2"\n', "'threads' is defined below it in [derived]"),
])
def test_a_derived_cycle_or_forward_reference_says_so(tmp_path, lines, fragment):
    with pytest.raises(SpaceError) as e:
        load_space(_write(tmp_path, "cycle.toml", _with_derived(TINY, lines)))
    assert fragment in e.value.message and "unknown name" not in e.value.message
    assert e.value.remedy


@pytest.mark.parametrize("name", ["True", "None", "if", "lambda"])
def test_a_derived_name_no_expression_can_name_is_refused(tmp_path, name):
    with pytest.raises(SpaceError, match="is a Python keyword"):
        load_space(_write(tmp_path, "kw.toml", _with_derived(TINY, f'{name} = "1"\n')))


# -- every refusal has a remedy ------------------------------------------------------------

@pytest.mark.parametrize("old, new", [
    ("reg_alloc_unit = 8", "reg_alloc_unit = 0"),
    ("regs_per_sm = 65536", "regs_per_sm = 65536.0"),
    ("max_spill_bytes = 0", "max_spill_bytes = -1"),
    ("[params.STAGES]\n", "[params.STAGES]\ndoc = 5\n"),
    ('arch = "sm_90a"', 'arch = "sm_90a"\ndoc = 5'),
])
def test_a_malformed_value_is_refused_with_a_remedy(tmp_path, old, new):
    assert old in TINY
    with pytest.raises(SpaceError) as e:
        load_space(_write(tmp_path, "bad.toml", TINY.replace(old, new, 1)))
    assert e.value.remedy, str(e.value)


def test_a_table_given_as_a_value_is_refused_with_a_remedy(tmp_path):
    text = "device = 5\n" + TINY[:TINY.index("[device]")] + TINY[TINY.index("[gate]"):]
    with pytest.raises(SpaceError, match="device: must be a table, got int") as e:
        load_space(_write(tmp_path, "table.toml", text))
    assert e.value.remedy


def test_a_multi_line_message_is_refused_with_a_remedy(tmp_path):
    text = TINY + '\n[[constraints]]\nname = "m"\nexpr = "1"\nmessage = """one\ntwo"""\n'
    with pytest.raises(SpaceError, match="must be one line") as e:
        load_space(_write(tmp_path, "ml.toml", text))
    assert e.value.remedy


@pytest.mark.parametrize("expr", ["2 ** 10 ** 10", "BLOCK_M ** -1", "2 ** 256"])
def test_an_exponent_out_of_range_is_one_line_with_a_remedy(tmp_path, capsys, cli_env, expr):
    path = _write(tmp_path, "pow.toml", _with_constraint(TINY, f"{expr} > 0"))
    code, out, err = run(capsys, "compile", "--space", path, "--config", TINY_CONFIG, "--shape", "D=64")
    assert_one_line_error(code, out, err, "outside 0..64")
    assert re.search(r"outside 0\.\.64 \(.+\)$", err.strip()), err


# -- a space that admits nothing -----------------------------------------------------------

def test_a_space_refusing_every_config_says_which_constraint(tmp_path):
    space = load_space(_write(tmp_path, "none.toml", _with_constraint(TINY, "BLOCK_M > 1000", "BLOCK_M={BLOCK_M}")))
    assert list(space.feasible(D64)) == []
    with pytest.raises(SpaceError) as e:
        space.check_feasible(D64)
    assert "none of the 8 configs passes" in e.value.message and "breaks walk: BLOCK_M=64" in e.value.message
    assert e.value.remedy


def test_a_space_refusing_the_problem_itself_says_so(tmp_path):
    space = load_space(_write(tmp_path, "d32.toml", _with_constraint(TINY, "HEAD_DIM == 32", "D={HEAD_DIM}")))
    assert space.refused_problem(D64).message == "D=64"
    with pytest.raises(SpaceError, match="constraint walk refuses the problem .*D=64") as e:
        space.check_feasible(D64)
    assert "space" in e.value.remedy


@pytest.mark.parametrize("name, d", [("flashcore", 64), ("hopper", 128), ("hopper_d96", 96)])
def test_the_packaged_spaces_admit_their_problems(name, d):
    problem = Problem(Shape.parse(f"B=1,H=8,S=128,D={d}"))
    space = load_space(REPO / "search_spaces" / f"{name}.toml")
    space.check_feasible(problem)
    assert space.refused_problem(problem) is None


def test_compile_against_a_space_that_refuses_the_problem_names_no_values_to_pick(tmp_path, capsys, cli_env):
    path = _write(tmp_path, "d32.toml", _with_constraint(TINY, "HEAD_DIM == 32", "D={HEAD_DIM}"))
    code, out, err = run(capsys, "compile", "--space", path, "--config", TINY_CONFIG, "--shape", "D=64")
    assert_one_line_error(code, out, err, "breaks constraint walk: D=64")
    assert "no config of this space runs this problem" in err and "pick values" not in err


def test_a_study_of_a_space_that_proposes_nothing_is_never_made(tmp_path):
    from evotuner import session
    from evotuner.storage import StudyStore

    space = load_space(_write(tmp_path, "none.toml", _with_constraint(TINY, "BLOCK_M > 1000", "BLOCK_M={BLOCK_M}")))
    with StudyStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        with pytest.raises(SpaceError, match="none of the 8 configs passes"):
            session.start_study(store, "s", D64, space, "random", 0, None)
        assert not store.study_exists("s")


def test_an_empty_space_name_is_not_taken_for_the_current_folder():
    from evotuner import session
    from evotuner.errors import EvotunerError

    with pytest.raises(EvotunerError, match="--space '': no such file and no packaged space"):
        session.pick_space("")


def test_compile_varlen_at_a_head_dim_only_flashcore_takes_does_not_send_the_user_to_flashcore(capsys, cli_env):
    """FlashCore has no packed kernel: its D=32 is for dense batches only (the hint said "FlashCore: D=32")."""
    config = ("BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=0,SCHED=0,"
              "RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=1,CLUSTER=1,PACK_GQA=0,TILE_OVERLAP=0,Q_IN_REGS=0")
    code, out, err = run(capsys, "compile", "--varlen", "--shape", "D=32", "--config", config)
    assert_one_line_error(code, out, err, "HEAD_DIM=32")
    assert "FlashCore: D=32, dense batches only" in err
