"""The kernel-family registry: name -> :class:`KernelFamily` instance.

Families come from the ``evotuner.families`` entry point group (each entry names
a KernelFamily subclass or instance; the packaged FlashCore family is one) and
from :func:`register` calls (a test fixture registers its own). Nothing is imported
from a path given at run time.
"""

from __future__ import annotations

import threading
from importlib import metadata

from evotuner.errors import SpaceError
from evotuner.family.base import KernelFamily

ENTRY_POINT_GROUP = "evotuner.families"
#: The family of the packaged default space.
DEFAULT_FAMILY = "flashcore"

_lock = threading.Lock()
_families: dict[str, KernelFamily] = {}
_loaded = False


def _instance(obj: object, where: str) -> KernelFamily:
    family = obj() if isinstance(obj, type) else obj
    if not isinstance(family, KernelFamily):
        raise SpaceError(f"{where}: {family!r} is not a KernelFamily", "the entry point must name a KernelFamily subclass")
    return family


def _load_entry_points() -> None:
    global _loaded
    if _loaded:
        return
    with _lock:
        if _loaded:
            return
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            family = _instance(ep.load(), f"entry point {ep.name} = {ep.value}")
            _families.setdefault(family.name, family)
        _loaded = True


def register(family: KernelFamily | type[KernelFamily], *, replace: bool = False) -> KernelFamily:
    """Add a family; a second family of the same name is refused unless ``replace``."""
    _load_entry_points()
    fam = _instance(family, "register()")
    if not fam.name or not fam.macro_prefix or not fam.entry or not fam.meta_symbol:
        raise SpaceError(f"{fam!r}: name, macro_prefix, entry and meta_symbol must all be set")
    with _lock:
        if fam.name in _families and not replace and _families[fam.name] is not fam:
            raise SpaceError(f"kernel family {fam.name!r} is already registered", "pick another name")
        _families[fam.name] = fam
    return fam


def unregister(name: str) -> None:
    """Remove a family (tests)."""
    with _lock:
        _families.pop(name, None)


def get_family(name: str) -> KernelFamily:
    """The registered family ``name``; SpaceError naming the known ones otherwise."""
    _load_entry_points()
    family = _families.get(name)
    if family is None:
        raise SpaceError(f"kernel family {name!r} is not registered",
                         f"known families: {', '.join(sorted(_families)) or '(none)'}; "
                         "a family registers through the evotuner.families entry point")
    return family


def family_names() -> tuple[str, ...]:
    _load_entry_points()
    return tuple(sorted(_families))


def families() -> tuple[KernelFamily, ...]:
    _load_entry_points()
    return tuple(_families[n] for n in sorted(_families))
