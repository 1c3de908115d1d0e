"""Shared pytest wiring: tests marked ``gpu`` skip cleanly when torch sees no CUDA device."""

from __future__ import annotations

import functools
import os
from typing import Iterator

import pytest


@functools.lru_cache(maxsize=1)
def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def test_families():
    """Register the tests' own kernel families (tests/families/) for the whole session."""
    from evotuner.family import register, unregister
    from families.fc_toy import FlashCoreToy
    from families.mini import Mini

    registered = [register(FlashCoreToy(), replace=True), register(Mini(), replace=True)]
    yield {f.name: f for f in registered}
    for f in registered:
        unregister(f.name)


@pytest.fixture(scope="session")
def build_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """One build cache for the whole session: each config compiles once across test files."""
    return tmp_path_factory.mktemp("evotuner-build-cache")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[object]:
    """A PostgreSQL server in a temporary directory (tests/pg_server.py) for the session;
    skips when the server binaries or psycopg are missing, except under CI (``CI`` set),
    where that is a failure: CI installs both (.ci/run)."""
    from pg_server import PgServer, pg_bin

    missing = None
    if pg_bin("initdb") is None:
        missing = "PostgreSQL server binaries (apt-get install postgresql)"
    else:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            missing = "psycopg (pip install -e '.[postgres]')"
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the PostgreSQL tests but {missing} is missing")
        pytest.skip(f"needs {missing}")
    server = PgServer().start()
    try:
        yield server
    finally:
        server.stop()
