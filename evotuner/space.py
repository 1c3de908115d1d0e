"""The search space: a declarative TOML file read into a frozen SearchSpace.

The file format is documented at the top of ``search_spaces/default.toml``.
In short: ``[space]`` names the kernel family and arch, ``[params.NAME]``
lists each tunable integer's values, ``[derived]`` defines integer
expressions, ``[[constraints]]`` are static checks made before anything is
compiled, ``[device]`` holds the arch's limits and ``[gate]`` the ptxas
thresholds used after compiling (see :mod:`evotuner.gate`).

Expressions are evaluated by a small interpreter over Python's AST that
accepts integers, names, ``+ - * // % **``, comparisons, ``and or not`` and
calls to ``min``, ``max`` and ``abs`` -- nothing else (no attributes, no
subscripts, no lambdas, no ``/``). Every name is checked when the file is
loaded, so a typo is reported with the file and key, not at trial 137.

Names an expression may use:

* every parameter (the space's ``[params.NAME]``);
* the problem: ``HEAD_DIM``, ``DTYPE_BYTES`` (2 for fp16 and bf16),
  ``IS_CAUSAL`` (0 or 1);
* every ``[device]`` limit by its key (``max_smem_per_block``, ...);
* every ``[derived]`` name defined *above* the one being defined.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
import re
import sys
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from evotuner.config import PARAM_NAME, KernelConfig
from evotuner.errors import EvotunerError, SpaceError
from evotuner.family import get_family
from evotuner.spacelimits import MAX_PARAM_VALUE, check_bits, check_depth, check_pow, check_size, first_duplicate
from evotuner.problem import Problem

if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # pragma: no cover - Python 3.10 only
    try:
        import tomli as _toml
    except ImportError:  # pragma: no cover
        _toml = None

#: Names the problem contributes to every expression.
PROBLEM_NAMES = ("HEAD_DIM", "DTYPE_BYTES", "IS_CAUSAL")
#: fp16 and bf16 are both two bytes wide.
_DTYPE_BYTES = {"fp16": 2, "bf16": 2}

_TOP_KEYS = ("space", "params", "derived", "constraints", "device", "gate")
_SPACE_KEYS = {"name": str, "kernel": str, "arch": str, "doc": str, "base": str}
#: Tables a space file with ``[space] base = ...`` (a sub-grid of that space) may set.
_NARROWING_KEYS = ("space", "params")
_PARAM_KEYS = ("values", "doc")
_CONSTRAINT_KEYS = ("name", "expr", "message")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")     # \Z, not $: "$" matches before a final newline
_ARCH = re.compile(r"^sm_\d{2,3}[af]?\Z")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_MAX_EXPR_CHARS = 400
_MAX_POW_EXPONENT = 64
#: Values of one parameter; more is a generated list, not a kernel knob (and the space's
#: product of sizes is what the loop walks).
_MAX_PARAM_VALUES = 4096


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Param:
    """One tunable parameter: its name and its allowed values, ascending."""

    name: str
    values: tuple[int, ...]
    doc: str = field(default="", compare=False)

    def index(self, value: int) -> int:
        return self.values.index(value)


@dataclass(frozen=True)
class Expr:
    """An integer expression checked at load time; ``source`` is what the file says."""

    source: str
    names: frozenset[str] = field(compare=False)
    _tree: ast.Expression = field(compare=False, repr=False)
    _where: str = field(compare=False, repr=False)

    def evaluate(self, env: Mapping[str, int]) -> int:
        value = _Evaluator(env, self._where).visit(self._tree.body)
        return int(value)


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
    """Per-arch hardware limits (``[device]``); H100 values in default.toml."""

    max_smem_per_block: int        # opt-in dynamic + static shared memory per block
    max_smem_per_sm: int
    smem_reserved_per_block: int   # the driver reserves this much per resident block
    regs_per_sm: int
    reg_alloc_unit: int            # registers per thread are allocated in multiples of this
    max_regs_per_thread: int
    max_threads_per_block: int
    max_threads_per_sm: int

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in _DEVICE_KEYS}


_DEVICE_KEYS = tuple(DeviceLimits.__dataclass_fields__)


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


_GATE_KEYS = ("max_spill_bytes", "max_stack_bytes", "max_registers")


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
        """The configs no static constraint rejects for ``problem``."""
        return (c for c in self.configs() if self.violated(c, problem) is None)

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

    def validate(self, config: KernelConfig) -> None:
        """Raise SpaceError unless ``config`` sets exactly the space's parameters to allowed values."""
        given = config.as_dict()
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
                    f"allowed values of {p.name}: {_join(p.values)}",
                )

    def environment(self, config: KernelConfig, problem: Problem) -> dict[str, int]:
        """Every name an expression may use, evaluated for ``config`` and ``problem``."""
        self.validate(config)
        env: dict[str, int] = dict(_problem_env(problem))
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

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of everything that decides which configs are
        proposed, compiled and gated: kernel, arch, params, derived, constraint
        expressions, device limits and gate thresholds. Comments, whitespace, docs,
        the space's name and constraint messages do not change it."""
        canonical = {
            "kernel": self.kernel,
            "arch": self.arch,
            "params": [[p.name, list(p.values)] for p in self.params],
            "derived": [[d.name, _canonical_expr(d.expr)] for d in self.derived],
            "constraints": [[c.name, _canonical_expr(c.expr)] for c in self.constraints],
            "device": self.device.as_dict(),
            "gate": {k: getattr(self.gate, k) for k in _GATE_KEYS},
        }
        blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def _canonical_expr(expr: Expr) -> str:
    """A prefix form of the checked tree, independent of spacing, redundant
    parentheses and the Python version's ``ast.dump`` format."""
    return _canonical(expr._tree.body)


