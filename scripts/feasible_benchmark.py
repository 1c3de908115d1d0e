"""Time ``SearchSpace.feasible(problem)`` on the hopper space and on a 6x larger variant of it.

The variant adds a parameter ``SPLITS`` (values 1..32) and the constraint
``SPLITS == 1 or SCHED == 0`` to a temporary copy of hopper.toml (497,664 configs, more than
:data:`evotuner.spacelimits.MAX_CONFIGS`, which is raised to ``1 << 20`` for this script only).

Prints, per space and problem, the configs, the feasible configs and the best of
``--repeat`` wall and CPU (this process's) times of ``list(space.feasible(problem))`` (a fresh load each time, so
nothing cached by an earlier run helps), and, unless ``--no-reference``, the same for the
per-config reference path ``[c for c in space.configs() if space.violated(c, problem) is None]``
evaluated by the tree-walking interpreter (the enumeration before the feasibility plan), and
the CPU time of that per-config path with the translated expressions (what ``feasible()``
falls back to where an expression raises); the speedup is feasible()'s over the
interpreter's CPU time, which other processes on the machine disturb less than wall times::

    python scripts/feasible_benchmark.py [--repeat 3] [--no-reference]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotuner import spacelimits  # noqa: E402
from evotuner.problem import Problem, Shape  # noqa: E402
from evotuner.space import load_space  # noqa: E402
from evotuner.scriptargs import ArgumentParser, positive  # noqa: E402

SPLITS = """
[params.SPLITS]
values = [1, 2, 4, 8, 16, 32]
doc = "split-K factor (benchmark variant)"
"""
SPLIT_SCHED = """
[[constraints]]
name = "split_sched"
expr = "SPLITS == 1 or SCHED == 0"
message = "SPLITS={SPLITS} needs SCHED=0 (got SCHED={SCHED})"
"""


def wide_variant(directory: Path) -> Path:
    """hopper.toml with SPLITS and split_sched added (6x the configs)."""
    text = (ROOT / "search_spaces" / "hopper.toml").read_text(encoding="utf-8")
    text = text.replace("\n[derived]\n", SPLITS + "\n[derived]\n", 1)
    text = text.replace("\n# H100 SXM (sm_90): as flashcore.toml.\n", SPLIT_SCHED + "\n# H100 SXM (sm_90): as flashcore.toml.\n", 1)
    assert "SPLITS" in text and "split_sched" in text, "hopper.toml changed shape: update the variant"
    path = directory / "hopper_splits.toml"
    path.write_text(text, encoding="utf-8")
    return path


def reference(space, problem) -> list:
    """The per-config path, every expression walked by the interpreter."""
    from evotuner.spacemodel import problem_env

    interpret = getattr(type(space.constraints[0].expr), "interpret", None)

    def value(expr, env):
        return interpret(expr, env) if interpret is not None else expr.evaluate(env)

    out = []
    for config in space.configs():
        space.validate(config)
        env = dict(problem_env(problem))
        env.update(space.device.as_dict())
        env.update(config.as_dict())
        for d in space.derived:
            env[d.name] = value(d.expr, env)
        if all(value(c.expr, env) for c in space.constraints):
            out.append(config)
    return out


def best_of(repeat: int, fn) -> tuple[float, float, object]:
    """The least wall and CPU seconds (this process) of ``repeat`` calls, and the last result."""
    wall, cpu, result = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return min(wall), min(cpu), result


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=positive, default=3, help="timed calls per space and problem (default 3)")
    ap.add_argument("--no-reference", action="store_true", help="skip the per-config interpreter path")
    args = ap.parse_args(argv)
    problems = [Problem(Shape(1, 16, 4096, 4096, 64), "bf16", False), Problem(Shape(1, 16, 4096, 4096, 128), "fp16", True)]
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(spacelimits, "MAX_CONFIGS", 1 << 20):
        spaces = [ROOT / "search_spaces" / "hopper.toml", wide_variant(Path(tmp))]
        print(f"{'space':<20} {'D':>4} {'causal':>6} {'configs':>8} {'feasible':>8} {'feasible() s':>13} "
              f"{'(cpu s)':>8} {'reference s':>12} {'(cpu s)':>8} {'speedup':>8} {'per-config cpu s':>17}")
        for path in spaces:
            for problem in problems:
                fast, fast_cpu, configs = best_of(args.repeat, lambda: list(load_space(path).feasible(problem)))
                space = load_space(path)
                line = (f"{path.name:<20} {problem.shape.head_dim:>4} {str(problem.causal):>6} {space.size:>8} "
                        f"{len(configs):>8} {fast:>13.3f} {fast_cpu:>8.3f}")
                if not args.no_reference:
                    slow, slow_cpu, expected = best_of(1, lambda: reference(space, problem))
                    assert expected == configs, "feasible() differs from the per-config reference"
                    line += f" {slow:>12.3f} {slow_cpu:>8.3f} {slow_cpu / fast_cpu:>7.1f}x"
                    _, per_config_cpu, fallback = best_of(1, lambda: [
                        c for c in space.configs() if space.violated(c, problem) is None])
                    assert fallback == configs, "the per-config path differs"
                    line += f" {per_config_cpu:>17.3f}"
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
