"""Re-measure a study's best configs and SDPA's backends side by side, in one run.

``bench_study`` reads the best ``top`` COMPLETE trials of a study (one per
config: a duplicate trial is the same kernel), rebuilds each through the
Builder (a cache hit when the study was tuned on this machine), measures it
with the given MeasureStage, and measures SDPA's backends at the study's shape
with the same stage, so every figure comes from the same device in the same
run. The ratio to a backend is ``sdpa_us / ours_us``: above 1 means the tuned
kernel is faster.

Nothing here prints; the CLI (``evotuner bench``) renders the BenchResult.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError
from evotuner.measure.base import MeasureFailure, Measurement, MeasureStage
from evotuner.measure.gpu import BASELINES
from evotuner.problem import Problem
from evotuner.space import stored_space
from evotuner.vocabulary import config_of

#: The baselines a ratio is given against, in column order (MeasureStage.baselines' keys).
BASELINE_NAMES = BASELINES


@dataclass(frozen=True)
class BenchRow:
    """One re-measured config of the study.

    ``recorded_us`` is the median the study recorded for it (another run, maybe
    another device); ``median_us`` … ``tflops`` are this run's figures, None
    with ``failure`` set when the rebuild or the measurement failed.
    """

    trial: int
    config: KernelConfig
    recorded_us: float | None
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    tflops: float | None = None
    max_error: float | None = None
    cached: bool | None = None                  # the rebuild was a build-cache hit
    failure: str | None = None                  # "<kind>: <reason>" or "build failed: ..."
    ratios: dict[str, float | None] = field(default_factory=dict, hash=False)  # backend -> sdpa_us / median_us

    @property
    def ok(self) -> bool:
        return self.failure is None and self.median_us is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial, "config": str(self.config), "params": self.config.as_dict(),
            "recorded_us": self.recorded_us, "median_us": self.median_us, "p20_us": self.p20_us,
            "p80_us": self.p80_us, "tflops": self.tflops, "max_error": self.max_error,
            "cached": self.cached, "failure": self.failure, "ratios": dict(self.ratios),
        }


@dataclass(frozen=True)
class BenchResult:
    """The configs and the SDPA baselines, measured in one run on ``device``."""

    study: str
    problem: Problem
    device: dict[str, Any] | None = field(hash=False)
    baselines: dict[str, float | None] = field(hash=False)          # backend -> µs (None: cannot run)
    baseline_tflops: dict[str, float | None] = field(hash=False)
    baseline_reasons: dict[str, str] = field(default_factory=dict, hash=False)  # why a backend is None
    rows: tuple[BenchRow, ...] = ()
    recorded_baselines: bool = False            # the baselines were written to the study

    @property
    def best(self) -> BenchRow | None:
        """The fastest row measured in this run (None if every row failed)."""
        measured = [r for r in self.rows if r.ok]
        return min(measured, key=lambda r: (r.median_us, r.trial)) if measured else None

    def as_json(self) -> dict[str, Any]:
        best = self.best
        return {
            "study": self.study,
            "problem": self.problem.as_dict(),
            "shape": str(self.problem.shape),
            "device": self.device,
            "baselines": {
                name: {"us": us, "tflops": self.baseline_tflops.get(name),
                       **({"reason": self.baseline_reasons[name]} if name in self.baseline_reasons else {})}
                for name, us in self.baselines.items()
            },
            "rows": [row.as_dict() for row in self.rows],
            "best": best.as_dict() if best is not None else None,
            "recorded_baselines": self.recorded_baselines,
        }


def ratios(baselines: dict[str, float | None], median_us: float | None) -> dict[str, float | None]:
    """``sdpa_us / median_us`` per backend (None where either side is missing)."""
    return {
        name: (us / median_us) if us and median_us and median_us > 0 else None
        for name, us in baselines.items()
    }


def best_configs(summary: Any, space: Any, top: int) -> list[tuple[int, KernelConfig, float]]:
    """The ``top`` fastest distinct configs of a study's COMPLETE trials: (trial, config, recorded µs).

    A duplicate trial copies an earlier one's result, so each config is listed
    once, under the trial that measured it.
    """

    if top < 1:
        raise EvotunerError(f"--top: {top} is not a positive number of configs", "e.g. --top 5")
    complete = sorted(
        (t for t in summary.trials if t.state == "COMPLETE" and t.value is not None),
        key=lambda t: (t.value, t.number),
    )
    chosen: list[tuple[int, KernelConfig, float]] = []
    seen: set[KernelConfig] = set()
    for record in complete:
        config = config_of(record.params, space)
        if config is None or config in seen:
            continue
        seen.add(config)
        chosen.append((record.number, config, float(record.value)))
        if len(chosen) == top:
            break
    return chosen


def bench_study(
    store: Any,
    study: str,
    *,
    builder: Any,
    measure: MeasureStage,
    top: int = 5,
    record_baselines: bool = True,
) -> BenchResult:
    """Re-measure the best ``top`` configs of ``study`` and SDPA's backends in one run.

    ``store`` is an :class:`evotuner.storage.StudyStore`; ``builder`` an
    :class:`evotuner.compiler.Builder` for the study's kernel family; ``measure``
    any MeasureStage (GpuMeasure on a GPU). With ``record_baselines`` the
    device and the baselines measured here are written to the study (the
    study's summary then shows this device's baselines). Raises
    :class:`EvotunerError` when the study has no COMPLETE trial.
    """
    summary = store.summary(study)
    problem = summary.problem
    space = stored_space(store.space_text(study), study, summary.space_name)
    chosen = best_configs(summary, space, top)
    if not chosen:
        raise EvotunerError(
            f"study {study!r} has no COMPLETE trial to bench",
            f"run `evotuner search --study {study} ...` (or `evotuner resume --study {study}`) first",
        )
    device = measure.device()
    baselines = dict(measure.baselines(problem))
    reasons = dict(getattr(measure, "baseline_reasons", None) or {})
    rows = tuple(_bench_one(number, config, recorded, problem, builder, measure, baselines)
                 for number, config, recorded in chosen)
    if record_baselines:
        if device is not None:
            store.record_device(study, device)
        store.record_baselines(study, device, problem, baselines)
    return BenchResult(
        study=study, problem=problem, device=device, baselines=baselines,
        baseline_tflops={k: problem.tflops(v) if v else None for k, v in baselines.items()},
        baseline_reasons={k: str(v) for k, v in reasons.items() if baselines.get(k) is None},
        rows=rows, recorded_baselines=record_baselines,
    )


def _bench_one(number: int, config: KernelConfig, recorded: float, problem: Problem,
               builder: Any, measure: MeasureStage, baselines: dict[str, float | None]) -> BenchRow:
    build = builder.build(config, problem)    # never raises for a compile error
    if not build.ok or build.artifact is None:
        reason = (build.error or "no artifact").strip().splitlines()
        return BenchRow(number, config, recorded, cached=build.cached,
                        failure=f"build failed: {reason[0] if reason else 'no artifact'}")
    outcome = measure.measure(build.artifact, problem)
    if isinstance(outcome, MeasureFailure):
        return BenchRow(number, config, recorded, cached=build.cached, failure=f"{outcome.kind}: {outcome.reason}")
    if not isinstance(outcome, Measurement):
        raise TypeError(f"measure stage returned {type(outcome).__name__}, not a Measurement")
    return BenchRow(
        number, config, recorded, median_us=outcome.median_us, p20_us=outcome.p20_us, p80_us=outcome.p80_us,
        tflops=outcome.tflops, max_error=outcome.max_error, cached=build.cached,
        ratios=ratios(baselines, outcome.median_us),
    )
