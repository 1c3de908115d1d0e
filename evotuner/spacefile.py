"""Reading space files: TOML parsing, a sub-grid's inheritance from its base file (and the
text a study stores for one, :data:`STACK_FORMAT`), and checking every table into a
:class:`~evotuner.spacemodel.SearchSpace` (:class:`SpaceLoader`)."""

from __future__ import annotations

import json
import keyword
import re
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from evotuner.config import PARAM_NAME
from evotuner.errors import SpaceError
from evotuner.family import get_family
from evotuner.spaceexpr import Expr, compile_expr
from evotuner.spacelimits import MAX_PARAM_VALUE, MAX_SPACE_BYTES, check_size, first_duplicate
from evotuner.spacemodel import (
    DEVICE_KEYS,
    GATE_KEYS,
    PLACEHOLDER,
    PROBLEM_NAMES,
    Constraint,
    Derived,
    DeviceLimits,
    GateThresholds,
    Param,
    SearchSpace,
)

if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # pragma: no cover - Python 3.10 only
    try:
        import tomli as _toml
    except ImportError:  # pragma: no cover
        _toml = None

_TOP_KEYS = ("space", "params", "derived", "constraints", "device", "gate")
_SPACE_KEYS = {"name": str, "kernel": str, "arch": str, "doc": str, "base": str}
#: Tables a space file with ``[space] base = ...`` (a sub-grid of that space) may set.
_NARROWING_KEYS = ("space", "params")
_PARAM_KEYS = ("values", "doc")
_CONSTRAINT_KEYS = ("name", "expr", "message")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")     # \Z, not $: "$" matches before a final newline
_ARCH = re.compile(r"^sm_\d{2,3}[af]?\Z")
#: Values of one parameter; more is a generated list, not a kernel knob (and the space's
#: product of sizes is what the loop walks).
_MAX_PARAM_VALUES = 4096
#: What expressions may name, for the remedies of names they may not.
_EXPR_NAMES = ("the parameters, HEAD_DIM, DTYPE_BYTES, IS_CAUSAL, IS_VARLEN, KV_GROUP, "
               "the [device] keys and the [derived] names above")


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