def _canonical(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.BinOp):
        return f"({type(node.op).__name__} {_canonical(node.left)} {_canonical(node.right)})"
    if isinstance(node, ast.UnaryOp):
        return f"({type(node.op).__name__} {_canonical(node.operand)})"
    if isinstance(node, ast.BoolOp):
        return f"({type(node.op).__name__} {' '.join(_canonical(v) for v in node.values)})"
    if isinstance(node, ast.Compare):
        parts = [_canonical(node.left)]
        for op, right in zip(node.ops, node.comparators):
            parts += [type(op).__name__, _canonical(right)]
        return f"(Compare {' '.join(parts)})"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return f"({node.func.id} {' '.join(_canonical(a) for a in node.args)})"
    raise AssertionError(f"unchecked node {type(node).__name__}")  # compile_expr admits nothing else


def _problem_env(problem: Problem) -> dict[str, int]:
    return {
        "HEAD_DIM": problem.shape.head_dim,
        "DTYPE_BYTES": _DTYPE_BYTES[problem.dtype],
        "IS_CAUSAL": int(problem.causal),
    }


def _fill(template: str, env: Mapping[str, int]) -> str:
    return _PLACEHOLDER.sub(lambda m: str(env[m.group(1)]), template)


def _join(values: tuple[int, ...]) -> str:
    return ", ".join(map(str, values))


# --------------------------------------------------------------------------- loading


def load_space(path: str | Path | None = None, *, family: str | None = None) -> SearchSpace:
    """Read and check a space file; None reads ``family``'s default space file
    (:meth:`KernelFamily.default_space`), or the packaged ``default.toml``."""
    if path is None and family is not None:
        path = get_family(family).default_space()
    if path is None:
        resource = resources.files("evotuner.search_spaces") / "default.toml"
        where = str(resource)
        try:
            text = resource.read_text(encoding="utf-8")
        except OSError as exc:  # pragma: no cover - a broken install
            raise SpaceError(f"{where}: cannot read the packaged default space: {exc.strerror}",
                             "reinstall evotuner") from None
    else:
        where = str(path)
        p = Path(path)
        if not p.is_file():
            raise SpaceError(f"{where}: space file not found",
                             "pass an existing .toml file, or omit --space for the packaged default")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SpaceError(f"{where}: cannot read the space file: {exc}") from None
        data = _parse_toml(text, where)
        if isinstance(data.get("space"), dict) and "base" in data["space"]:
            data, files = _narrow(data, text, p)
            return _Loader(where).load(data, stack_text(files))
    return parse_space(text, where)


#: The text a study stores for a sub-grid space holds every file of the stack (the sub-grid's
#: own, then its base's, ...) out of band: one JSON object of this format, whose file texts
#: are kept byte for byte. No TOML file can be a JSON object (TOML has no top-level ``{``), so
#: nothing a user writes in a space file, comments included, can be taken for the framing.
STACK_FORMAT = "evotuner-space-stack/1"
#: The line that joined a sub-grid's text to its base's before STACK_FORMAT (``text +
#: BASE_MARK + base name + "\n" + base text``); still read from studies stored then.
BASE_MARK = "\n# ---- base: "
#: Bases deeper than this are refused (a cycle of files naming each other).
_MAX_BASE_DEPTH = 4


