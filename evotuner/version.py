"""evotuner's installed version (a leaf module: the build stage and the store both record it)."""

from __future__ import annotations

import functools
from importlib import metadata


@functools.cache
def evotuner_version() -> str:
    """The installed distribution's version ("0+unknown" when run from a bare checkout)."""
    try:
        return metadata.version("evotuner")
    except metadata.PackageNotFoundError:
        return "0+unknown"
