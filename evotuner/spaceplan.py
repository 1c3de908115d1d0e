"""The feasible configs of a space for a problem without evaluating every config
(:func:`feasible_configs`, what :meth:`SearchSpace.feasible` returns).

Each ``[derived]`` value and constraint depends on a few parameters only (directly or
through the derived values it names); the problem and ``[device]`` names are fixed for
the call. So each expression is evaluated once per combination of *its* parameters'
values -- a table (a problem-only term once) -- instead of once per config. The configs
are then built parameter by parameter in file order (the order of
:meth:`SearchSpace.configs`): a prefix whose values already break a constraint that
depends on no later parameter is dropped with its whole sub-product.

The per-config path (:meth:`SearchSpace.violated` on every config) evaluates every
derived value and the constraints up to the first broken one, and stops at the first
expression that raises. The tables evaluate every expression at every combination of
its parameters, so when none raises, neither does the per-config path, and both keep
exactly the configs that break no constraint, in the same order. When one raises (a
division by zero, a value over the bit limit, a name with no value), this module gives
up (None) and the caller takes the per-config path, which raises what it always did,
after the configs it always yielded.
"""

from __future__ import annotations

import itertools
import math
from operator import itemgetter
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping

from evotuner.config import KernelConfig
from evotuner.spaceexpr import Expr

if TYPE_CHECKING:
    from evotuner.spacemodel import SearchSpace

#: A table: the expression's value per combination of its parameters' values, keyed by
#: the values in file order (one parameter: the value itself; none: ``()``).
Table = dict
#: Most table entries, all expressions together (about 150 bytes each): a space whose
#: expressions each depend on most of its parameters would need up to its size per
#: expression; such a space takes the per-config path, which needs no tables.
MAX_TABLE_ENTRIES = 1 << 18


def feasible_configs(space: "SearchSpace", base: Mapping[str, int]) -> Iterator[KernelConfig] | None:
    """The configs of ``space`` that no constraint rejects where the problem and device
    names have the values ``base``, in :meth:`SearchSpace.configs` order (the tables are
    built now, the configs as they are read); None when some expression raises at some
    combination of its parameters' values, or the tables would exceed
    :data:`MAX_TABLE_ENTRIES`."""
    level = {p.name: i for i, p in enumerate(space.params)}
    deps: dict[str, tuple[int, ...]] = {}
    for d in space.derived:
        deps[d.name] = _deps(d.expr, level, deps)
    exprs = [d.expr for d in space.derived] + [c.expr for c in space.constraints]
    if sum(math.prod(len(space.params[i].values) for i in _deps(e, level, deps)) for e in exprs) > MAX_TABLE_ENTRIES:
        return None
    checks: list[list[tuple[Callable, Table]]] = [[] for _ in space.params]
    try:
        tables: dict[str, Table] = {}
        for d in space.derived:
            tables[d.name] = _table(space, d.expr, deps[d.name], base, deps, tables, int)
        for c in space.constraints:
            idx = _deps(c.expr, level, deps)
            table = _table(space, c.expr, idx, base, deps, tables, bool)
            if all(table.values()):
                continue       # holds everywhere: no check
            if not idx:
                return iter(())   # false for every config
            checks[idx[-1]].append((itemgetter(*idx), table))   # checked with the last parameter it needs
    except Exception:   # the per-config path says what and where
        return None
    return _configs(space, checks)


def _deps(expr: Expr, level: Mapping[str, int], deps: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    """The indices (ascending) of the parameters ``expr`` depends on, through derived names too."""
    out: set[int] = set()
    for name in expr.names:
        if name in level:
            out.add(level[name])
        elif name in deps:
            out.update(deps[name])
    return tuple(sorted(out))


def _table(space: "SearchSpace", expr: Expr, idx: tuple[int, ...], base: Mapping[str, int],
           deps: Mapping[str, tuple[int, ...]], tables: Mapping[str, Table], kind: type) -> Table:
    """``expr``'s value (``kind`` of it) at every combination of the values of parameters ``idx``.

    Its environment holds what the per-config path's holds of the names it uses: the
    problem and device names, those parameters, the derived values it names (from their
    tables); a name with none there has none here either.
    """
    names = [space.params[i].name for i in idx]
    derived = []
    for name in sorted(expr.names):
        if name in tables:
            positions = [idx.index(i) for i in deps[name]]
            derived.append((name, _key(positions), tables[name]))
    table: Table = {}
    for combo in itertools.product(*(space.params[i].values for i in idx)):
        env = dict(base)
        env.update(zip(names, combo))
        for name, key, sub in derived:
            env[name] = sub[key(combo)]
        table[combo[0] if len(combo) == 1 else combo] = kind(expr.evaluate(env))
    return table


def _key(positions: list[int]) -> Callable[[tuple[int, ...]], object]:
    """The table key of a sub-combination: the values at ``positions`` (itemgetter's shape)."""
    if not positions:
        return lambda combo: ()
    return itemgetter(*positions)


def _configs(space: "SearchSpace", checks: list[list[tuple[Callable, Table]]]) -> Iterator[KernelConfig]:
    """The configs, parameter by parameter: a prefix leaves when a check of its last level
    fails (the last parameter's combinations are made as they are read)."""
    prefixes: Iterable[tuple[int, ...]] = [()]
    for i, (param, level_checks) in enumerate(zip(space.params, checks)):
        grown: Iterable[tuple[int, ...]] = (p + (v,) for p in prefixes for v in param.values)
        for key, table in level_checks:
            grown = _passing(grown, key, table)
        prefixes = grown if i == len(space.params) - 1 else list(grown)
    names = space.names
    order = sorted(range(len(names)), key=lambda i: names[i])   # KernelConfig keeps its pairs sorted by name
    sorted_names = [names[i] for i in order]
    pick = itemgetter(*order) if len(order) > 1 else (lambda combo: (combo[order[0]],))
    return (KernelConfig(tuple(zip(sorted_names, pick(c)))) for c in prefixes)


def _passing(combos: Iterable[tuple[int, ...]], key: Callable, table: Table) -> Iterator[tuple[int, ...]]:
    return (c for c in combos if table[key(c)])