def stack_text(files: list[tuple[str, str]]) -> str:
    """The stored text of a sub-grid: ``files`` = [(file name, file text), ...], the sub-grid first."""
    return json.dumps({"format": STACK_FORMAT, "files": [{"name": n, "text": t} for n, t in files]},
                      indent=1, ensure_ascii=False) + "\n"


def _narrow(data: dict[str, Any], text: str, path: Path, depth: int = 0) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A sub-grid space file (``[space] base = "other.toml"``): the base file's tables with
    the ``[params.NAME] values`` this file narrows (:func:`_merge`), and the files of the stack
    (this one, its base, the base's base ...) as :func:`stack_text` stores them, which
    :func:`parse_space` reads back without the files."""
    where = str(path)
    base_name = _base_name(data, where)
    base_path = (path.parent / base_name).resolve()
    if depth > _MAX_BASE_DEPTH:
        raise SpaceError(f"{where}: [space] base: more than {_MAX_BASE_DEPTH} bases deep (a cycle?)",
                         "point base at a full space file")
    if not base_path.is_file():
        raise SpaceError(f"{where}: [space] base: {base_path} not found", "name a space file beside this one")
    try:
        base_text = base_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpaceError(f"{where}: [space] base: cannot read {base_path} as UTF-8 text ({exc})",
                         "point base at a space file (TOML text)") from None
    base = _parse_toml(base_text, str(base_path))
    files = [(base_path.name, base_text)]
    if isinstance(base.get("space"), dict) and "base" in base["space"]:
        base, files = _narrow(base, base_text, base_path, depth + 1)
    return _merge(data, base, where, base_path.name), [(path.name, text), *files]


def _base_name(data: dict[str, Any], where: str) -> str:
    for k in data:
        if k not in _NARROWING_KEYS:
            raise SpaceError(f"{where}: [{k}]: a sub-grid space (with [space] base) takes its [{k}] from the base",
                             "set only [space] name/doc/base and [params.NAME] values here")
    base_name = data["space"]["base"]
    if not isinstance(base_name, str) or not base_name:
        raise SpaceError(f"{where}: [space] base: must be a space file name", 'e.g. base = "hopper.toml"')
    return base_name


def _merge(data: dict[str, Any], base: dict[str, Any], where: str, base_name: str) -> dict[str, Any]:
    """The sub-grid ``data`` applied to its base's tables. It may set only [space] (name, doc)
    and [params]; every value it lists must be one of the base's, so each config of the sub-grid
    is a config of the base space (same kernel, derived values, constraints, device, gate)
    and studies, sweeps and exports of either can be compared config for config (the
    caller checked the keys it sets: :func:`_base_name`)."""
    space = data["space"]
    merged = dict(base)
    merged_space = dict(merged.get("space") or {})
    for k in ("kernel", "arch"):
        if k in space and space[k] != merged_space.get(k):
            raise SpaceError(f"{where}: [space] {k}: {space[k]!r} differs from the base's {merged_space.get(k)!r}",
                             f"drop {k} here: a sub-grid runs its base's kernel")
    merged_space.update({k: v for k, v in space.items() if k != "base"})
    merged["space"] = merged_space
    params = dict(merged.get("params") or {})
    for name, body in (data.get("params") or {}).items():
        key = f"[params.{name}]"
        if name not in params:
            raise SpaceError(f"{where}: {key}: the base {base_name} has no parameter {name}",
                             f"narrow one of {', '.join(params)}")
        values = body.get("values") if isinstance(body, dict) else None
        allowed = params[name].get("values", [])
        if not isinstance(values, list) or not values:
            raise SpaceError(f"{where}: {key} values: missing, empty or not a list", "list a subset of the base's values")
        extra = [v for v in values if v not in allowed]
        if extra:
            raise SpaceError(f"{where}: {key} values: {extra} not among the base's {allowed}",
                             "a sub-grid may only drop values of its base")
        params[name] = {**params[name], **body}
    merged["params"] = params
    return merged


def _is_subgrid(data: dict[str, Any]) -> bool:
    return isinstance(data.get("space"), dict) and "base" in data["space"]


def _stored(text: str, where: str) -> dict[str, Any] | None:
    """The merged tables of a sub-grid's stored text (:data:`STACK_FORMAT`, or the older
    :data:`BASE_MARK` form); None if ``text`` is neither (a plain space file's text)."""
    if text.lstrip().startswith("{"):
        return _stored_stack(text, where)
    return _stored_marked(text, where)


def _stored_stack(text: str, where: str) -> dict[str, Any]:
    damaged = SpaceError(f"{where}: the stored sub-grid text is damaged (not a {STACK_FORMAT} object)",
                         "restore the database from a copy, or start a new study from the space files")
    try:
        doc = json.loads(text)
    except ValueError:
        raise damaged from None
    files = doc.get("files") if isinstance(doc, dict) and doc.get("format") == STACK_FORMAT else None
    if not (isinstance(files, list) and 2 <= len(files) <= _MAX_BASE_DEPTH + 2
            and all(isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("text"), str)
                    for f in files)):
        raise damaged
    merged = _parse_toml(files[-1]["text"], f"{where} ({files[-1]['name']})")
    if _is_subgrid(merged):
        raise damaged
    for sub, base in zip(reversed(files[:-1]), reversed(files[1:])):
        sub_where = f"{where} ({sub['name']})"
        data = _parse_toml(sub["text"], sub_where)
        if not (_is_subgrid(data) and data["space"]["base"] == base["name"]):
            raise damaged
        _base_name(data, sub_where)
        merged = _merge(data, merged, sub_where, base["name"])
    return merged


