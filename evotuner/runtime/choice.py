"""Which kernel ``evotuner.flash_attention`` runs for a problem: :func:`choose` (with a
``config``, the family its parameter names belong to, or ``family``; else the tuned table's
row for the problem on this GPU model, and where the table has rows of several families, the
one of the problem's size bucket, then the fastest by its TFLOP/s; else, of the families that
support the problem and recommend a config for it, the one whose recommended config is
fastest by its own measured figure), :func:`resolve_config` (a partial config over the
recommended one), and the tuned tables served (:func:`use_tuned`, ``$EVOTUNER_TUNED``, then
the shipped ones: see :mod:`evotuner.tuned`). Torch-free; the runtime's plans live in
:mod:`evotuner.runtime.attention`, whose ``use_tuned`` also forgets them."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from evotuner.config import KernelConfig
from evotuner.defaults import config_family, default_config, fastest_recommended
from evotuner.errors import EvotunerError, ShapeError, SpaceError
from evotuner.family import DEFAULT_FAMILY, KernelFamily, families, get_family
from evotuner.problem import Problem
from evotuner.tuned import ENV_VAR as TUNED_ENV_VAR
from evotuner.tuned import TunedError, TunedPick, TunedTable, shipped_tables
from evotuner.tuned import from_environment as tuned_from_environment
from evotuner.tuned import load as load_tuned


@dataclass(frozen=True)
class Choice:
    """Which family and config a call runs, and why (one line); ``partial``: a config given
    with keys left out, which came from the config recommended for the problem."""

    family: str
    config: KernelConfig
    why: str
    partial: bool = False


def choose(problem: Problem, config: Mapping[str, int] | KernelConfig | str | None = None,
           family: str | None = None, exclude: Mapping[str, str] | None = None, *,
           device: str | None = None, tables: Sequence[TunedTable] | None = None) -> Choice:
    """The family and config :func:`flash_attention` runs for ``problem`` (see the module docstring);
    ``exclude``: {family: why} families the automatic choice must pass over; ``device``: the GPU
    model whose tuned rows apply; ``tables``: the tuned tables to serve from (default: the
    ones :func:`use_tuned` and ``$EVOTUNER_TUNED`` set, then the shipped ones)."""
    if config is not None:
        fam = get_family(family) if family is not None else config_family(config)
        why_not = fam.unsupported(problem)
        if why_not:
            raise ShapeError(f"q: {why_not}", f"use one of {', '.join(map(str, fam.head_dims))}")
        cfg, partial = _over_recommended(config, problem.shape.head_dim, problem.dtype, problem.causal, fam,
                                         problem)
        why = "asked for" if family is not None else f"config given (its parameters are the {fam.name} family's)"
        return Choice(fam.name, cfg, f"{why}; {PARTIAL_NOTE}" if partial else why, partial)
    if family is not None:
        fam = get_family(family)
        why_not = fam.unsupported(problem)
        if why_not:
            raise ShapeError(f"q: {why_not}", f"use one of {', '.join(map(str, fam.head_dims))}")
    usable = [f for f in families() if (family is None or f.name == family)
              and not (exclude or {}).get(f.name) and not f.unsupported(problem)]
    active = served_tables() if tables is None else tuple(tables)
    if device is not None:
        # each user table in turn, then the families' shipped tables as one (each family ships its own)
        groups = [(t,) for t in active if not t.shipped] + [tuple(t for t in active if t.shipped)]
        for group in groups:
            picks = [(fam.name, p) for table in group for fam in usable
                     if (p := table.pick(problem, device, fam.name)) is not None]
            if picks:
                return _fastest_pick(picks)
    base = _recommended(problem, family, exclude)
    user = [t for t in active if not t.shipped]
    if device is not None and user:
        return Choice(base.family, base.config, f"{base.why}; {user[0].nearest_note(problem, device, family)}")
    return base


def _fastest_pick(picks: list[tuple[str, TunedPick]]) -> Choice:
    """Of one table's rows for the problem, one per family: a row of the problem's own size
    bucket over a nearest size, then the highest TFLOP/s at its tuned problem (a row with no
    figure last), then the family order."""
    def key(item: tuple[str, TunedPick]) -> tuple[bool, float]:
        rate = item[1].row.rate
        return (not item[1].in_bucket, -rate if rate is not None else math.inf)

    name, pick = min(picks, key=key)
    mine, why = pick.row.rate, pick.why
    for other, theirs in picks:
        if other == name:
            continue
        if theirs.in_bucket != pick.in_bucket:
            reason = "a nearest size, not this size bucket"
        elif mine is not None and theirs.row.rate is not None:
            reason = f"{theirs.row.rate:.0f} against {mine:.0f} TFLOPS"
        else:
            reason = "no TFLOPS figure to rank them: the family order"
        why += f"; over the {other} family's tuned row ({reason})"
    return Choice(name, pick.row.config, why)


def _recommended(problem: Problem, family: str | None, exclude: Mapping[str, str] | None) -> Choice:
    """The recommended config of ``family``, else of the fastest family by its own figure."""
    if family is not None:
        fam = get_family(family)
        picked = fam.recommended_configs(problem)
        cfg = picked[0] if picked else resolve_config(None, problem.shape.head_dim, problem.dtype, problem.causal,
                                                      family=fam.name)
        return Choice(fam.name, cfg, "asked for")
    fam, cfg, why = fastest_recommended(problem, exclude)
    return Choice(fam.name, cfg, why)


#: What a Choice's ``why`` adds for a partial config (the keys it leaves out come from elsewhere).
PARTIAL_NOTE = "the keys it leaves out are those of the config recommended for this problem"


def _given(config: Mapping[str, int] | KernelConfig | str) -> dict[str, int]:
    """The parameters ``config`` names, upper-cased (SpaceError for what is no config)."""
    if isinstance(config, str):
        return KernelConfig.parse(config).as_dict()
    if isinstance(config, KernelConfig):
        return config.as_dict()
    if isinstance(config, Mapping):
        return KernelConfig.of({str(k).upper(): v for k, v in config.items()}).as_dict()
    raise SpaceError(f"config: expected a mapping of kernel parameters, got {type(config).__name__}",
                     'pass a mapping {NAME: value}, a KernelConfig or a "NAME=value,..." string')


def resolve_config(config: Mapping[str, int] | KernelConfig | str | None, head_dim: int, dtype: str,
                   causal: bool, *, family: str | None = None, problem: Problem | None = None) -> KernelConfig:
    """``config`` over the recommended config. A config naming every parameter of the family's
    default runs as given (optional parameters it leaves out at their family default). A partial
    one overrides only its keys: with ``problem``, of the config the family recommends for that
    problem (size-dependent entries such as hopper's [d128.mid] and its small problems' split-KV
    configs included), so it changes only what it names of what would run; without, of the
    default of (head dim, dtype, causal)."""
    return _over_recommended(config, head_dim, dtype, causal, get_family(family or DEFAULT_FAMILY), problem)[0]


def _over_recommended(config: Mapping[str, int] | KernelConfig | str | None, head_dim: int, dtype: str,
                      causal: bool, fam: KernelFamily, problem: Problem | None) -> tuple[KernelConfig, bool]:
    """:func:`resolve_config`'s config, and whether ``config`` was partial."""
    default = default_config(head_dim, dtype, causal, family=fam.name)
    if config is None:
        return default, False
    given = _given(config)
    known = default.as_dict()
    for name in given:
        if name not in known and name not in fam.optional_params:
            try:
                other = config_family(given).name      # the family these parameters are of, if one
            except SpaceError:
                other = None
            hint = f"; they are the {other} family's: pass family={other!r}" if other and other != fam.name else ""
            raise SpaceError(f"config: unknown kernel parameter {name} for the {fam.name} family",
                             f"{fam.title or fam.name} takes {', '.join(sorted({*known, *fam.optional_params}))}{hint}")
    partial = not known.keys() <= given.keys()
    picked = fam.recommended_configs(problem) if partial and problem is not None else ()
    base = picked[0].as_dict() if picked else known
    return KernelConfig.of({**base, **given}), partial


