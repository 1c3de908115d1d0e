"""The composition root: open a study database, create or load a study (with its
mismatch checks), rebuild a study's space, and build the stages a search runs.

The CLI, ``evotuner bench``, scripts/bench_tuner.py and the tests all wire the
stages through here. A measure stage other than the GPU worker (a test's
scaffold, a benchmark's timed wrapper) is *injected*: pass ``measure_factory``
to :class:`StageFactory` (the CLI's ``main(..., measure_factory=...)`` does);
nothing is loaded from a path named at run time.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import evotuner.measure as measure_pkg
from evotuner.compiler import Builder
from evotuner.defaults import recommended
from evotuner.errors import NoGpuError, StorageError, StudyMismatchError
from evotuner.loop import SearchResult, run_search
from evotuner.measure.base import MeasureStage
from evotuner.measure.replay import ReplayMeasure
from evotuner.problem import Problem, Shape
from evotuner.propose import make_sampler
from evotuner.space import SearchSpace, parse_space
from evotuner.storage import StudyStore
from evotuner.storage.connect import resolve_url, sqlite_path

#: Makes a measure stage (a context manager, entered by the caller's ExitStack).
MeasureFactory = Callable[[], MeasureStage]

def no_gpu(command: str = "search") -> NoGpuError:
    """The refusal on a machine without a GPU, naming the command the user ran and what works here."""
    instead = ("`evotuner search --replay SWEEP.csv`, `compile`, `show`, `export` and `report` work here"
               if command in ("search", "resume") else "`evotuner compile`, `show`, `export` and `report` work here")
    return NoGpuError(f"no CUDA GPU on this machine: evotuner {command} needs one to measure; {instead}",
                      f"run evotuner {command} on a machine with an NVIDIA Hopper GPU")


NO_GPU = no_gpu("search")


def open_store(url: str, *, must_exist: bool = False, read_only: bool = False) -> StudyStore:
    """The study database; ``must_exist``: refuse (creating nothing) when a SQLite file is missing;
    ``read_only``: open it without writing (show, export, report)."""
    path = sqlite_path(resolve_url(url))
    try:
        missing = path is not None and not path.exists()
    except OSError as exc:   # a folder on the way cannot be searched
        raise StorageError(f"database {path} cannot be reached ({exc.strerror})",
                           "check the permissions of the folders above it, or point --storage elsewhere") from None
    if must_exist and missing:
        raise StorageError(
            f"no study database at {path}",
            "run `evotuner search` first, or point --storage / $EVOTUNER_STORAGE at the database",
        )
    return StudyStore(url, read_only=read_only)


def study_space(store: StudyStore, study: str) -> SearchSpace:
    """The space a study was created with, rebuilt from the text the store keeps."""
    info = store.summary(study)                 # StorageError naming the study if not found
    return parse_space(store.space_text(study), f"study {study!r} space {info.space_name!r}")


@dataclass(frozen=True)
class StageFactory:
    """Makes the (builder, measure) pair for a study's problem and space.

    ``replay``: a recorded sweep answers builds and measurements (no nvcc, no GPU).
    ``measure_factory``: an injected measure stage (tests, benchmarks); None: the GPU
    worker, refused at once (:func:`no_gpu`) on a machine without a GPU.
    """

    measure_factory: MeasureFactory | None = None
    replay: Path | None = None

    def ready(self, command: str = "search") -> "StageFactory":
        """This factory with its measure stage resolved; refuses without a GPU (unless replaying
        or injected) before anything is opened, naming ``command``."""
        if self.replay is not None or self.measure_factory is not None:
            return self
        if not measure_pkg.gpu_available():
            raise no_gpu(command)
        return StageFactory(measure_pkg.GpuMeasure, None)

    def builder(self, space: SearchSpace, jobs: int | None, stack: ExitStack) -> Builder:
        return stack.enter_context(Builder(space.kernel, arch=space.arch, jobs=jobs))

    def stages(self, problem: Problem, space: SearchSpace, jobs: int | None,
               stack: ExitStack) -> tuple[Any, MeasureStage]:
        if self.replay is not None:
            measure = stack.enter_context(ReplayMeasure(self.replay, problem, space))
            return measure.builder(jobs or os.cpu_count() or 1), measure
        factory = self.ready().measure_factory
        assert factory is not None
        return self.builder(space, jobs, stack), stack.enter_context(factory())

    def with_budget(self, budget_s: float) -> "StageFactory":
        """The GPU stage with ``budget_s``; an injected factory takes no options and is kept as is."""
        factory = self.ready().measure_factory
        if isinstance(factory, type) and issubclass(factory, measure_pkg.GpuMeasure):
            gpu = factory
            return StageFactory(lambda: gpu(budget_s=budget_s), self.replay)
        return self


def start_study(store: StudyStore, study: str, problem: Problem, space: SearchSpace, sampler: str, seed: int,
                builder: Any) -> bool:
    """Create ``study``, or check that the existing one has this problem, space, sampler and
    seed (StudyMismatchError naming the difference). True when it was created."""
    if store.study_exists(study):
        store.load_study(study, problem=problem, space=space)   # refuses a problem/space mismatch
        recorded = store.summary(study)
        if (recorded.sampler, recorded.seed) != (sampler, seed):
            raise StudyMismatchError(
                f"study {study!r} runs sampler {recorded.sampler} with seed {recorded.seed}, "
                f"not {sampler} with seed {seed}",
                f"continue it with `evotuner resume --study {study}`, or choose another --study name",
            )
        return False
    store.create_study(study, problem, space, sampler, seed,
                       source_hash=builder.source_hash(), nvcc_version=builder.nvcc_version())
    return True


def check_exists(store: StudyStore, study: str, sampler: str, seed: int, problem: Problem,
                 space: SearchSpace) -> bool:
    """Before building any stage: True when ``study`` exists (and matches), False when new."""
    if not store.study_exists(study):
        return False
    start_study(store, study, problem, space, sampler, seed, builder=None)
    return True


@dataclass(frozen=True)
class Resumed:
    """What a resume continues: the study's own problem, space, sampler and seed."""

    problem: Problem
    space: SearchSpace
    sampler: str
    seed: int


