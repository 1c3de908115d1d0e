"""Recommended configs, torch-free: the reader of a family's recommended-config file
(FlashCore's is kernels/flashcore/defaults.toml) and the generic look-ups over the
registered families, read by ``evotuner.flash_attention`` (config=None) and by the
search, which tries the recommended config first in a new study.

File format: tables may be keyed by head dim (``[64]``, ``[d64]``, ``[hdim64]``), dtype
(``fp16``/``bf16``) or causal (``causal``/``noncausal``), or carry the keys
``head_dim``/``dtype``/``causal`` themselves (``[[config]]`` arrays too); upper-case
integer keys are kernel parameters, inherited by nested tables. The most specific
matching entry wins.

A table may also carry ``max_query_rows = N``: it applies only to problems with
B*H*Sq <= N query rows, where the big tiles leave most SMs idle (the Hopper family's
latency shapes). Such an entry is never picked when only the head dim, dtype and
causal flag are known (:func:`pick_config` without ``query_rows``); of several that
match a problem, the one with the smallest limit wins.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Mapping

from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError, ShapeError, SpaceError
from evotuner.family.base import KernelFamily
from evotuner.family.registry import DEFAULT_FAMILY, families, get_family
from evotuner.problem import DTYPES, HEAD_DIMS, Problem, Shape



_Entry = tuple[dict[str, Any], dict[str, int]]
#: Lower-case keys of a table that narrow when its entry applies (module docstring).
CONDITION_KEYS = ("head_dim", "dtype", "causal", "is_causal", "max_query_rows")


def _toml_loads(text: str) -> dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(text)


def _key_condition(key: str) -> dict[str, Any]:
    k = key.strip().lower()
    if k in DTYPES:
        return {"dtype": k}
    if k in ("causal", "is_causal"):
        return {"causal": True}
    if k in ("noncausal", "non_causal", "not_causal", "nocausal", "full"):
        return {"causal": False}
    m = re.fullmatch(r"(?:d|hd|hdim|head_dim|headdim|head_dim_|d_)?(\d+)", k)
    if m and int(m.group(1)) in HEAD_DIMS:
        return {"head_dim": int(m.group(1))}
    return {}


def _collect(node: Any, cond: dict[str, Any], inherited: dict[str, int], out: list[_Entry], where: str) -> None:
    if isinstance(node, list):
        for i, item in enumerate(node):
            _collect(item, cond, inherited, out, f"{where}[{i}]")
        return
    if not isinstance(node, dict):
        return
    cond = dict(cond)
    params = dict(inherited)
    children: list[tuple[str, Any]] = []
    own = 0   # parameters set by this table itself (an override of an inherited key counts)
    for key, value in node.items():
        if isinstance(value, (dict, list)) and not (isinstance(value, list) and all(
                isinstance(x, (int, float, str)) for x in value)):
            children.append((key, value))
        elif key in CONDITION_KEYS:
            if key == "max_query_rows" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise EvotunerError(f"{where}: max_query_rows = {value!r} is not a positive integer",
                                    "give the largest B*H*Sq the entry is meant for, e.g. 16384")
            cond["causal" if key == "is_causal" else key] = value
        elif key.isupper() and isinstance(value, int) and not isinstance(value, bool):
            params[key] = value
            own += 1
    if own or (params and not children):
        out.append((cond, params))
    for key, value in children:
        _collect(value, {**cond, **_key_condition(key)}, params, out, f"{where}.{key}")


def parse_defaults(text: str, where: str = "<defaults>") -> tuple[_Entry, ...]:
    """(conditions, params) entries of a recommended-config file (format: module docstring)."""
    try:
        data = _toml_loads(text)
    except ValueError as exc:
        raise EvotunerError(f"{where}: not valid TOML ({exc})", "fix the file") from None
    out: list[_Entry] = []
    _collect(data, {}, {}, out, "")
    if not out:
        raise EvotunerError(f"{where}: no recommended config found (no upper-case integer keys)",
                            "add a table per head dim, e.g. [d64] with NAME = value lines")
    return tuple(out)


def _matches(cond: Mapping[str, Any], head_dim: int, dtype: str, causal: bool, query_rows: int | None) -> bool:
    if "max_query_rows" in cond and (query_rows is None or query_rows > int(cond["max_query_rows"])):
        return False
    if "head_dim" in cond and int(cond["head_dim"]) != head_dim:
        return False
    if "dtype" in cond and str(cond["dtype"]).lower() != dtype:
        return False
    if "causal" in cond and bool(cond["causal"]) != causal:
        return False
    return True


def supported_head_dims(entries: tuple[_Entry, ...] | None = None, *, family: str | None = None) -> tuple[int, ...]:
    """Head dims ``entries`` cover (an entry without a head dim covers all); None: the head
    dims the family (default: the packaged default space's) has a recommended config for."""
    if entries is None:
        fam = get_family(family or DEFAULT_FAMILY)
        return tuple(d for d in fam.head_dims
                     if any(fam.recommended_configs(_probe(d, dt)) for dt in fam.dtypes))
    dims: set[int] = set()
    for cond, _ in entries:
        if "head_dim" in cond:
            dims.add(int(cond["head_dim"]))
        else:
            dims.update(HEAD_DIMS)
    return tuple(sorted(d for d in dims if d in HEAD_DIMS))


#: B*H*Sq of a probe: more query rows than any ``max_query_rows`` entry is written for.
_PROBE_ROWS = 2**31 - 1


def _probe(head_dim: int, dtype: str, causal: bool = False) -> Problem:
    """A problem carrying only the static part (head dim, dtype, causal); its size is past
    every ``max_query_rows`` entry, so the size-independent entry answers."""
    return Problem(Shape(1, 1, _PROBE_ROWS, 1, head_dim), dtype, causal)


def pick_config(entries: tuple[_Entry, ...], head_dim: int, dtype: str, causal: bool,
                title: str = "kernel", *, query_rows: int | None = None) -> KernelConfig:
    """The most specific entry matching (head dim, dtype, causal and, when given, the
    problem's B*H*Sq ``query_rows``); ShapeError when none does."""
    best: tuple[tuple[int, int], dict[str, int]] | None = None
    for cond, params in entries:
        if _matches(cond, head_dim, dtype, causal, query_rows):
            # More conditions win; of two size-limited entries, the tighter limit.
            score = (len(cond), -int(cond.get("max_query_rows", 0)))
            if best is None or score > best[0]:
                best = (score, params)
    if best is None:
        raise ShapeError(
            f"head dim D={head_dim} has no recommended {title} config ({dtype}, causal={causal})",
            f"use D in {', '.join(map(str, supported_head_dims(entries)))}, or pass config={{...}}",
        )
    return KernelConfig.of(best[1])


def default_config(head_dim: int, dtype: str = "fp16", causal: bool = False,
                   entries: tuple[_Entry, ...] | None = None, *, family: str | None = None,
                   title: str | None = None) -> KernelConfig:
    """The recommended config for this head dim, dtype and causal flag: from ``entries``,
    else from the family's (default: the packaged default space's) recommended configs."""
    fam = get_family(family or DEFAULT_FAMILY)
    if entries is not None:
        return pick_config(entries, head_dim, dtype, causal, title or fam.title)
    if head_dim not in HEAD_DIMS:
        raise ShapeError(f"head dim D={head_dim} has no recommended {fam.title} config ({dtype}, causal={causal})",
                         f"use D in {', '.join(map(str, supported_head_dims(family=fam.name)))}, or pass config={{...}}")
    found = fam.recommended_configs(_probe(head_dim, dtype, causal))
    if not found:
        raise ShapeError(f"head dim D={head_dim} has no recommended {fam.title} config ({dtype}, causal={causal})",
                         f"use D in {', '.join(map(str, supported_head_dims(family=fam.name)))}, or pass config={{...}}")
    return found[0]


def recommended(problem: Problem, family: str | None = None) -> tuple[KernelConfig, ...]:
    """The configs a new study of ``problem`` tries first: the family's recommended ones
    (none for a problem it has none for)."""
    try:
        return get_family(family or DEFAULT_FAMILY).recommended_configs(problem)
    except EvotunerError:
        return ()


def fastest_recommended(problem: Problem, exclude: Mapping[str, str] | None = None
                        ) -> tuple[KernelFamily, KernelConfig, str]:
    """(family, its recommended config, why) of the registered family whose recommended
    config for ``problem`` is fastest by the family's own measured figure
    (:meth:`KernelFamily.expected_speed`; the default family on ties); ``exclude``:
    {family: why} families to pass over. ShapeError when no family has one."""
    candidates: list[tuple[float, int, KernelFamily, KernelConfig]] = []
    skipped: list[str] = []
    for fam in families():
        why_not = (exclude or {}).get(fam.name) or fam.unsupported(problem)
        found = () if why_not else fam.recommended_configs(problem)
        if not found:
            skipped.append(f"{fam.name}: {why_not or 'no recommended config'}")
            continue
        candidates.append((fam.expected_speed(problem), fam.name == DEFAULT_FAMILY, fam, found[0]))
    if not candidates:
        fam = get_family(DEFAULT_FAMILY)
        dims = [d for d in HEAD_DIMS if d in supported_head_dims(family=fam.name)]
        raise ShapeError(f"q: head dim D={problem.shape.head_dim} is not supported ({'; '.join(skipped)})",
                         f"use one of {', '.join(map(str, dims))}")
    candidates.sort(key=lambda c: (c[0], c[1]), reverse=True)
    speed, _, fam, cfg = candidates[0]
    why = (f"recommended config of the fastest family ({speed:g} TFLOP/s measured by its family)"
           if len(candidates) > 1 else "recommended config of the only family supporting the problem")
    if skipped:
        why += f"; not: {'; '.join(skipped)}"
    return fam, cfg, why


@lru_cache(maxsize=None)
def family_parameters(name: str) -> frozenset[str]:
    """The kernel parameter names of family ``name`` (the keys of its recommended configs and
    its optional parameters)."""
    fam = get_family(name)
    names: set[str] = set(fam.optional_params)
    for d in fam.head_dims:
        for causal in (False, True):
            try:
                names.update(default_config(d, fam.dtypes[0], causal, family=name).as_dict())
            except EvotunerError:
                continue
    return frozenset(names)


def config_family(config: Mapping[str, int] | KernelConfig | str) -> KernelFamily:
    """The registered family whose parameters ``config`` names: the one family that takes all
    of its keys; where several do (a partial config of shared names such as a tile size),
    the default family if it is one of them. SpaceError naming the families and their
    parameters otherwise."""
    if isinstance(config, str):
        keys = set(KernelConfig.parse(config).as_dict())
    elif isinstance(config, KernelConfig):
        keys = set(config.as_dict())
    elif isinstance(config, Mapping):
        keys = set(KernelConfig.of({str(k).upper(): v for k, v in config.items()}).as_dict())
    else:
        raise SpaceError(f"config: expected a mapping of kernel parameters, got {type(config).__name__}",
                         "give {'NAME': value, ...} or 'NAME=value,...' with the family's parameter names")
    registered = families()
    fits = [f for f in registered if keys <= family_parameters(f.name)]
    if len(fits) == 1:
        return fits[0]
    if any(f.name == DEFAULT_FAMILY for f in fits):
        return get_family(DEFAULT_FAMILY)
    listing = "; ".join(f"{f.name}: {', '.join(sorted(family_parameters(f.name)))}" for f in registered)
    given = ", ".join(sorted(keys))
    if not fits:
        raise SpaceError(f"config: no kernel family takes all of {given} ({listing})",
                         "use the parameters of one family (--space NAME on the command line names its space)")
    raise SpaceError(f"config: {given} name parameters of several families "
                     f"({', '.join(f.name for f in fits)}; {listing})",
                     f"pass family={fits[0].name!r} (--space {fits[0].name} on the command line), "
                     "or give a parameter only one family has")