# --------------------------------------------------------------------------- tuned tables

_tables_lock = threading.Lock()
_tables: tuple[TunedTable, ...] | None = None   # None: not read yet


def use_tuned(source: str | Path | None = None, *, shipped: bool = True) -> TunedTable | None:
    """Serve tuned configs from ``source``: a study database (``"sqlite:///studies.db"``, a
    PostgreSQL URL, or a SQLite file's path) or a header written by ``evotuner export``.

    The table is read once, here; later calls of :func:`flash_attention` look problems up in
    it (:meth:`evotuner.tuned.TunedTable.pick`): the row of the same GPU model, family, head
    dim, dtype and causal flag in the problem's size bucket, else the nearest tuned size,
    else the shipped table's row (``shipped``), else the recommended config.
    ``return_choice=True`` says which and why. ``source=None`` goes back to the default:
    ``$EVOTUNER_TUNED`` when set, and the shipped tables. Returns the table read (None for
    the default)."""
    global _tables
    if source is not None and not isinstance(source, (str, Path)):
        raise TunedError(f"use_tuned: source {source!r} is a {type(source).__name__}",
                         "give a study database URL, a SQLite file's path or an exported header's path (str or Path)")
    if not isinstance(shipped, bool):
        raise TunedError(f"use_tuned: shipped={shipped!r} is not True or False",
                         "pass shipped=True to fall back on the shipped tables, False to serve only the source")
    table = load_tuned(source) if source is not None else None
    defaults = _shipped() if shipped else ()
    with _tables_lock:
        _tables = ((table,) + defaults) if table is not None else None
    return table


def served_tables() -> tuple[TunedTable, ...]:
    """The tuned tables :func:`flash_attention` serves from, in order (read on first use)."""
    global _tables
    tables = _tables
    if tables is None:
        with _tables_lock:
            if _tables is None:
                env = tuned_from_environment()
                try:
                    user = (load_tuned(env),) if env else ()
                except EvotunerError as exc:
                    raise type(exc)(f"${TUNED_ENV_VAR}: {exc.message}",
                                    exc.remedy or f"fix or unset {TUNED_ENV_VAR}") from None
                _tables = user + _shipped()
            tables = _tables
    return tables


def _shipped() -> tuple[TunedTable, ...]:
    """The families' shipped tables, read once per process (use_tuned resets only the user's)."""
    global _shipped_tables
    if _shipped_tables is None:
        _shipped_tables = tuple(load_tuned(path) for path in shipped_tables(families()))
    return _shipped_tables


_shipped_tables: tuple[TunedTable, ...] | None = None