def _stored_marked(text: str, where: str, depth: int = 0) -> dict[str, Any] | None:
    """A sub-grid's text as studies stored it before :data:`STACK_FORMAT`: its file's text,
    BASE_MARK, its base's name and text. A comment line in a space file may read like the
    mark, so every place it occurs is tried in turn and the first split that reads back as a
    sub-grid and its base is taken."""
    if depth > _MAX_BASE_DEPTH:
        return None
    start = 0
    first_error: SpaceError | None = None
    while (at := text.find(BASE_MARK, start)) >= 0:
        start = at + 1
        head, rest = text[:at], text[at + len(BASE_MARK):]
        base_name, _, base_text = rest.partition("\n")
        try:
            data = _parse_toml(head, where)
            if not (_is_subgrid(data) and data["space"]["base"] == base_name):
                continue
            _base_name(data, where)
            base = _stored_marked(base_text, where, depth + 1)
            if base is None:
                base = _parse_toml(base_text, where)
                if _is_subgrid(base):
                    continue
            return _merge(data, base, where, base_name)
        except SpaceError as exc:
            first_error = first_error or exc
    if first_error is not None:
        try:                               # a plain space file whose comment read like the mark
            whole = _parse_toml(text, where)
        except SpaceError:
            whole = None
        if whole is None or _is_subgrid(whole):
            raise first_error
    return None


def _parse_toml(text: str, where: str) -> dict[str, Any]:
    if _toml is None:  # pragma: no cover - Python 3.10 without tomli
        raise SpaceError(f"{where}: reading TOML on Python 3.10 needs the tomli package", "pip install tomli")
    try:
        return _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise SpaceError(f"{where}: malformed TOML: {exc}", "fix the line it names") from None


def parse_space(text: str, where: str = "<string>") -> SearchSpace:
    """Parse space-file ``text``, or the text a study stored for a sub-grid space (every file
    of the stack, :data:`STACK_FORMAT`, or the older :data:`BASE_MARK` form: :func:`load_space`);
    ``where`` names it in error messages."""
    merged = _stored(text, where)          # a sub-grid's text as a study stores it, with its base's
    if merged is not None:
        return _Loader(where).load(merged, text)
    data = _parse_toml(text, where)
    if isinstance(data.get("space"), dict) and "base" in data["space"]:
        raise SpaceError(f"{where}: [space] base: a sub-grid space must be read from its file",
                         "load_space(path), so the base file beside it can be found")
    return _Loader(where).load(data, text)


