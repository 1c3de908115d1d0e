"""The device a search measures on, and the study's SDPA baselines on it.

The loop fingerprints the device once its first builds are under way (the measure stage
starts in the background meanwhile), and measures the baselines at the first moment the GPU
would otherwise idle: while the oldest build compiles, or right after the first measurement
(docs/measurement.md). Baselines belong to a device: a resume on another GPU measures its
own, and of several searches on one device only one measures them (the coordinator's
``once``); the others read them.
"""

from __future__ import annotations

from typing import Any, Callable

from evotuner import events as ev
from evotuner.coordinator import Coordinator, baselines_key
from evotuner.errors import StudyMismatchError
from evotuner.measure.base import MeasureStage
from evotuner.problem import Problem


class DeviceStart:
    """One search's device and baselines (study ``study`` of ``store``); ``emit`` the loop's
    event callback. ``allow_mixed_gpus``: join a study measured on other GPU models too."""

    def __init__(self, store: Any, study: str, problem: Problem, measure: MeasureStage,
                 coordinator: Coordinator, emit: Callable[[object], None], *, allow_mixed_gpus: bool) -> None:
        self.store = store
        self.study = study
        self.problem = problem
        self.measure = measure
        self.coordinator = coordinator
        self.emit = emit
        self.allow_mixed_gpus = allow_mixed_gpus
        #: The measure stage's fingerprint (None before :meth:`fingerprint`, or for a stage without one).
        self.device: dict[str, Any] | None = None
        #: Which GPU measures this search's trials (name, index): the ``device`` trial attr.
        self.tag: dict[str, Any] = {}
        #: The baselines on this device once known (None before).
        self.baselines: dict[str, float | None] | None = None
        self.pending = False             # device known, baselines not known yet

    @property
    def model(self) -> str | None:
        """The GPU model's name (racing's incumbent must come from the same model)."""
        return self.tag.get("name")

    def fingerprint(self) -> None:
        """Record this search's device (waits for the measure stage to be up); the baselines
        are due after (:meth:`due`). Refuses a GPU model the study's other searches do not
        measure on, unless ``allow_mixed_gpus``."""
        device = self.measure.device()
        self.device = device
        if device is not None:
            self.tag = {k: device[k] for k in ("name", "device_index") if device.get(k) is not None}
            self._refuse_mixed_models()
        if device is not None and self.store.record_device(self.study, device):
            self.emit(ev.DeviceChanged(str(device.get("name", "unknown device"))))
        self.pending = True

    def due(self, *, idle: bool, measured: int) -> bool:
        """The baselines are pending and the first measurement is done, or nothing is in
        flight (``idle``): nothing waits behind them."""
        return self.pending and (idle or measured > 0)

    def measure_baselines(self, wait: Callable[[], None] | None) -> dict[str, float | None] | None:
        """SDPA baselines once per study and device: measured here if this search gets to,
        else read once another search recorded them (``wait``: between looks until then;
        None: return None at once and try again later). Returns them when known now."""
        device = self.device
        recorded: dict[str, float | None] = {}

        def ready() -> bool:
            nonlocal recorded
            recorded = self.store.baselines(self.study, device)
            return bool(recorded)

        def run() -> None:
            nonlocal recorded
            recorded = dict(self.measure.baselines(self.problem))
            self.store.record_baselines(self.study, device, self.problem, recorded)

        if not self.coordinator.once(baselines_key(device), run, ready=ready, wait=wait):
            return None
        self.baselines = recorded
        self.pending = False
        return recorded

    def _refuse_mixed_models(self) -> None:
        """Timings of one study must come from one GPU model: refuse to join searches that
        measure on another (unless ``allow_mixed_gpus``)."""
        others = self.coordinator.measure_on(self.tag)
        name = self.tag.get("name")
        if name and others - {name} and not self.allow_mixed_gpus:
            raise StudyMismatchError(
                f"study {self.study!r} is being measured on {', '.join(sorted(others))} by other workers; "
                f"this one measures on {name}, and one study's timings must not mix GPU models",
                "run this worker on a GPU of the same model, or pass --mixed-gpus to all workers",
            )
