"""The measure stage: Measurement | MeasureFailure for a built artifact.

``GpuMeasure`` runs every kernel in a separate worker process
(``python -m evotuner.measure.worker``); this package never imports torch or
touches CUDA in the calling process. ``gpu_available()`` answers whether a GPU
can be used without initializing CUDA here.
"""

from evotuner.measure.base import (
    FAILURE_KINDS, Measurement, MeasureFailure, MeasureOutcome, MeasureStage, PendingMeasure,
)
from evotuner.measure.gpu import BASELINES, GpuMeasure, gpu_available, require_gpu

__all__ = [
    "BASELINES", "FAILURE_KINDS", "GpuMeasure", "MeasureFailure", "MeasureOutcome", "MeasureStage",
    "Measurement", "PendingMeasure", "gpu_available", "require_gpu",
]
