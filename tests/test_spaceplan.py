"""The fast feasibility path (evotuner/spaceplan.py) and the translated expressions
(spaceexpr._translate) against the tree-walking interpreter: the same configs in the same
order, the same violated() constraint and message on every config of the shipped spaces,
and the same errors after the same configs where an expression fails."""

from __future__ import annotations

import pickle
import random
from dataclasses import replace
from pathlib import Path

import pytest

from evotuner import spacelimits
from evotuner.errors import SpaceError
from evotuner.problem import Problem, Shape
from evotuner.space import compile_expr, load_space, parse_space
from evotuner.spaceexpr import _translate
from evotuner.spacemodel import _fill, problem_env
from evotuner.spaceplan import feasible_configs

SPACES = Path(__file__).parent.parent / "search_spaces"
DEFAULT_TEXT = (SPACES / "flashcore.toml").read_text()


def problem(d: int, dtype: str = "fp16", causal: bool = False) -> Problem:
    return Problem(Shape(2, 8, 2048, 2048, d), dtype, causal)


def reference_violated(space, config, prob):
    """SearchSpace.violated as it was: every expression walked by the interpreter."""
    space.validate(config)
    env = dict(problem_env(prob))
    env.update(space.device.as_dict())
    env.update(config.as_dict())
    for d in space.derived:
        env[d.name] = d.expr.interpret(env)
    for c in space.constraints:
        if not c.expr.interpret(env):
            return replace(c, message=_fill(c.message, env))
    return None


def reference_feasible(space, prob):
    """SearchSpace.feasible as it was."""
    return (c for c in space.configs() if reference_violated(space, c, prob) is None)


def outcome(iterable):
    """What iterating gives: the items before the first error, and that error (type, message, remedy)."""
    items = []
    try:
        for item in iterable:
            items.append(item)
    except Exception as exc:   # noqa: BLE001 -- compared, not handled
        return items, (type(exc), str(exc), getattr(exc, "remedy", None))
    return items, None


def called(fn, *args):
    """``fn(*args)`` as outcome() has it: the value, or the error."""
    def once():
        yield fn(*args)
    return outcome(once())


def base_env(space, prob):
    return {**problem_env(prob), **space.device.as_dict()}


# --------------------------------------------------------------------------- the shipped spaces


@pytest.mark.parametrize("name,problems", [
    ("hopper.toml", [problem(64, "bf16"), problem(128, "fp16", True)]),
    ("hopper_wide.toml", [problem(192, "bf16", True), problem(128)]),
    ("hopper_split.toml", [problem(128), problem(64, "bf16", True)]),
    ("flashcore.toml", [problem(d, dt, c) for d in (32, 64, 96, 128, 256) for dt in ("fp16", "bf16")
                      for c in (False, True)]),
])
def test_feasible_and_violated_equal_the_interpreter_on_every_config(name, problems):
    space = load_space(SPACES / name)
    for prob in problems:
        expected = []
        for config in space.configs():
            want = reference_violated(space, config, prob)
            assert space.violated(config, prob) == want
            if want is None:
                expected.append(config)
            else:
                assert space.violated(config, prob).message == want.message
        assert feasible_configs(space, base_env(space, prob)) is not None   # the tables, not the fallback
        assert list(space.feasible(prob)) == expected
        keep = set(expected)
        assert [space.admits(c, prob) for c in space.configs()] == [c in keep for c in space.configs()]


def test_the_shipped_spaces_have_feasible_configs_and_prune_some():
    """The comparison above is not vacuous: each space keeps some configs and rejects others."""
    for name, prob in (("hopper.toml", problem(128)), ("hopper_wide.toml", problem(256)), ("flashcore.toml", problem(64))):
        space = load_space(SPACES / name)
        n = len(list(space.feasible(prob)))
        assert 0 < n < space.size, name


# --------------------------------------------------------------------------- failure paths


def variant(tmp_path: Path, *, derived: str = "", constraint: str = "", first: str = "") -> object:
    """flashcore.toml with a derived line appended, and a constraint appended (or put first)."""
    text = DEFAULT_TEXT
    if derived:
        name, _, source = derived.partition(" = ")
        text = text.replace('reg_budget = "', f'{name} = "{source}"\nreg_budget = "', 1)
    block = ""
    if constraint:
        block = f'\n[[constraints]]\nname = "extra"\nexpr = "{constraint}"\nmessage = "extra failed at BLOCK_M={{BLOCK_M}}"\n'
    if first:
        text = text.replace("\n[[constraints]]\n", f'\n[[constraints]]\nname = "first"\nexpr = "{first}"\n'
                                                   f'message = "first failed"\n\n[[constraints]]\n', 1)
    text = text.replace("\n[device]", block + "\n[device]", 1)
    path = tmp_path / "variant.toml"
    path.write_text(text)
    return load_space(path)


