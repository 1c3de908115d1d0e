"""Shared pytest wiring: tests marked ``gpu`` skip cleanly when torch sees no CUDA device."""

from __future__ import annotations

import functools

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
