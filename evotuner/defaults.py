"""The FlashCore kernel's recommended configs (kernels/flashcore/defaults.toml), torch-free:
read by ``evotuner.flash_attention`` (config=None) and by the search, which tries the
recommended config first in a new study."""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError, ShapeError
from evotuner.problem import DTYPES, HEAD_DIMS, Problem

DEFAULTS_FILE = "defaults.toml"
FAMILY = "flashcore"



_Entry = tuple[dict[str, Any], dict[str, int]]


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
        elif key in ("head_dim", "dtype", "causal", "is_causal"):
            cond["causal" if key == "is_causal" else key] = value
        elif key.isupper() and isinstance(value, int) and not isinstance(value, bool):
            params[key] = value
            own += 1
    if own or (params and not children):
        out.append((cond, params))
    for key, value in children:
        _collect(value, {**cond, **_key_condition(key)}, params, out, f"{where}.{key}")


def parse_defaults(text: str, where: str = "<defaults>") -> tuple[_Entry, ...]:
    """(conditions, params) entries of a defaults file (the format is in :func:`_defaults`)."""
    try:
        data = _toml_loads(text)
    except ValueError as exc:
        raise EvotunerError(f"{where}: not valid TOML ({exc})", "fix the file") from None
    out: list[_Entry] = []
    _collect(data, {}, {}, out, "")
    if not out:
        raise EvotunerError(f"{where}: no recommended config found (no upper-case integer keys)",
                            "add a table per head dim, e.g. [d64] BLOCK_M = 128 ...")
    return tuple(out)


@lru_cache(maxsize=1)
def _defaults() -> tuple[_Entry, ...]:
    """(conditions, params) entries of kernels/flashcore/defaults.toml.

    Tables may be keyed by head dim (``[64]``, ``[d64]``, ``[hdim64]``), dtype
    (``fp16``/``bf16``) or causal (``causal``/``noncausal``), or carry the keys
    ``head_dim``/``dtype``/``causal`` themselves (``[[config]]`` arrays too);
    upper-case integer keys are kernel parameters, inherited by nested tables.
    The most specific matching entry wins.
    """
    resource = resources.files("evotuner.kernels") / FAMILY / DEFAULTS_FILE
    try:
        text = resource.read_text(encoding="utf-8")
    except OSError as exc:
        raise EvotunerError(f"{resource}: cannot read the kernel's recommended configs ({exc.strerror})",
                            "pass config={...} explicitly, or reinstall evotuner") from None
    return parse_defaults(text, str(resource))


def _matches(cond: Mapping[str, Any], head_dim: int, dtype: str, causal: bool) -> bool:
    if "head_dim" in cond and int(cond["head_dim"]) != head_dim:
        return False
    if "dtype" in cond and str(cond["dtype"]).lower() != dtype:
        return False
    if "causal" in cond and bool(cond["causal"]) != causal:
        return False
    return True


def supported_head_dims(entries: tuple[_Entry, ...] | None = None) -> tuple[int, ...]:
    """Head dims the packaged defaults cover (an entry without a head dim covers all)."""
    dims: set[int] = set()
    for cond, _ in (_defaults() if entries is None else entries):
        if "head_dim" in cond:
            dims.add(int(cond["head_dim"]))
        else:
            dims.update(HEAD_DIMS)
    return tuple(sorted(d for d in dims if d in HEAD_DIMS))


def default_config(head_dim: int, dtype: str = "fp16", causal: bool = False,
                   entries: tuple[_Entry, ...] | None = None) -> KernelConfig:
    """The kernel's recommended config for this head dim, dtype and causal flag."""
    entries = _defaults() if entries is None else entries
    best: tuple[int, dict[str, int]] | None = None
    for cond, params in entries:
        if _matches(cond, head_dim, dtype, causal):
            score = len(cond)
            if best is None or score > best[0]:
                best = (score, params)
    if best is None:
        raise ShapeError(
            f"head dim D={head_dim} has no recommended FlashCore config ({dtype}, causal={causal})",
            f"use D in {', '.join(map(str, supported_head_dims(entries)))}, or pass config={{...}}",
        )
    return KernelConfig.of(best[1])


def recommended(problem: Problem) -> tuple[KernelConfig, ...]:
    """The configs a new study of ``problem`` tries first: the kernel's recommended one
    (none for a head dim the defaults do not cover)."""
    try:
        return (default_config(problem.shape.head_dim, problem.dtype, problem.causal),)
    except EvotunerError:
        return ()
