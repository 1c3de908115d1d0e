"""The search space: a declarative TOML file read into a frozen SearchSpace.

The file format is documented at the top of ``search_spaces/flashcore.toml`` (the default
family's space; each space file is named after its family: ``<family>.toml``,
``<family>_<variant>.toml``).
In short: ``[space]`` names the kernel family and arch, ``[params.NAME]``
lists each tunable integer's values, ``[derived]`` defines integer
expressions, ``[[constraints]]`` are static checks made before anything is
compiled, ``[device]`` holds the arch's limits and ``[gate]`` the ptxas
thresholds used after compiling (see :mod:`evotuner.gate`).

The expression language is :mod:`evotuner.spaceexpr`, the model and its queries
:mod:`evotuner.spacemodel`, the file reading (TOML, a sub-grid's base) :mod:`evotuner.spacefile`.

Names an expression may use:

* every parameter (the space's ``[params.NAME]``);
* the problem: ``HEAD_DIM``, ``DTYPE_BYTES`` (2 for fp16 and bf16),
  ``IS_CAUSAL`` (0 or 1), ``IS_VARLEN`` (1: a packed variable-length batch), ``KV_GROUP``
  (query heads per key/value head: 1 without grouped-query attention);
* every ``[device]`` limit by its key (``max_smem_per_block``, ...);
* every ``[derived]`` name defined *above* the one being defined.

Every name is checked when the file is loaded, so a typo is reported with the file and key,
not at trial 137.
"""

from __future__ import annotations

from pathlib import Path

from evotuner.errors import SpaceError
from evotuner.family import DEFAULT_FAMILY, get_family
from evotuner.spaceexpr import Expr, compile_expr
from evotuner.spacefile import (
    BASE_MARK, STACK_FORMAT, SpaceLoader, check_file_size, narrow, parse_toml, stack_text, stored_subgrid,
)
from evotuner.spacemodel import (
    PROBLEM_NAMES,
    Constraint,
    Derived,
    DeviceLimits,
    GateThresholds,
    Param,
    SearchSpace,
)

__all__ = [
    "BASE_MARK", "PROBLEM_NAMES", "STACK_FORMAT", "Constraint", "Derived", "DeviceLimits", "Expr",
    "GateThresholds", "Param", "SearchSpace", "compile_expr", "load_space", "parse_space", "stack_text",
]


def load_space(path: str | Path | None = None, *, family: str | None = None) -> SearchSpace:
    """Read and check a space file; None reads ``family``'s default space file
    (:meth:`KernelFamily.default_space`), or the default family's (FlashCore's ``flashcore.toml``)."""
    if path is None:
        path = get_family(family or DEFAULT_FAMILY).default_space()
    where = str(path)
    p = Path(path)
    if not p.is_file():
        what = ("is a folder" if p.is_dir() else "is not a regular file") if p.exists() else (
            "is a symbolic link that leads nowhere (a loop, or its target is gone)" if p.is_symlink()
            else "space file not found")
        raise SpaceError(f"{where}: {what}",
                         "pass an existing .toml file, or omit --space for the packaged default")
    check_file_size(p, where)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpaceError(f"{where}: cannot read the space file: {exc}", "give a UTF-8 TOML space file") from None
    data = parse_toml(text, where)
    if isinstance(data.get("space"), dict) and "base" in data["space"]:
        data, files = narrow(data, text, p)
        return SpaceLoader(where).load(data, stack_text(files))
    return parse_space(text, where)


def parse_space(text: str, where: str = "<string>") -> SearchSpace:
    """Parse space-file ``text``, or the text a study stored for a sub-grid space (every file
    of the stack, :data:`STACK_FORMAT`, or the older :data:`BASE_MARK` form: :func:`load_space`);
    ``where`` names it in error messages."""
    merged = stored_subgrid(text, where)   # a sub-grid's text as a study stores it, with its base's
    if merged is not None:
        return SpaceLoader(where).load(merged, text)
    data = parse_toml(text, where)
    if isinstance(data.get("space"), dict) and "base" in data["space"]:
        raise SpaceError(f"{where}: [space] base: a sub-grid space must be read from its file",
                         "load_space(path), so the base file beside it can be found")
    return SpaceLoader(where).load(data, text)


#: The remedy of a study whose stored space text no longer parses.
STORED_REMEDY = ("the study's stored space (evotuner_studies.space_text) is damaged or was edited by hand: "
                 "restore the database from a copy")


def stored_space(text: str, study: str, space_name: str) -> SearchSpace:
    """The space a study's database keeps (its ``space_text``); a text that does not parse is
    a damaged database, not a file to fix: SpaceError naming the study, with that remedy."""
    try:
        return parse_space(text, f"study {study!r} space {space_name!r}")
    except SpaceError as exc:
        raise SpaceError(exc.message, STORED_REMEDY) from None