def narrow(data: dict[str, Any], text: str, path: Path, depth: int = 0) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A sub-grid space file (``[space] base = "other.toml"``): the base file's tables with
    the ``[params.NAME] values`` this file narrows (:func:`_merge`), and the files of the stack
    (this one, its base, the base's base ...) as :func:`stack_text` stores them, which
    :func:`parse_space` reads back without the files."""
    where = str(path)
    base_name = _base_name(data, where)
    try:
        base_path = (path.parent / base_name).resolve()
    except (OSError, RuntimeError):   # a symlink loop (RuntimeError before Python 3.13)
        raise SpaceError(f"{where}: [space] base: {base_name} is a symbolic link that leads nowhere (a loop?)",
                         "name a space file beside this one") from None
    if depth > _MAX_BASE_DEPTH:
        raise SpaceError(f"{where}: [space] base: more than {_MAX_BASE_DEPTH} bases deep (a cycle?)",
                         "point base at a full space file")
    if not base_path.is_file():
        what = "is not a regular file" if base_path.exists() else "not found"
        raise SpaceError(f"{where}: [space] base: {base_path} {what}", "name a space file beside this one")
    check_file_size(base_path, f"{where}: [space] base: {base_path}")
    try:
        base_text = base_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpaceError(f"{where}: [space] base: cannot read {base_path} as UTF-8 text ({exc})",
                         "point base at a space file (TOML text)") from None
    base = parse_toml(base_text, str(base_path))
    files = [(base_path.name, base_text)]
    if isinstance(base.get("space"), dict) and "base" in base["space"]:
        base, files = narrow(base, base_text, base_path, depth + 1)
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


def stored_subgrid(text: str, where: str) -> dict[str, Any] | None:
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
    merged = parse_toml(files[-1]["text"], f"{where} ({files[-1]['name']})")
    if _is_subgrid(merged):
        raise damaged
    for sub, base in zip(reversed(files[:-1]), reversed(files[1:])):
        sub_where = f"{where} ({sub['name']})"
        data = parse_toml(sub["text"], sub_where)
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
            data = parse_toml(head, where)
            if not (_is_subgrid(data) and data["space"]["base"] == base_name):
                continue
            _base_name(data, where)
            base = _stored_marked(base_text, where, depth + 1)
            if base is None:
                base = parse_toml(base_text, where)
                if _is_subgrid(base):
                    continue
            return _merge(data, base, where, base_name)
        except SpaceError as exc:
            first_error = first_error or exc
    if first_error is not None:
        try:                               # a plain space file whose comment read like the mark
            whole = parse_toml(text, where)
        except SpaceError:
            whole = None
        if whole is None or _is_subgrid(whole):
            raise first_error
    return None


def parse_toml(text: str, where: str) -> dict[str, Any]:
    if _toml is None:  # pragma: no cover - Python 3.10 without tomli
        raise SpaceError(f"{where}: reading TOML on Python 3.10 needs the tomli package", "pip install tomli")
    try:   # a byte-order mark (what some Windows editors write first) is no TOML, and invisible
        return _toml.loads(text.removeprefix("\ufeff"))
    except _toml.TOMLDecodeError as exc:
        raise SpaceError(f"{where}: malformed TOML: {exc}", "fix the line it names") from None


class SpaceLoader:
    def __init__(self, where: str) -> None:
        self.where = where

    def error(self, key: str, what: str, remedy: str | None = None) -> SpaceError:
        return SpaceError(f"{self.where}: {key}: {what}", remedy)

    def table(self, data: Mapping[str, Any], key: str, required: bool = True) -> dict[str, Any]:
        value = data.get(key)
        if value is None:
            if required:
                raise self.error(f"[{key}]", "missing table", f"add a [{key}] table (see the packaged flashcore.toml)")
            return {}
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table, got {type(value).__name__}",
                             f"write it as a [{key}] table (see the packaged flashcore.toml)")
        return value

    def only(self, table: Mapping[str, Any], key: str, allowed: tuple[str, ...] | Mapping[str, Any]) -> None:
        for k in table:
            if k not in allowed:
                raise self.error(f"{key}", f"unknown key {k!r}", f"allowed keys: {', '.join(allowed)}")

    def integer(self, value: Any, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"must be an integer, got {value!r}",
                             "write a whole number without quotes, e.g. 1024")
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
                                 'e.g. name = "flashcore", kernel = "flashcore", arch = "sm_90a"')
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
            raise self.error("[space] doc", "must be a string", 'e.g. doc = "what this space tunes"')

        params = self.params(self.table(data, "params"))
        device = self.device(self.table(data, "device"))
        gate = self.gate(self.table(data, "gate"), device)

        known: dict[str, str] = {n: "problem" for n in PROBLEM_NAMES}
        for k in DEVICE_KEYS:
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
        derived_table = self.table(data, "derived", required=False)
        order = {n: i for i, n in enumerate(derived_table)}
        for name, src in derived_table.items():
            key = f"[derived] {name}"
            if not _IDENT.match(name):
                raise self.error(key, "is not an identifier", "use letters, digits and _")
            if keyword.iskeyword(name):
                raise self.error(key, f"{name} is a Python keyword, which no expression can name", "rename it")
            if name in known:
                raise self.error(key, f"the name {name} is already a {known[name]} name", "rename it")
            if not isinstance(src, str):
                raise self.error(key, f"must be an expression string, got {src!r}", 'e.g. threads = "WARPS * 32"')
            derived.append(Derived(name, self.expr(src, key, known, _below(name, order))))
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
                raise self.error(f"{label} message", "must be one line", "write it on one line; it is shown as one")
            for m in PLACEHOLDER.finditer(message):
                if known.get(m.group(1), "build stage") == "build stage":   # a macro has no value to show
                    raise self.error(f"{label} message", f"unknown placeholder {{{m.group(1)}}}",
                                     f"placeholders are {{NAME}} with NAME one of "
                                     f"{', '.join(n for n, kind in known.items() if kind != 'build stage')}")
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
                raise self.error(f"{key} doc", "must be a string", 'e.g. doc = "what the parameter sets"')
            big = next((v for v in values if abs(v) > MAX_PARAM_VALUE), None)
            if big is not None:
                raise self.error(f"{key} values", f"{big} does not fit a C int (|value| <= {MAX_PARAM_VALUE})",
                                 "values become the kernel's int template arguments")
            out.append(Param(name, tuple(sorted(values)), doc))
        check_size([(p.name, len(p.values)) for p in out], self.where)
        return out

    def device(self, table: dict[str, Any]) -> DeviceLimits:
        self.only(table, "[device]", DEVICE_KEYS)
        for k in DEVICE_KEYS:
            if k not in table:
                raise self.error(f"[device] {k}", "missing", f"[device] needs all of {', '.join(DEVICE_KEYS)}")
            if self.integer(table[k], f"[device] {k}") <= 0:
                raise self.error(f"[device] {k}", f"must be positive, got {table[k]}",
                                 "give the device's limit (see the packaged flashcore.toml's [device])")
        return DeviceLimits(**{k: table[k] for k in DEVICE_KEYS})

    def gate(self, table: dict[str, Any], device: DeviceLimits) -> GateThresholds:
        self.only(table, "[gate]", GATE_KEYS)
        for k in GATE_KEYS:
            if k not in table:
                raise self.error(f"[gate] {k}", "missing", f"[gate] needs all of {', '.join(GATE_KEYS)}")
            if self.integer(table[k], f"[gate] {k}") < 0:
                raise self.error(f"[gate] {k}", f"must not be negative, got {table[k]}",
                                 "0 rejects any; see the packaged flashcore.toml's [gate]")
        return GateThresholds(device=device, **{k: table[k] for k in GATE_KEYS})

    def expr(self, source: str, key: str, known: Mapping[str, str],
             later: Callable[[str], tuple[str, str] | None] | None = None) -> Expr:
        """``source`` checked against the ``known`` names; ``later``: see :func:`_below`."""
        return compile_expr(source, f"{self.where}: {key}", known, later)


def _below(name: str, order: Mapping[str, int]) -> Callable[[str], tuple[str, str] | None]:
    """Why the [derived] ``name`` cannot use another [derived] name (``order``: each one's
    position): itself, or one defined below it; None for any other name."""

    def why(other: str) -> tuple[str, str] | None:
        if other == name:
            return "refers to itself", f"compute {name} from {_EXPR_NAMES} it"
        if order.get(other, -1) > order[name]:
            return ("is defined below it in [derived]", f"define {other} above {name}: [derived] names are computed "
                    "top to bottom, each from those above it, so none can depend on itself")
        return None

    return why


def check_file_size(path: Path, where: str) -> None:
    """Refuse a file larger than any space file before reading it (a database or a log
    passed by mistake would be read whole)."""
    try:
        size = path.stat().st_size
    except OSError:
        return      # the read that follows says what is wrong
    if size > MAX_SPACE_BYTES:
        raise SpaceError(f"{where}: {size} bytes, more than the {MAX_SPACE_BYTES} a space file may have",
                         "pass the search space's .toml file (a few kilobytes of TOML)")