FAILURES = [
    # a derived division by zero at BLOCK_N == 64 (the configs before it are yielded first)
    dict(derived='zero = 64 // (BLOCK_N - 64)'),
    # a modulo by zero in a constraint only some configs reach (after warp_rows passed)
    dict(constraint="BLOCK_M % (MIN_BLOCKS * 2 - 4 + NUM_WARPS // 4 * 2) == 0"),
    # over the bit limit by multiplication at BLOCK_M == 256 (the last quarter of the space)
    dict(derived='huge = (BLOCK_M // 128) * 2 ** 255'),
    # a power's exponent out of range at BLOCK_N == 128, and a power over the bit limit at STAGES == 3
    dict(derived='pw = 2 ** (BLOCK_N - 30)'),
    dict(derived='pw = (STAGES * 1024) ** 27'),
    # a problem-only term that divides by zero at D=64 only
    dict(derived='d64 = 1 // (HEAD_DIM - 64)'),
    # a name with no value (a build-stage macro) in a constraint
    dict(constraint="KERNEL_NAME > 0"),
    # a constraint that raises where an earlier constraint always fails first: never reached, no error
    dict(constraint="BLOCK_M // (BLOCK_M - 64) >= 0", first="BLOCK_M != 64"),
    # the first constraint false everywhere: nothing feasible, the raising one never reached
    dict(constraint="1 // 0 > 0", first="HEAD_DIM < 0"),
]


@pytest.mark.parametrize("change", FAILURES, ids=lambda c: next(iter(c.values())))
@pytest.mark.parametrize("d", [64, 128])
def test_failing_expressions_fail_the_same_after_the_same_configs(tmp_path, change, d):
    space = variant(tmp_path, **change)
    prob = problem(d)
    want = outcome(reference_feasible(space, prob))
    got = outcome(space.feasible(prob))
    assert got == want
    for config in space.configs():
        assert called(space.violated, config, prob) == called(reference_violated, space, config, prob)


def test_the_failure_cases_do_fail_and_yield_before_failing(tmp_path):
    """The cases above cover an error at the first config, one after some feasible configs, and none."""
    seen = set()
    for change in FAILURES:
        items, error = outcome(reference_feasible(variant(tmp_path, **change), problem(64)))
        seen.add((bool(items), error is not None))
    assert {(False, True), (True, True), (True, False), (False, False)} <= seen


def test_a_lower_bit_limit_applies_to_the_translated_expressions(monkeypatch):
    expr = compile_expr("A * B", "f.toml: [derived] x", {"A": 0, "B": 0})
    assert expr.evaluate({"A": 1 << 20, "B": 1 << 20}) == 1 << 40
    monkeypatch.setattr(spacelimits, "MAX_BITS", 32)
    with pytest.raises(SpaceError, match=r"^f.toml: \[derived\] x: a value exceeds 32 bits"):
        expr.evaluate({"A": 1 << 20, "B": 1 << 20})
    with pytest.raises(SpaceError, match="exceeds 32 bits"):
        expr.interpret({"A": 1 << 20, "B": 1 << 20})


def test_a_space_pickles_after_its_expressions_ran():
    space = load_space(SPACES / "flashcore.toml")
    prob = problem(64)
    before = list(space.feasible(prob))
    copy = pickle.loads(pickle.dumps(space))
    assert copy == space and list(copy.feasible(prob)) == before


# --------------------------------------------------------------------------- expressions


NAMES = ("A", "B", "C")
CONSTANTS = ("0", "1", "2", "3", "7", "64", str(2 ** 200), str(2 ** 255))


def random_expr(rng: random.Random, depth: int) -> str:
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(NAMES + CONSTANTS)
    kind = rng.randrange(7)
    sub = lambda: random_expr(rng, depth - 1)   # noqa: E731
    if kind == 0:
        return f"({sub()} {rng.choice(['+', '-', '*', '//', '%', '**'])} {sub()})"
    if kind == 1:
        return f"({sub()} {rng.choice(['<', '<=', '>', '>=', '==', '!='])} {sub()}" + \
            (f" {rng.choice(['<', '==', '!='])} {sub()})" if rng.random() < 0.4 else ")")
    if kind == 2:
        return f"({sub()} {rng.choice(['and', 'or'])} {sub()}" + (f" and {sub()})" if rng.random() < 0.3 else ")")
    if kind == 3:
        return f"({rng.choice(['not ', '-', '+'])}{sub()})"
    if kind == 4:
        return f"{rng.choice(['min', 'max'])}({', '.join(sub() for _ in range(rng.randrange(2, 4)))})"
    if kind == 5:
        return f"abs({sub()})"
    return f"({sub()} ** {rng.choice(['0', '1', '2', '3', '63', '64', '65', '-1', 'A'])})"


