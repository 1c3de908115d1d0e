"""The space file: loading, every error path, expressions, constraints, fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest

from evotuner.config import KernelConfig
from evotuner.errors import SpaceError
from evotuner.problem import Problem, Shape
from evotuner.space import compile_expr, load_space, parse_space

SMALL = Path(__file__).parent / "data" / "spaces" / "small.toml"
SMALL_TEXT = SMALL.read_text()


def problem(d: int = 64, causal: bool = False) -> Problem:
    return Problem(Shape(2, 4, 1024, 1024, d), "fp16", causal)


def cfg(text: str) -> KernelConfig:
    return KernelConfig.parse(text)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.toml"
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- the default space


def test_default_space_is_packaged_and_sized_for_a_sweep():
    space = load_space()
    assert (space.name, space.kernel, space.arch) == ("flashcore", "flashcore", "sm_90a")
    assert space.names == ("BLOCK_M", "BLOCK_N", "NUM_WARPS", "STAGES", "MIN_BLOCKS")
    assert space.param("BLOCK_M").values == (64, 128, 192, 256)
    assert space.size == 144 == len(set(space.configs()))
    assert space.path.endswith("flashcore.toml")
    assert space.gate.max_spill_bytes == 0 and space.gate.device.regs_per_sm == 65536
    assert space.device.max_smem_per_block == 232448 and space.device.max_smem_per_sm == 233472


@pytest.mark.parametrize("d,config", [
    (64, "BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4,STAGES=2,MIN_BLOCKS=1"),
    (64, "BLOCK_M=128,BLOCK_N=128,NUM_WARPS=4,STAGES=2,MIN_BLOCKS=1"),
    (128, "BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4,STAGES=2,MIN_BLOCKS=1"),
])
def test_fa2_configs_are_in_the_default_space_and_feasible(d, config):
    space = load_space()
    space.validate(cfg(config))
    assert space.violated(cfg(config), problem(d)) is None


def test_default_space_prunes_but_keeps_choices_for_every_head_dim():
    space = load_space()
    for d in (32, 64, 96, 128, 256):
        feasible = list(space.feasible(problem(d)))
        assert 8 <= len(feasible) < space.size, d


def test_packaged_default_equals_the_file_read_by_path():
    packaged = load_space()
    by_path = load_space(Path(__file__).parents[1] / "search_spaces" / "flashcore.toml")
    assert packaged == by_path and packaged.fingerprint() == by_path.fingerprint()


def test_derived_values_match_the_kernel_formulas():
    space = load_space()
    d = space.derive(cfg("BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4,STAGES=2,MIN_BLOCKS=1"), problem(128))
    assert d["threads"] == 128
    assert d["smem_bytes"] == (128 + 2 * 2 * 64) * 128 * 2 == 98304
    assert d["rows_per_warp"] == 32
    assert d["reg_budget"] == 255
    d2 = space.derive(cfg("BLOCK_M=128,BLOCK_N=64,NUM_WARPS=8,STAGES=2,MIN_BLOCKS=2"), problem(128))
    assert d2["reg_budget"] == 65536 // (256 * 2) == 128


# --------------------------------------------------------------------------- constraints


def test_violated_smem_message_is_filled_with_values():
    space = load_space()
    c = space.violated(cfg("BLOCK_M=256,BLOCK_N=128,NUM_WARPS=8,STAGES=3,MIN_BLOCKS=1"), problem(128))
    assert c is not None and c.name == "smem_per_block"
    assert c.message == "smem_bytes=262144 > max_smem_per_block=232448: reduce BLOCK_M, BLOCK_N or STAGES"
    # the space keeps the template
    template = next(x for x in space.constraints if x.name == "smem_per_block")
    assert "{smem_bytes}" in template.message


def test_violated_returns_the_first_failing_constraint():
    space = load_space()
    c = space.violated(cfg("BLOCK_M=64,BLOCK_N=128,NUM_WARPS=8,STAGES=3,MIN_BLOCKS=2"), problem(256))
    assert c.name == "warp_rows"
    assert c.message.startswith("BLOCK_M=64 is not a multiple of 16 rows x NUM_WARPS=8")
    c = space.violated(cfg("BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4,STAGES=3,MIN_BLOCKS=2"), problem(128))
    assert c.name == "smem_per_sm"
    assert "x MIN_BLOCKS=2 > max_smem_per_sm=233472" in c.message


def test_constraints_depend_on_the_problem():
    space = parse_space(SMALL_TEXT, "small.toml")
    c = cfg("BLOCK_M=256,BLOCK_N=64,NUM_WARPS=4")
    assert space.violated(c, problem(64)) is None          # 49152 bytes
    v = space.violated(c, problem(256))                     # 196608 bytes
    assert v.message == "smem_bytes=196608 > max_smem_per_block=100000: reduce BLOCK_M or BLOCK_N"


# --------------------------------------------------------------------------- validate / configs


def test_validate_rejects_unknown_missing_and_out_of_domain():
    space = parse_space(SMALL_TEXT, "small.toml")
    with pytest.raises(SpaceError, match=r"unknown parameter STAGES") as e:
        space.validate(cfg("BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4,STAGES=2"))
    assert "BLOCK_M, BLOCK_N, NUM_WARPS" in str(e.value)
    with pytest.raises(SpaceError, match=r"missing parameter NUM_WARPS.*one of 4, 8"):
        space.validate(cfg("BLOCK_M=128,BLOCK_N=64"))
    with pytest.raises(SpaceError, match=r"BLOCK_M=96 is outside the space small.toml.*64, 128, 256") as e:
        space.validate(cfg("BLOCK_M=96,BLOCK_N=64,NUM_WARPS=4"))
    assert "a copy of small.toml" in str(e.value) and "--space" in str(e.value)
    with pytest.raises(SpaceError, match="outside"):
        space.violated(cfg("BLOCK_M=96,BLOCK_N=64,NUM_WARPS=4"), problem())


def test_configs_is_the_stable_cartesian_product():
    space = parse_space(SMALL_TEXT, "small.toml")
    configs = list(space.configs())
    assert len(configs) == space.size == 12 == len(set(configs))
    assert configs[0] == cfg("BLOCK_M=64,BLOCK_N=32,NUM_WARPS=4")
    assert configs[1] == cfg("BLOCK_M=64,BLOCK_N=32,NUM_WARPS=8")
    assert configs[-1] == cfg("BLOCK_M=256,BLOCK_N=64,NUM_WARPS=8")
    assert configs == list(space.configs())
    assert space.param("BLOCK_M").doc == "query rows per block"


# --------------------------------------------------------------------------- fingerprint


def test_fingerprint_ignores_comments_whitespace_and_docs_but_not_content():
    base = parse_space(SMALL_TEXT, "a.toml").fingerprint()
    cosmetic = SMALL_TEXT.replace("# A small space", "# Another comment\n\n# A small space").replace(
        'doc = "query rows per block"', 'doc = "rows of Q"').replace("NUM_WARPS * 32", "NUM_WARPS*32")
    assert parse_space(cosmetic, "b.toml").fingerprint() == base
    changed = SMALL_TEXT.replace("values = [4, 8]", "values = [4]")
    assert parse_space(changed, "a.toml").fingerprint() != base
    changed_gate = SMALL_TEXT.replace("max_stack_bytes = 0", "max_stack_bytes = 64")
    assert parse_space(changed_gate, "a.toml").fingerprint() != base
    assert len(base) == 64
    parenthesized = SMALL_TEXT.replace('"NUM_WARPS * 32"', '"(NUM_WARPS) * (32)"')
    assert parse_space(parenthesized, "a.toml").fingerprint() == base


def test_fingerprint_is_pinned_so_it_cannot_drift_between_python_versions():
    # Computed once on Python 3.11; the canonical form uses no ast.dump/unparse, so 3.10-3.13 agree.
    # If small.toml is edited on purpose, update this value.
    assert parse_space(SMALL_TEXT, "x.toml").fingerprint() == (
        "bac88cd5627753e3f9ed19d56cccfa521919eccd6e60a4ac3d30e6ba2a5a00a3")


# --------------------------------------------------------------------------- loader errors

ERROR_CASES = [
    # (id, old, new, substrings the one-line message must hold)
    ("unknown_top", "[space]", "[spaec]\nx = 1\n[space]", ["[spaec]", "unknown top-level key", "[params]"]),
    ("unknown_space_key", 'arch = "sm_90a"', 'arch = "sm_90a"\nfoo = 1', ["[space]", "unknown key 'foo'", "kernel"]),
    ("missing_kernel", 'kernel = "flashcore"\n', "", ["[space] kernel", "missing"]),
    ("unknown_param_key", "values = [32, 64]", "values = [32, 64]\nstep = 2", ["[params.BLOCK_N]", "'step'", "values"]),
    ("param_no_values", "values = [32, 64]", 'doc = "x"', ["[params.BLOCK_N] values", "missing"]),
    ("param_empty_values", "values = [32, 64]", "values = []", ["[params.BLOCK_N] values", "missing, empty"]),
    ("param_scalar_values", "values = [32, 64]", "values = 32", ["[params.BLOCK_N] values", "not a list"]),
    ("param_not_int", "values = [32, 64]", "values = [32, 64.5]", ["[params.BLOCK_N] values", "64.5", "integer"]),
    ("param_bool", "values = [32, 64]", "values = [32, true]", ["[params.BLOCK_N] values", "True", "integer"]),
    ("param_duplicate", "values = [32, 64]", "values = [32, 64, 32]", ["[params.BLOCK_N] values", "duplicate value 32"]),
    ("param_lowercase", "[params.BLOCK_N]", "[params.block_n]", ["[params.block_n]", "UPPER_SNAKE_CASE"]),
    ("param_reserved", "[params.BLOCK_N]\nvalues = [32, 64]", "[params.BLOCK_N]\nvalues = [32, 64]\n"
     "[params.HEAD_DIM]\nvalues = [64]", ["[params.HEAD_DIM]", "reserved for the problem"]),
    ("derived_unknown_name", '"NUM_WARPS * 32"', '"NUM_WARP * 32"', ["[derived] threads", "unknown name 'NUM_WARP'",
                                                                   "known names"]),
    ("derived_forward_ref", '"NUM_WARPS * 32"', '"smem_bytes // 2"', ["[derived] threads", "'smem_bytes'"]),
    ("derived_not_string", '"NUM_WARPS * 32"', "128", ["[derived] threads", "expression string"]),
    ("derived_true_div", '"NUM_WARPS * 32"', '"NUM_WARPS / 32"', ["[derived] threads", "Div", "use //"]),
    ("derived_syntax", '"NUM_WARPS * 32"', '"NUM_WARPS * "', ["[derived] threads", "cannot parse"]),
    ("constraint_no_message", 'message = "BLOCK_M={BLOCK_M} is not a multiple of 16 x NUM_WARPS={NUM_WARPS}"', "",
     ["[[constraints]] #1 message", "missing or empty"]),
    ("constraint_unknown_key", 'name = "warp_rows"', 'name = "warp_rows"\nseverity = "error"',
     ["[[constraints]] #1", "'severity'", "name, expr, message"]),
    ("constraint_bad_expr", 'expr = "smem_bytes <= max_smem_per_block"', 'expr = "smem_bytes <= max_smem"',
     ["[[constraints]] smem_per_block expr", "unknown name 'max_smem'"]),
    ("constraint_placeholder", "max_smem_per_block={max_smem_per_block}", "limit={limit}",
     ["[[constraints]] smem_per_block message", "{limit}"]),
    ("constraint_duplicate", 'name = "smem_per_block"', 'name = "warp_rows"', ["warp_rows", "duplicate"]),
    ("device_missing", "regs_per_sm = 65536\n", "", ["[device] regs_per_sm", "missing"]),
    ("device_unknown", "regs_per_sm = 65536", "regs_per_sm = 65536\nwarp_size = 32", ["[device]", "'warp_size'"]),
    ("device_not_int", "regs_per_sm = 65536", 'regs_per_sm = "64k"', ["[device] regs_per_sm", "integer"]),
    ("gate_unknown", "max_registers = 255", "max_registers = 255\nmax_smem = 1", ["[gate]", "'max_smem'"]),
    ("gate_missing", "max_registers = 255\n", "", ["[gate] max_registers", "missing"]),
    ("gate_negative", "max_spill_bytes = 0", "max_spill_bytes = -1", ["[gate] max_spill_bytes", "negative"]),
    ("malformed", "[device]", "[device", ["malformed TOML", "line"]),
]


@pytest.mark.parametrize("old,new,expected", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_loader_errors_name_the_file_and_key(tmp_path, old, new, expected):
    assert old in SMALL_TEXT
    path = write(tmp_path, SMALL_TEXT.replace(old, new, 1))
    with pytest.raises(SpaceError) as e:
        load_space(path)
    message = str(e.value)
    assert message.startswith(str(path) + ": ")
    assert "\n" not in message
    for piece in expected:
        assert piece in message, (piece, message)


def test_missing_file_is_a_space_error(tmp_path):
    with pytest.raises(SpaceError, match=r"nope\.toml: space file not found"):
        load_space(tmp_path / "nope.toml")
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(SpaceError, match=r"dir\.toml: is a folder"):
        load_space(tmp_path / "dir.toml")
    with pytest.raises(SpaceError, match=r"/dev/null: is not a regular file"):
        load_space("/dev/null")


def test_small_fixture_loads(tmp_path):
    space = load_space(write(tmp_path, SMALL_TEXT))
    assert space.name == "small" and space.size == 12 and space.text == SMALL_TEXT


# --------------------------------------------------------------------------- the expression evaluator

KNOWN = {"A": 1, "B": 1}


@pytest.mark.parametrize("source,what", [
    ("__import__('os').system('true')", "calling __import__('os').system()"),
    ("__import__('os')", "calling __import__()"),
    ("().__class__", "attribute access"),
    ("A.real", "attribute access"),
    ("(lambda: 1)()", "calling"),
    ("(lambda x: x)", "Lambda"),
    ("[1, 2][0]", "Subscript"),
    ("open('f')", "calling open()"),
    ("'text'", "constant 'text'"),
    ("1.5 * A", "constant 1.5"),
    ("True", "constant True"),
    ("A if B else 0", "IfExp"),
    ("A << 2", "operator LShift"),
    ("A in B", "comparison In"),
    ("min(A, key=B)", "keyword"),
    ("min(*A)", "starred"),
    ("[x for x in A]", "ListComp"),
    ("A := 3", "cannot parse"),
])
def test_expression_evaluator_rejects_everything_but_integer_arithmetic(source, what):
    with pytest.raises(SpaceError) as e:
        compile_expr(source, "f.toml: [derived] x", KNOWN)
    assert str(e.value).startswith("f.toml: [derived] x: ")
    assert what in str(e.value)


@pytest.mark.parametrize("source", [
    "min(3, A) + max(1, B) * abs(-3) - 7 // 2 % 3 ** 2",
    "1 < A <= B < 10",
    "A == 4 and not B != 5 or A % 2 == 1",
    "-A + +B - (A - B) * 2 ** 3",
    "max(A, B, 17) // min(A, B)",
])
@pytest.mark.parametrize("a,b", [(4, 5), (7, 3), (1, 1)])
def test_expression_evaluator_agrees_with_python(source, a, b):
    expr = compile_expr(source, "f", KNOWN)
    env = {"A": a, "B": b}
    assert expr.evaluate(env) == int(eval(source, {"__builtins__": {}, "min": min, "max": max, "abs": abs}, env))
    assert expr.names <= {"A", "B"}


def test_expression_runtime_errors_name_the_key():
    with pytest.raises(SpaceError, match=r"^f.toml: \[derived\] x: division by zero"):
        compile_expr("A // (B - 1)", "f.toml: [derived] x", KNOWN).evaluate({"A": 1, "B": 1})
    with pytest.raises(SpaceError, match="exponent 1000 outside"):
        compile_expr("A ** B", "f", KNOWN).evaluate({"A": 2, "B": 1000})
    with pytest.raises(SpaceError, match="longer than"):
        compile_expr("A + " * 200 + "A", "f", KNOWN)


def test_a_parameter_named_like_a_build_stage_macro_is_refused():
    from evotuner.space import parse_space
    from evotuner.errors import SpaceError
    text = (Path(__file__).parent.parent / "search_spaces" / "flashcore.toml").read_text()
    bad = text.replace("MIN_BLOCKS", "KERNEL_NAME")
    with pytest.raises(SpaceError, match=r"\[params.KERNEL_NAME\].*reserved for the build stage"):
        parse_space(bad, "bad.toml")


def test_the_fault_injection_space_loads():
    """tests/gpu/test_faults.py and test_diagnose.py build it: FAULT is a space parameter there
    (emitted as FLASHCORE_FAULT), so no family may reserve the name (that broke the GPU suite once)."""
    from evotuner.space import load_space

    space = load_space(Path(__file__).parent / "data" / "spaces" / "faults.toml")
    assert sorted(c["FAULT"] for c in space.configs()) == list(range(7))
