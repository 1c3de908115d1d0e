"""The search space model: a frozen :class:`SearchSpace` (its parameters, derived values,
constraints, device limits and gate thresholds) and its queries (configs, feasibility,
derived values, the violated constraint, the fingerprint). Read from a file by
:func:`evotuner.space.load_space`."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from typing import Iterator, Mapping

from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError, SpaceError
from evotuner.problem import Problem
from evotuner.spaceexpr import Expr, canonical_expr
from evotuner.spaceplan import feasible_configs

#: Names the problem contributes to every expression.
PROBLEM_NAMES = ("HEAD_DIM", "DTYPE_BYTES", "IS_CAUSAL", "IS_VARLEN", "KV_GROUP")
#: fp16 and bf16 are both two bytes wide.
_DTYPE_BYTES = {"fp16": 2, "bf16": 2}

PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True)
class Param:
    """One tunable parameter: its name and its allowed values, ascending."""

    name: str
    values: tuple[int, ...]
    doc: str = field(default="", compare=False)

    def index(self, value: int) -> int:
        return self.values.index(value)



@dataclass(frozen=True)
class Derived:
    name: str
    expr: Expr


@dataclass(frozen=True)
class Constraint:
    """A static check. ``expr`` must hold for a config to be compiled.

    In ``SearchSpace.constraints`` ``message`` is the file's template (``{NAME}``
    placeholders); the Constraint returned by ``SearchSpace.violated`` carries
    the message with the values filled in.
    """

    name: str
    expr: Expr
    message: str


@dataclass(frozen=True)
class DeviceLimits:
    """Per-arch hardware limits (``[device]``); H100 values in the packaged space files."""

    max_smem_per_block: int        # opt-in dynamic + static shared memory per block
    max_smem_per_sm: int
    smem_reserved_per_block: int   # the driver reserves this much per resident block
    regs_per_sm: int
    reg_alloc_unit: int            # registers per thread are allocated in multiples of this
    max_regs_per_thread: int
    max_threads_per_block: int
    max_threads_per_sm: int

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in DEVICE_KEYS}


DEVICE_KEYS = tuple(DeviceLimits.__dataclass_fields__)


@dataclass(frozen=True)
class GateThresholds:
    """``[gate]``: what a ptxas report may show for a config to be measured.

    ``device`` is the space's ``[device]`` table: the gate also checks the
    post-compile register and shared-memory budgets against it.
    """

    max_spill_bytes: int
    max_stack_bytes: int
    max_registers: int
    device: DeviceLimits


GATE_KEYS = ("max_spill_bytes", "max_stack_bytes", "max_registers")


@dataclass(frozen=True)
class SearchSpace:
    name: str
    kernel: str
    arch: str
    params: tuple[Param, ...]
    derived: tuple[Derived, ...]
    constraints: tuple[Constraint, ...]
    device: DeviceLimits
    gate: GateThresholds
    path: str = field(compare=False)
    text: str = field(compare=False, repr=False)
    doc: str = field(default="", compare=False)

    # -- queries ------------------------------------------------------------------

    @property
    def size(self) -> int:
        n = 1
        for p in self.params:
            n *= len(p.values)
        return n

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise SpaceError(
            f"{self.path}: unknown parameter {name!r}",
            f"the space defines {', '.join(self.names)}",
        )

    def configs(self) -> Iterator[KernelConfig]:
        """Every point of the space: the cartesian product, parameters in file order,
        values ascending (the last parameter varies fastest)."""
        names = self.names
        for combo in itertools.product(*(p.values for p in self.params)):
            yield KernelConfig.of(dict(zip(names, combo)))

    def feasible(self, problem: Problem) -> Iterator[KernelConfig]:
        """The configs no static constraint rejects for ``problem``, in :meth:`configs` order:
        those for which :meth:`violated` is None. Each expression is evaluated once per
        combination of its own parameters' values (:mod:`evotuner.spaceplan`); where one
        raises at some combination (or the tables would be too large), every config is
        checked in turn by :meth:`violated`, which raises that error after the configs before it."""
        try:
            base: dict[str, int] | None = {**problem_env(problem), **self.device.as_dict()}
        except Exception:
            base = None
        configs = feasible_configs(self, base) if base is not None else None
        if configs is None:
            return (c for c in self.configs() if self.violated(c, problem) is None)
        return configs

    def _other_family(self, config: KernelConfig) -> str | None:
        """The remedy for a config of another kernel family (its parameters, not this space's):
        the option that names that family's space on the command line and in Python."""
        from evotuner.defaults import config_family

        try:
            family = config_family(config).name
        except EvotunerError:
            return None
        if family == self.kernel:
            return None
        return (f"a {family} config: pass --space {family} on the command line, family=\"{family}\" "
                f"from Python (this space is the {self.kernel} family's: {', '.join(self.names)})")

    def complete(self, config: KernelConfig) -> KernelConfig:
        """``config`` with the family's defaults (``KernelFamily.optional_params``) for the
        parameters this space defines and it leaves out: a config written before a knob
        existed (a recommended config, a tuned table's row, an exported one) means the
        kernel's default there, which is what its build compiles."""
        given = config.as_dict()
        missing = [p.name for p in self.params if p.name not in given]
        if not missing:
            return config
        from evotuner.family import get_family

        try:
            defaults = get_family(self.kernel).optional_params
        except EvotunerError:
            return config
        filled = {name: defaults[name] for name in missing if name in defaults}
        return KernelConfig.of({**given, **filled}) if filled else config

    def validate(self, config: KernelConfig) -> None:
        """Raise SpaceError unless ``config`` sets exactly the space's parameters to allowed values
        (after :meth:`complete`: a parameter it leaves out may be one with a family default)."""
        given = self.complete(config).as_dict()
        unknown = sorted(set(given) - set(self.names))
        if unknown:
            raise SpaceError(
                f"config: unknown parameter {unknown[0]} (space {self.path})",
                self._other_family(config) or f"the space defines {', '.join(self.names)}",
            )
        for p in self.params:
            if p.name not in given:
                raise SpaceError(
                    f"config: missing parameter {p.name} (space {self.path})",
                    f"set {p.name} to one of {_join(p.values)}",
                )
            if given[p.name] not in p.values:
                raise SpaceError(
                    f"config: {p.name}={given[p.name]} is outside the space {self.path}",
                    f"allowed values of {p.name}: {_join(p.values)}; to try another, list it in a copy of "
                    f"{PurePath(self.path).name} and pass that file as the space (--space)",
                )

    def environment(self, config: KernelConfig, problem: Problem) -> dict[str, int]:
        """Every name an expression may use, evaluated for ``config`` and ``problem``."""
        config = self.complete(config)
        self.validate(config)
        env: dict[str, int] = dict(problem_env(problem))
        env.update(self.device.as_dict())
        env.update(config.as_dict())
        for d in self.derived:
            env[d.name] = d.expr.evaluate(env)
        return env

    def derive(self, config: KernelConfig, problem: Problem) -> dict[str, int]:
        """The ``[derived]`` values for ``config`` and ``problem``, in file order."""
        env = self.environment(config, problem)
        return {d.name: env[d.name] for d in self.derived}

    def admits(self, config: KernelConfig, problem: Problem) -> bool:
        """True when ``config`` is a config of this space that no static constraint rejects at ``problem``."""
        try:
            self.validate(config)
        except SpaceError:
            return False
        return self.violated(config, problem) is None

    def violated(self, config: KernelConfig, problem: Problem) -> Constraint | None:
        """The first static constraint ``config`` breaks for ``problem`` (message filled in), or None."""
        env = self.environment(config, problem)
        for c in self.constraints:
            if not c.expr.evaluate(env):
                return replace(c, message=_fill(c.message, env))
        return None

    def refused_problem(self, problem: Problem) -> Constraint | None:
        """The first constraint that names no parameter (nor a [derived] name computed from one)
        and is false at ``problem``, message filled in: then no config of the space runs it."""
        varies = set(self.names)
        for d in self.derived:
            if d.expr.names & varies:
                varies.add(d.name)
        fixed = [c for c in self.constraints if not c.expr.names & varies]
        env = self.environment(next(self.configs()), problem) if fixed else {}
        return next((replace(c, message=_fill(c.message, env)) for c in fixed if not c.expr.evaluate(env)), None)

    def check_feasible(self, problem: Problem) -> None:
        """Raise SpaceError when no config passes the constraints at ``problem`` (a search would
        propose nothing), naming the constraint that refuses the problem itself, else the one
        the first config breaks."""
        if next(iter(self.feasible(problem)), None) is not None:
            return
        refused = self.refused_problem(problem)
        if refused is not None:
            raise SpaceError(f"{self.path}: constraint {refused.name} refuses the problem {problem}: {refused.message}",
                             "no config of this space can run it: tune it with a space that takes it (--space), "
                             "or tune another problem")
        first = next(self.configs())
        broken = self.violated(first, problem)
        assert broken is not None    # feasible() is exactly the configs violated() passes
        raise SpaceError(f"{self.path}: none of the {self.size} configs passes the [[constraints]] at {problem} "
                         f"(the first, {first}, breaks {broken.name}: {broken.message})",
                         "list parameter values the constraints allow, or relax the [[constraints]]")

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of everything that decides which configs are
        proposed, compiled and gated: kernel, arch, params, derived, constraint
        expressions, device limits and gate thresholds. Comments, whitespace, docs,
        the space's name and constraint messages do not change it."""
        canonical = {
            "kernel": self.kernel,
            "arch": self.arch,
            "params": [[p.name, list(p.values)] for p in self.params],
            "derived": [[d.name, canonical_expr(d.expr)] for d in self.derived],
            "constraints": [[c.name, canonical_expr(c.expr)] for c in self.constraints],
            "device": self.device.as_dict(),
            "gate": {k: getattr(self.gate, k) for k in GATE_KEYS},
        }
        blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()



def problem_env(problem: Problem) -> dict[str, int]:
    return {
        "HEAD_DIM": problem.shape.head_dim,
        "DTYPE_BYTES": _DTYPE_BYTES[problem.dtype],
        "IS_CAUSAL": int(problem.causal),
        "IS_VARLEN": int(problem.varlen),
        "KV_GROUP": problem.shape.heads // problem.shape.heads_kv,
    }


def _fill(template: str, env: Mapping[str, int]) -> str:
    return PLACEHOLDER.sub(lambda m: str(env[m.group(1)]), template)


def _join(values: tuple[int, ...]) -> str:
    return ", ".join(map(str, values))