class _Loader:
    def __init__(self, where: str) -> None:
        self.where = where

    def error(self, key: str, what: str, remedy: str | None = None) -> SpaceError:
        return SpaceError(f"{self.where}: {key}: {what}", remedy)

    def table(self, data: Mapping[str, Any], key: str, required: bool = True) -> dict[str, Any]:
        value = data.get(key)
        if value is None:
            if required:
                raise self.error(f"[{key}]", "missing table", f"add a [{key}] table (see the packaged default.toml)")
            return {}
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table, got {type(value).__name__}")
        return value

    def only(self, table: Mapping[str, Any], key: str, allowed: tuple[str, ...] | Mapping[str, Any]) -> None:
        for k in table:
            if k not in allowed:
                raise self.error(f"{key}", f"unknown key {k!r}", f"allowed keys: {', '.join(allowed)}")

    def integer(self, value: Any, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be an integer, got {value!r}")
        return value

    def load(self, data: dict[str, Any], text: str) -> SearchSpace:
        for k in data:
            if k not in _TOP_KEYS:
                raise self.error(f"[{k}]", "unknown top-level key",
                                 f"allowed tables: {', '.join('[' + t + ']' for t in _TOP_KEYS)}")
        space = self.table(data, "space")
        self.only(space, "[space]", _SPACE_KEYS)
        for k in ("name", "kernel", "arch"):
            if not isinstance(space.get(k), str) or not space[k]:
                raise self.error(f"[space] {k}", "missing or not a non-empty string",
                                 'e.g. name = "default", kernel = "flashcore", arch = "sm_90a"')
        if not space["name"].isprintable():
            raise self.error("[space] name", f"{space['name']!r} holds a newline or another control character",
                             "give the space a one-line name")
        if not _ARCH.match(space["arch"]):
            raise self.error("[space] arch", f"{space['arch']!r} is not an SM target", 'e.g. arch = "sm_90a"')
        if not _IDENT.match(space["kernel"]):
            raise self.error("[space] kernel", f"{space['kernel']!r} is not a kernel family folder name",
                             "use the folder's name under kernels/, e.g. flashcore")
        doc = space.get("doc", "")
        if not isinstance(doc, str):
            raise self.error("[space] doc", "must be a string")

        params = self.params(self.table(data, "params"))
        device = self.device(self.table(data, "device"))
        gate = self.gate(self.table(data, "gate"), device)

        known: dict[str, str] = {n: "problem" for n in PROBLEM_NAMES}
        for k in _DEVICE_KEYS:
            known[k] = "device"
        try:
            family = get_family(space["kernel"])
        except SpaceError as exc:
            raise self.error("[space] kernel", exc.message, exc.remedy) from None
        for k in family.reserved():   # <PREFIX>_<NAME> macros the build stage sets itself
            known.setdefault(k, "build stage")
        for p in params:
            if p.name in known:
                raise self.error(f"[params.{p.name}]", f"the name {p.name} is reserved for the {known[p.name]}",
                                 "rename the parameter")
            known[p.name] = "param"

        derived: list[Derived] = []
        for name, src in self.table(data, "derived", required=False).items():
            key = f"[derived] {name}"
            if not _IDENT.match(name):
                raise self.error(key, "is not an identifier", "use letters, digits and _")
            if name in known:
                raise self.error(key, f"the name {name} is already a {known[name]} name", "rename it")
            if not isinstance(src, str):
                raise self.error(key, f"must be an expression string, got {src!r}", 'e.g. threads = "WARPS * 32"')
            derived.append(Derived(name, self.expr(src, key, known)))
            known[name] = "derived"

        raw_constraints = data.get("constraints", [])
        if not isinstance(raw_constraints, list):
            raise self.error("constraints", "must be an array of tables", "write each one as [[constraints]]")
        constraints: list[Constraint] = []
        seen: set[str] = set()
        for i, c in enumerate(raw_constraints, 1):
            label = f"[[constraints]] #{i}"
            if not isinstance(c, dict):
                raise self.error(label, "must be a table", "write each one as [[constraints]]")
            self.only(c, label, _CONSTRAINT_KEYS)
            for k in _CONSTRAINT_KEYS:
                if not isinstance(c.get(k), str) or not c[k].strip():
                    raise self.error(f"{label} {k}", "missing or empty",
                                     "every constraint needs name, expr and message strings")
            label = f"[[constraints]] {c['name']}"
            if c["name"] in seen:
                raise self.error(label, "duplicate constraint name", "give each constraint its own name")
            seen.add(c["name"])
            expr = self.expr(c["expr"], f"{label} expr", known)
            message = c["message"].strip()
            if "\n" in message:
                raise self.error(f"{label} message", "must be one line")
            for m in _PLACEHOLDER.finditer(message):
                if m.group(1) not in known:
                    raise self.error(f"{label} message", f"unknown placeholder {{{m.group(1)}}}",
                                     f"placeholders are {{NAME}} with NAME one of {', '.join(known)}")
            constraints.append(Constraint(c["name"], expr, message))

        return SearchSpace(
            name=space["name"], kernel=space["kernel"], arch=space["arch"], params=tuple(params),
            derived=tuple(derived), constraints=tuple(constraints), device=device, gate=gate,
            path=self.where, text=text, doc=doc,
        )

    def params(self, table: dict[str, Any]) -> list[Param]:
        if not table:
            raise self.error("[params]", "no parameters", "add at least one [params.NAME] table with values = [...]")
        out: list[Param] = []
        for name, body in table.items():
            key = f"[params.{name}]"
            if not PARAM_NAME.match(name):
                raise self.error(key, "parameter names are UPPER_SNAKE_CASE",
                                 "they become the family's C macro <PREFIX>_<NAME>, e.g. TILE_M")
            if not isinstance(body, dict):
                raise self.error(key, "must be a table", f"write [params.{name}] then values = [...]")
            self.only(body, key, _PARAM_KEYS)
            values = body.get("values")
            if not isinstance(values, list) or not values:
                raise self.error(f"{key} values", "missing, empty or not a list",
                                 "list the integers to try, e.g. values = [64, 128]")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int):
                    raise self.error(f"{key} values", f"{v!r} is not an integer", "values are integers")
            if len(values) > _MAX_PARAM_VALUES:
                raise self.error(f"{key} values", f"{len(values)} values, more than {_MAX_PARAM_VALUES}",
                                 "a parameter is one template argument of the kernel; list the few worth compiling")
            dupes = first_duplicate(values)
            if dupes is not None:
                raise self.error(f"{key} values", f"duplicate value {dupes}", "list each value once")
            doc = body.get("doc", "")
            if not isinstance(doc, str):
                raise self.error(f"{key} doc", "must be a string")
            big = next((v for v in values if abs(v) > MAX_PARAM_VALUE), None)
            if big is not None:
                raise self.error(f"{key} values", f"{big} does not fit a C int (|value| <= {MAX_PARAM_VALUE})",
                                 "values become the kernel's int template arguments")
            out.append(Param(name, tuple(sorted(values)), doc))
        check_size([(p.name, len(p.values)) for p in out], self.where)
        return out

    def device(self, table: dict[str, Any]) -> DeviceLimits:
        self.only(table, "[device]", _DEVICE_KEYS)
        for k in _DEVICE_KEYS:
            if k not in table:
                raise self.error(f"[device] {k}", "missing", f"[device] needs all of {', '.join(_DEVICE_KEYS)}")
            if self.integer(table[k], f"[device] {k}") <= 0:
                raise self.error(f"[device] {k}", f"must be positive, got {table[k]}")
        return DeviceLimits(**{k: table[k] for k in _DEVICE_KEYS})

    def gate(self, table: dict[str, Any], device: DeviceLimits) -> GateThresholds:
        self.only(table, "[gate]", _GATE_KEYS)
        for k in _GATE_KEYS:
            if k not in table:
                raise self.error(f"[gate] {k}", "missing", f"[gate] needs all of {', '.join(_GATE_KEYS)}")
            if self.integer(table[k], f"[gate] {k}") < 0:
                raise self.error(f"[gate] {k}", f"must not be negative, got {table[k]}")
        return GateThresholds(device=device, **{k: table[k] for k in _GATE_KEYS})

    def expr(self, source: str, key: str, known: Mapping[str, str]) -> Expr:
        return compile_expr(source, f"{self.where}: {key}", known)


