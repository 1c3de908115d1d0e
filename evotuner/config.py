"""KernelConfig: one point of the search space, a hashable frozen value.

Parameter names are the space file's (UPPER_SNAKE_CASE, each one becomes the
family's macro ``<PREFIX>_<NAME>``); values are integers. Order does not matter for equality: the
pairs are kept sorted by name, so a config read back from the database equals
the one proposed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

from evotuner.errors import SpaceError


#: What a parameter name looks like (it becomes a C macro suffix).
PARAM_NAME = re.compile(r"^[A-Z][A-Z0-9_]*\Z")


@dataclass(frozen=True)
class KernelConfig:
    items: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        names = [k for k, _ in self.items]
        if names != sorted(names) or len(set(names)) != len(names):
            raise ValueError("KernelConfig.items must be sorted by name without repeats; use KernelConfig.of()")
        for k, v in self.items:
            if not isinstance(v, int) or isinstance(v, bool):
                raise SpaceError(f"config: {k}={v!r} is not an integer", "give every value as a whole number")

    @classmethod
    def of(cls, mapping: Mapping[str, int]) -> "KernelConfig":
        return cls(tuple(sorted((str(k), _as_int(k, v)) for k, v in mapping.items())))

    @classmethod
    def parse(cls, text: str) -> "KernelConfig":
        """Parse ``NAME=VALUE,NAME=VALUE,...`` (names are upper-cased)."""
        values: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = part.partition("=")
            key = key.strip().upper()
            if not sep or not key:
                raise SpaceError(f"--config: cannot read {part!r}", "write NAME=VALUE pairs separated by commas, e.g. TILE=128,WARPS=4")
            if key in values:
                raise SpaceError(f"--config: {key} is given twice", "give each parameter once")
            values[key] = _as_int(key, raw.strip())
        if not values:
            raise SpaceError("--config: no parameters given", "give every space parameter as NAME=VALUE,... (see the space file)")
        return cls.of(values)

    def as_dict(self) -> dict[str, int]:
        return dict(self.items)

    def __getitem__(self, name: str) -> int:
        for k, v in self.items:
            if k == name:
                return v
        raise KeyError(name)

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self.items)

    def __str__(self) -> str:
        return _joined(self.items)


def config_string(params: Mapping[str, object]) -> str:
    """The one config string (``NAME=VALUE,...``, names sorted): ``str(KernelConfig.of(params))``;
    params that are no config (a foreign or damaged trial's) are written the same way."""
    try:
        return str(KernelConfig.of(params))  # type: ignore[arg-type]
    except (SpaceError, ValueError, TypeError):
        return _joined(sorted(params.items()))


def _joined(items: Iterable[tuple[str, object]]) -> str:
    return ",".join(f"{k}={v}" for k, v in items)


def _as_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise SpaceError(f"config: {name}={value!r} is not an integer", "give every value as a whole number")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return int(str(value), 10)
    except ValueError:
        raise SpaceError(f"config: {name}={value!r} is not an integer",
                         "give every value as a whole number") from None
