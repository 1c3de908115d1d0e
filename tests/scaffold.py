"""TEST SCAFFOLDING: a deterministic measure stage for tests that have no GPU.

``ScaffoldMeasure`` answers from a fixed function of the config (a sha256 of
its parameters), so a study run against it is reproducible and the loop's
bookkeeping can be checked exactly. It is never offered to users: it lives in
tests/, is not installed, and the CLI only runs it when a test injects it
(``cli.main(argv, measure_factory=make_measure)``, see tests/cli_helpers.py).

It still checks what a real stage would receive: the artifact's cubin must
exist on disk (the loop test builds with the real Builder).

Environment knobs for CLI tests (subprocesses cannot be handed objects):
``EVOTUNER_SCAFFOLD_FAIL`` = ``;``-separated configs (``BLOCK_M=64,...``)
that fail with kind ``wrong_result``; ``EVOTUNER_SCAFFOLD_CALLS`` = a file to
which every measured config is appended, one line each.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from evotuner.compiler.result import Artifact
from evotuner.config import KernelConfig
from evotuner.measure.base import MeasureFailure, MeasureOutcome, Measurement, MeasureStage
from evotuner.problem import Problem

BASELINES = {"sdpa_default": 250.0, "sdpa_flash": 240.0, "sdpa_efficient": 300.0}
#: A packed variable-length problem's baselines (evotuner.measure.gpu.PACKED_BASELINES).
PACKED_BASELINES = {"sdpa_padded": 900.0, "sdpa_jagged": 700.0}
DEVICE = {"name": "scaffold (test only)", "sm_count": 132, "driver": "none", "torch": "none", "cuda": "none"}


def scaffold_median_us(config: KernelConfig) -> float:
    """The fake timing: 100..200 µs, a pure function of the config's parameters."""
    digest = hashlib.sha256(str(config).encode()).digest()
    return 100.0 + int.from_bytes(digest[:4], "big") % 10_000 / 100.0


class ScaffoldMeasure(MeasureStage):
    def __init__(self, fail: set[KernelConfig] | None = None, calls_file: Path | None = None) -> None:
        self.fail = set(fail or ())
        self.calls_file = calls_file
        self.calls: list[KernelConfig] = []
        self.baseline_calls = 0
        self.device_calls = 0
        self.closed = False

    def measure(self, artifact: Artifact, problem: Problem) -> MeasureOutcome:
        config = _config_of(artifact)
        self.calls.append(config)
        if self.calls_file is not None:
            with open(self.calls_file, "a") as f:
                f.write(f"{config}\n")
        if not artifact.cubin.is_file():
            raise AssertionError(f"scaffold: artifact {artifact.cubin} does not exist")
        if problem.varlen and not problem.lengths_q:
            raise AssertionError(f"scaffold: packed problem {problem} reached the measure stage without lengths")
        if config in self.fail:
            return MeasureFailure("wrong_result", "max error 1.0 over tolerance 0.01 (scaffold)")
        us = scaffold_median_us(config)
        return Measurement(
            median_us=us, p20_us=us * 0.98, p80_us=us * 1.02, tflops=problem.tflops(us),
            max_error=1e-3, tolerance=1e-2, repetitions=10,
        )

    def baselines(self, problem: Problem) -> dict[str, float | None]:
        self.baseline_calls += 1
        return dict(PACKED_BASELINES if problem.varlen else BASELINES)

    def device(self) -> dict[str, object] | None:
        """The fixed fingerprint, with readings that change from run to run like a real GPU's."""
        self.device_calls += 1
        readings = {"temperature.gpu": 30 + self.device_calls, "power.draw": 70.0 + self.device_calls}
        return {**DEVICE, "nvidia_smi": readings}

    def close(self) -> None:
        self.closed = True


def _config_of(artifact: Artifact) -> KernelConfig:
    """The config the artifact was built for: the stage is handed only the artifact,
    so the scaffold reads the build record the build cache keeps beside the cubin
    (``build.json``, written by evotuner.compiler.cache)."""
    record = json.loads((artifact.cubin.parent / "build.json").read_text())
    return KernelConfig.of(record["config"])


def make_measure() -> ScaffoldMeasure:
    """The factory the CLI tests inject (``cli.main(..., measure_factory=make_measure)``)."""
    fail = {KernelConfig.parse(c) for c in os.environ.get("EVOTUNER_SCAFFOLD_FAIL", "").split(";") if c.strip()}
    calls = os.environ.get("EVOTUNER_SCAFFOLD_CALLS")
    return ScaffoldMeasure(fail=fail, calls_file=Path(calls) if calls else None)
