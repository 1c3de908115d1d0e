"""Fixtures the GPU tests share: a hopper Builder with its own build cache and a GPU worker
(one each per test module; a module that needs another family or budget defines its own)."""

from __future__ import annotations

from typing import Iterator

import pytest

from evotuner.compiler.builder import Builder
from evotuner.measure import GpuMeasure


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Builder]:
    with Builder("hopper", cache_dir=tmp_path_factory.mktemp("cache")) as b:
        yield b


@pytest.fixture(scope="module")
def gpu() -> Iterator[GpuMeasure]:
    with GpuMeasure(timeout_s=120.0, budget_s=0.3) as gm:
        yield gm
