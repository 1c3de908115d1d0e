"""``toy``: FlashCore's build contract (FLASHCORE_* macros, flashcore::Params, FlashCore's
parameters and meta fields) with a body of a few instructions (tests/data/kernels/toy),
so a compile takes about a second. The build-stage tests use it."""

from __future__ import annotations

from pathlib import Path

from evotuner.kernels.flashcore.family import FlashCore

ROOT = Path(__file__).resolve().parents[1] / "data" / "kernels"


class FlashCoreToy(FlashCore):
    name = "toy"
    title = "toy (FlashCore contract)"

    def kernels_root(self) -> Path:
        return ROOT