# --------------------------------------------------------------------------- expressions

_BINOPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a ** b,
}
_CMPOPS: dict[type, Callable[[int, int], bool]] = {
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
}
_FUNCS: dict[str, Callable[..., int]] = {"min": min, "max": max, "abs": abs}
#: How many arguments each function takes (min and max of one integer would iterate it).
_ARITY = {"min": (2, 1 << 16), "max": (2, 1 << 16), "abs": (1, 1)}
_ARITY_EXAMPLE = {"min": "min(x, 128)", "max": "max(1, x // 2)", "abs": "abs(x - y)"}
_ALLOWED = "integers, names, + - * // % **, comparisons, and/or/not, min() max() abs()"


def compile_expr(source: str, where: str, known: Mapping[str, Any]) -> Expr:
    """Parse ``source`` and check that it uses only allowed syntax and ``known`` names.

    ``where`` ("file: key") prefixes every error message.
    """
    if len(source) > _MAX_EXPR_CHARS:
        raise SpaceError(f"{where}: expression longer than {_MAX_EXPR_CHARS} characters",
                         "split it into [derived] names")
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise SpaceError(f"{where}: cannot parse {source!r}: {exc.msg}", f"expressions may use {_ALLOWED}") from None
    names: set[str] = set()
    check_depth(tree.body, where)
    _check_node(tree.body, where, known, names)
    return Expr(source.strip(), frozenset(names), tree, where)


