"""One host, many GPUs: one coordinator and one measure worker per GPU.

``evotuner search ... --gpus 0,1,3`` (or ``--gpus all``) runs, in one process, one
coordinator -- the study's sampler, its budget, the build pool and the build cache, all
shared -- and one search thread per GPU, each with its own measure stage (a
:class:`~evotuner.measure.GpuMeasure` worker *process* bound to that device index, or a
replay standing for it). Each thread is a worker of the study like any other process
(:mod:`evotuner.workers`): it claims budget slots and configs in the database, so no
config is measured twice and the study ends with exactly ``--trials`` finished trials;
every measurement and baseline records the device it ran on.

GPUs of different models make timings incomparable: :func:`check_same_model` refuses a
mix unless ``allow_mixed`` is given; ``evotuner bench`` re-measures the winners on one
GPU before ``export``.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from evotuner import stopping
from evotuner.errors import EvotunerError, StudyMismatchError
from evotuner.judge import Fastest
from evotuner.measure.base import MeasureStage
from evotuner.workers import StudyWorker

#: nvidia-smi must answer within this many seconds.
SMI_TIMEOUT_S = 20
#: Seconds each ``--gpus`` thread gets, after Ctrl-C or SIGTERM, to mark its trials in flight FAIL.
STOP_GRACE_S = 30


def parse_gpus(spec: str, visible: Callable[[], int] | None = None) -> list[int]:
    """``"0,1,3"`` -> [0, 1, 3]; ``"all"`` -> every GPU nvidia-smi lists."""
    text = spec.strip().lower()
    if text == "all":
        count = (visible or gpu_count)()
        if count < 1:
            raise EvotunerError("--gpus all: no GPU is visible", "check nvidia-smi, or name the GPUs: --gpus 0,1")
        return list(range(count))
    try:
        indices = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise EvotunerError(f"--gpus {spec!r}: not a list of GPU indices", "e.g. --gpus 0,1 or --gpus all") from None
    if not indices or any(i < 0 for i in indices):
        raise EvotunerError(f"--gpus {spec!r}: not a list of GPU indices", "e.g. --gpus 0,1 or --gpus all")
    if len(set(indices)) != len(indices):
        raise EvotunerError(f"--gpus {spec!r}: a GPU is named twice", "name each GPU once")
    return indices


def gpu_count() -> int:
    """GPUs nvidia-smi lists (the coordinator never initialises CUDA itself)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def check_same_model(fingerprints: Sequence[dict[str, Any] | None], allow_mixed: bool) -> None:
    names = {str(f.get("name")) for f in fingerprints if f}
    if len(names) > 1 and not allow_mixed:
        raise StudyMismatchError(
            f"--gpus: the GPUs are of different models ({', '.join(sorted(names))}); one study's timings "
            f"would mix them",
            "pick GPUs of one model, or pass --mixed-gpus (and re-measure the winners with `evotuner bench`)",
        )


def run_multi(
    *,
    store: Any,
    study_name: str,
    measures: Sequence[MeasureStage],
    sampler_for: Callable[[int | None], Any],
    seed: int | None,
    stale_after: float | None = None,
    allow_mixed: bool = False,
    on_event: Callable[[object], None] | None = None,
    batch: int | None = None,
    **search: Any,
) -> Any:
    """Run ``run_search`` once per measure stage, in threads sharing one sampler and the
    ``builder`` in ``search``; returns the combined :class:`~evotuner.loop.SearchResult`."""
    from dataclasses import replace

    from evotuner.loop import run_search

    if not measures:
        raise EvotunerError("--gpus: no GPU to measure on", "e.g. --gpus 0")
    check_same_model(_models(measures), allow_mixed)
    lock = threading.Lock()
    ask_lock = threading.Lock()   # the one sampler: one ask and suggest at a time
    fastest = Fastest()           # every GPU races against the fastest any of them measured

    def emit(event: object) -> None:
        if on_event is not None:
            with lock:
                on_event(event)

    workers = [StudyWorker(store, study_name, stale_after=stale_after, device=_label(m, i), seat=(i == 0))
               for i, m in enumerate(measures)]
    workers[0].join()
    sampler = sampler_for(workers[0].seed_for(seed))   # the coordinator's one sampler
    for w in workers[1:]:
        w.join()
    jobs = getattr(search.get("builder"), "jobs", None) or 1
    per_thread = batch if batch is not None else max(2, jobs // len(measures))
    results: list[Any] = [None] * len(measures)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = run_search(store=store, study_name=study_name, sampler=sampler, seed=seed,
                                    measure=measures[i], worker=workers[i], on_event=emit, batch=per_thread,
                                    allow_mixed_gpus=allow_mixed, ask_lock=ask_lock, fastest=fastest, **search)
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,), name=f"evotuner-gpu-{i}", daemon=True)
               for i in range(len(measures))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)
    except KeyboardInterrupt:   # only this thread hears the signal: stop the others' loops too
        stopping.request()
        for t in threads:
            t.join(timeout=STOP_GRACE_S)
        raise
    finally:
        for w in workers:
            w.leave("done" if not errors else "ended by an error")
    if errors:
        raise errors[0]
    done = [r for r in results if r is not None]
    finished = store.count_finished(study_name)
    counts = {state: 0 for state in done[0].counts}
    for rec in store.finished_trials(study_name):
        counts[rec.state] = counts.get(rec.state, 0) + 1
    best = min((r.best for r in done if r.best is not None), key=lambda b: b.median_us, default=None)
    outcome = "done" if finished >= done[0].target else next(
        (r.outcome for r in done if r.outcome == "exhausted"), done[0].outcome)
    timings = {key: sum(r.timings.get(key, 0.0) for r in done) for key in done[0].timings}
    return replace(done[0], outcome=outcome, finished=finished, new_trials=sum(r.new_trials for r in done),
                   counts=counts, best=best, zombies=tuple(z for r in done for z in r.zombies),
                   timings=timings, threads=len(done),
                   measured=sum(r.measured for r in done), stopped_early=sum(r.stopped_early for r in done))


def _models(measures: Sequence[MeasureStage]) -> list[dict[str, Any] | None]:
    """Every stage's GPU model, for :func:`check_same_model`, without waiting for the GPU
    workers' start (``model_name``: nvidia-smi for a GPU stage), so the first builds are
    not held back by it; stages that can only tell from their fingerprint are asked at
    once, each starting its worker in parallel."""
    if len(measures) == 1:
        names = [measures[0].model_name()]
    else:
        with ThreadPoolExecutor(max_workers=len(measures), thread_name_prefix="evotuner-gpu-model") as pool:
            names = list(pool.map(lambda m: m.model_name(), measures))
    return [None if name is None else {"name": name} for name in names]


def _label(measure: MeasureStage, index: int) -> dict[str, Any]:
    device = getattr(measure, "device_index", index)
    return {"device_index": device}