ENVS = [dict(zip(NAMES, v)) for v in
        [(0, 1, 2), (1, 0, -1), (3, 7, 64), (-5, 2, 0), (2 ** 100, -(2 ** 130), 3), (255, 256, 2 ** 255), (2, 1, 1)]]


def translated_outcome(expr, env):
    """The translated function alone (no interpreter fallback): its value or its SpaceError."""
    try:
        return int(_translate(expr._tree, expr._where)(env)), None
    except SpaceError as exc:
        return None, (str(exc), exc.remedy)


def interpreted_outcome(expr, env):
    try:
        return expr.interpret(env), None
    except SpaceError as exc:
        return None, (str(exc), exc.remedy)


def test_translated_expressions_equal_the_interpreter_on_random_expressions():
    rng = random.Random(20240607)
    known = {n: 0 for n in NAMES}
    checked = errors = 0
    for _ in range(1500):
        source = random_expr(rng, rng.randrange(1, 6))
        try:
            expr = compile_expr(source, "f.toml: [derived] x", known)
        except SpaceError:
            continue    # over the length limit
        for env in ENVS:
            want = interpreted_outcome(expr, env)
            assert translated_outcome(expr, env) == want, (source, env)
            assert interpreted_outcome_via_evaluate(expr, env) == want, (source, env)
            checked += 1
            errors += want[1] is not None
    assert checked > 5000 and 0.05 < errors / checked < 0.8   # both values and errors were compared


def interpreted_outcome_via_evaluate(expr, env):
    try:
        return expr.evaluate(env), None
    except SpaceError as exc:
        return None, (str(exc), exc.remedy)


def deepest(make) -> str:
    """The source ``make(n)`` of the largest n the depth limit admits."""
    n = 1
    while True:
        try:
            compile_expr(make(n + 1), "f", {"A": 0, "B": 0})
        except SpaceError as exc:
            assert "nested deeper" in str(exc)
            return make(n)
        n += 1


@pytest.mark.parametrize("make", [
    lambda n: "A + (" * n + "B" + ")" * n,
    lambda n: "A // (" * n + "B" + ")" * n,
    lambda n: "-" * n + "A",
    lambda n: "min(" * n + "A" + ", B)" * n,
    lambda n: "(" * n + "A" + " ** 1)" * n,
])
def test_the_deepest_admitted_expressions_translate(make):
    source = deepest(make)
    expr = compile_expr(source, "f", {"A": 0, "B": 0})
    for env in ({"A": 3, "B": 2}, {"A": 1, "B": 0}, {"A": 2 ** 250, "B": 1}):
        assert translated_outcome(expr, env) == interpreted_outcome(expr, env)


def test_a_name_without_a_value_is_the_interpreters_error():
    expr = compile_expr("A + KERNEL_NAME", "f.toml: [[constraints]] c expr", {"A": 0, "KERNEL_NAME": 0})
    with pytest.raises(SpaceError) as e:
        expr.evaluate({"A": 1})
    assert str(e.value) == "f.toml: [[constraints]] c expr: name 'KERNEL_NAME' has no value here"


def test_the_translation_has_no_builtins_and_reads_names_only_from_env():
    expr = compile_expr("max(A, 1)", "f", {"A": 0})
    fn = _translate(expr._tree, expr._where)
    assert fn.__globals__["__builtins__"] == {}
    assert set(fn.__code__.co_names) <= {"_min", "_max", "_abs", "_pow", "_bits", "_divzero"}
    assert fn.__code__.co_varnames[0] == "env"
    assert fn({"A": 5}) == 5


def test_a_space_whose_tables_would_be_too_large_takes_the_per_config_path(tmp_path, monkeypatch):
    from evotuner import spaceplan

    space = variant(tmp_path, derived="every = BLOCK_M + BLOCK_N + NUM_WARPS + STAGES + MIN_BLOCKS",
                    constraint="every % 3 != 0")
    prob = problem(64)
    want = list(reference_feasible(space, prob))
    assert feasible_configs(space, base_env(space, prob)) is not None
    assert list(space.feasible(prob)) == want
    monkeypatch.setattr(spaceplan, "MAX_TABLE_ENTRIES", space.size)   # two tables of the whole space do not fit
    assert feasible_configs(space, base_env(space, prob)) is None
    assert list(space.feasible(prob)) == want