def _check_node(node: ast.AST, where: str, known: Mapping[str, Any], names: set[str]) -> None:
    """Recursively accept only the syntax ``_Evaluator`` knows; collect the names used."""

    def bad(what: str) -> SpaceError:
        return SpaceError(f"{where}: {what} is not allowed", f"expressions may use {_ALLOWED}")

    def check(child: ast.AST) -> None:
        _check_node(child, where, known, names)

    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            hint = " (use // for integer division)" if isinstance(node.op, ast.Div) else ""
            raise bad(f"operator {type(node.op).__name__}{hint}")
        check(node.left)
        check(node.right)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            raise bad(f"operator {type(node.op).__name__}")
        check(node.operand)
    elif isinstance(node, ast.BoolOp):
        for v in node.values:
            check(v)
    elif isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _CMPOPS:
                raise bad(f"comparison {type(op).__name__}")
        check(node.left)
        for c in node.comparators:
            check(c)
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            raise bad(f"the constant {node.value!r}")
    elif isinstance(node, ast.Name):
        if node.id not in known:
            raise SpaceError(f"{where}: unknown name {node.id!r}", f"known names: {', '.join(known)}")
        names.add(node.id)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS:
            callee = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise bad(f"calling {callee}()")
        if node.keywords or not node.args or any(isinstance(a, ast.Starred) for a in node.args):
            raise bad(f"{node.func.id}() with keyword, starred or no arguments")
        lo, hi = _ARITY[node.func.id]
        if not lo <= len(node.args) <= hi:
            wants = f"exactly {lo}" if lo == hi else f"at least {lo}"
            raise SpaceError(f"{where}: {node.func.id}() takes {wants} argument{'s' if lo > 1 else ''}, "
                             f"got {len(node.args)}", f"e.g. {_ARITY_EXAMPLE[node.func.id]}")
        for a in node.args:
            check(a)
    elif isinstance(node, ast.Attribute):
        raise bad("attribute access")
    else:
        raise bad(type(node).__name__)


class _Evaluator:
    """Evaluates a checked expression tree; every value is an int (or bool)."""

    def __init__(self, env: Mapping[str, int], where: str) -> None:
        self.env = env
        self.where = where

    def visit(self, node: ast.AST) -> int:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            try:
                return self.env[node.id]
            except KeyError:
                raise SpaceError(f"{self.where}: name {node.id!r} has no value here") from None
        if isinstance(node, ast.BinOp):
            a, b = self.visit(node.left), self.visit(node.right)
            if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and b == 0:
                raise SpaceError(f"{self.where}: division by zero", "guard the divisor, e.g. max(1, ...)")
            if isinstance(node.op, ast.Pow):
                if not 0 <= b <= _MAX_POW_EXPONENT:
                    raise SpaceError(f"{self.where}: exponent {b} outside 0..{_MAX_POW_EXPONENT}")
                check_pow(a, b, self.where)
            return check_bits(_BINOPS[type(node.op)](a, b), self.where)
        if isinstance(node, ast.UnaryOp):
            v = self.visit(node.operand)
            if isinstance(node.op, ast.Not):
                return not v
            return -v if isinstance(node.op, ast.USub) else +v
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                return all(self.visit(v) for v in node.values)
            return any(self.visit(v) for v in node.values)
        if isinstance(node, ast.Compare):
            left = self.visit(node.left)
            for op, right_node in zip(node.ops, node.comparators):
                right = self.visit(right_node)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            return _FUNCS[node.func.id](*(self.visit(a) for a in node.args))
        raise SpaceError(f"{self.where}: cannot evaluate {type(node).__name__}")  # unreachable after the check