def resume_study(store: StudyStore, study: str, *, shape: Shape | None = None,
                 space: SearchSpace | None = None) -> Resumed:
    """The study's problem, space, sampler and seed; ``shape``/``space`` given must equal the study's."""
    info = store.summary(study)                 # StorageError naming the study if not found
    problem = info.problem
    recorded = study_space(store, study)
    if shape is not None and shape != problem.shape:
        raise StudyMismatchError(
            f"study {study!r} tunes shape {problem.shape}, not {shape}",
            f"drop --shape (resume reads it from the study), or start a new study with "
            f"`evotuner search --study NEW --shape {shape}`",
        )
    if space is not None and space.fingerprint() != recorded.fingerprint():
        raise StudyMismatchError(
            f"study {study!r} was started with another search space than {space.path}",
            "drop --space (resume reads it from the study), or start a new study",
        )
    return Resumed(problem, recorded, info.sampler, info.seed)


def run_study(store: StudyStore, study: str, problem: Problem, space: SearchSpace, sampler: str, seed: int,
              trials: int, builder: Any, measure: MeasureStage,
              on_event: Callable[[object], None] | None = None) -> SearchResult:
    """Run ``study`` to ``trials`` finished trials; a new study starts from its family's
    recommended config."""
    return run_search(
        store=store, study_name=study, problem=problem, space=space,
        sampler=make_sampler(sampler, space, seed, problem), seed=seed, trials=trials,
        builder=builder, measure=measure, on_event=on_event, start=recommended(problem, space.kernel),
    )
