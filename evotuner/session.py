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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import evotuner.measure as measure_pkg
from evotuner import events as ev
from evotuner.compiler import Builder
from evotuner.config import KernelConfig
from evotuner.defaults import config_family, recommended
from evotuner.errors import EvotunerError, NoGpuError, SpaceError, StorageError, StudyMismatchError
from evotuner.loop import SearchResult, run_search
from evotuner.measure.base import MeasureStage
from evotuner.measure.racing import DEFAULT_RULE, PAIRED_MARGIN, RaceRule
from evotuner.measure.replay import ReplayMeasure
from evotuner.numbers import parse_real
from evotuner.problem import Problem, shape_values_text
from evotuner.propose import MODEL_SAMPLERS, make_sampler
from evotuner.space import SearchSpace, load_space, stored_space
from evotuner.storage import StudyStore
from evotuner.storage.connect import resolve_url, sqlite_path
from evotuner.storage.start import await_study, ensure_study

#: Makes a measure stage (a context manager, entered by the caller's ExitStack).
MeasureFactory = Callable[[], MeasureStage]

def no_gpu(command: str = "search") -> NoGpuError:
    """The refusal on a machine without a GPU, naming the command the user ran and what works here."""
    replay = {"search": "`evotuner search --replay SWEEP.csv`",
              "resume": "`evotuner resume --replay SWEEP.csv` (with the sweep a replayed study was made from)"}
    instead = (f"{replay.get(command, '`search --replay SWEEP.csv` (a study answered from a recorded sweep)')}, "
               "`compile`, `show`, `export` and `report` work here")
    return NoGpuError(f"no CUDA GPU on this machine: evotuner {command} needs one to measure; {instead}",
                      f"run evotuner {command} on a machine with an NVIDIA Hopper GPU")


NO_GPU = no_gpu("search")


def open_store(url: str | None, *, must_exist: bool = False, read_only: bool = False,
               named_by: str = "--storage / $EVOTUNER_STORAGE") -> StudyStore:
    """The study database; ``must_exist``: refuse (creating nothing) when a SQLite file is missing;
    ``read_only``: open it without writing (show, export, report); ``named_by``: what named the
    database, for the remedies (the CLI's option, or the served tuned table's source)."""
    path = sqlite_path(resolve_url(url))
    try:
        missing = path is not None and not path.exists()
    except OSError as exc:   # a folder on the way cannot be searched
        raise StorageError(f"database {path} cannot be reached ({exc.strerror})",
                           f"check the permissions of the folders above it, or point {named_by} elsewhere") from None
    if must_exist and missing:
        raise StorageError(
            f"no study database at {path}",
            f"run `evotuner search` first, or point {named_by} at the database",
        )
    if must_exist and path is not None and path.is_file() and path.stat().st_size == 0:
        # an empty file holds no study: say so before opening it writes evotuner's tables into it
        raise StorageError(f"database {path} is empty: it holds no study",
                           f"run `evotuner search` first, or point {named_by} at the study database")
    return StudyStore(url, read_only=read_only, named_by=named_by)


def creates_database(url: str | None) -> bool:
    """Whether opening ``url`` makes a new SQLite file (none is there yet): then no study can
    be read from it, and a command checks its options before opening it, so that a refused
    command leaves no database behind."""
    path = sqlite_path(resolve_url(url))
    try:
        return path is not None and not path.exists()
    except OSError:
        return False


def study_space(store: StudyStore, study: str) -> SearchSpace:
    """The space a study was created with, rebuilt from the text the store keeps."""
    info = store.summary(study)                 # StorageError naming the study if not found
    return stored_space(store.space_text(study), study, info.space_name)


def gpu_list(gpus: str | None, replay: Path | None) -> tuple[int, ...] | None:
    """--gpus as device indices (None: not given); ``all`` with --replay means GPU 0."""
    if gpus is None:
        return None
    from evotuner.multigpu import parse_gpus

    return tuple(parse_gpus(gpus, (lambda: 1) if replay is not None else None))


#: The longest --replay-delay part (seconds): a rehearsal, not a real build or measurement.
MAX_REPLAY_DELAY_S = 600.0


def replay_delay(text: str | None, replay: Path | None) -> tuple[float, float]:
    """--replay-delay BUILD,MEASURE as seconds (0, 0 when not given); needs --replay."""
    if text is None:
        return 0.0, 0.0
    if replay is None:
        raise EvotunerError("--replay-delay needs --replay FILE", "drop --replay-delay, or replay a sweep")
    return parse_replay_delay(text)


def parse_replay_delay(text: str) -> tuple[float, float]:
    """BUILD,MEASURE seconds, each finite and in [0, MAX_REPLAY_DELAY_S]; else EvotunerError."""
    parts = text.split(",")
    if len(parts) != 2:
        raise EvotunerError(f"--replay-delay {text!r}: not BUILD,MEASURE seconds", "e.g. --replay-delay 0.05,0.02")
    build_s, measure_s = (parse_real(part, f"--replay-delay {what}", lo=0.0, hi=MAX_REPLAY_DELAY_S,
                                     remedy="e.g. --replay-delay 0.05,0.02")
                          for what, part in zip(("BUILD", "MEASURE"), parts))
    return build_s, measure_s


@dataclass(frozen=True)
class StageFactory:
    """Makes the (builder, measure) pair for a study's problem and space.

    ``replay``: a recorded sweep answers builds and measurements (no nvcc, no GPU);
    ``delay``: (build, measure) seconds each replayed answer takes. ``measure_factory``:
    an injected measure stage (tests, benchmarks); None: the GPU worker, refused at once
    (:func:`no_gpu`) on a machine without a GPU. ``gpus``: device indices (``--gpus``);
    then ``stages`` returns a list of measure stages, one per GPU.
    """

    measure_factory: MeasureFactory | None = None
    replay: Path | None = None
    delay: tuple[float, float] = (0.0, 0.0)
    gpus: tuple[int, ...] | None = None

    def ready(self, command: str = "search") -> "StageFactory":
        """This factory with its measure stage resolved; refuses without a GPU (unless replaying
        or injected) before anything is opened, naming ``command``."""
        if self.replay is not None or self.measure_factory is not None:
            return self
        if not measure_pkg.gpu_available():
            raise no_gpu(command)
        return StageFactory(measure_pkg.GpuMeasure, None, self.delay, self.gpus)

    def check(self, problem: Problem, space: SearchSpace) -> None:
        """Refuse now what :meth:`stages` would: a replayed sweep recorded for another problem or
        space, or not there (ReplayError / StudyMismatchError); nothing to check on a GPU."""
        if self.replay is not None:
            ReplayMeasure(self.replay, problem, space)

    def builder(self, space: SearchSpace, jobs: int | None, stack: ExitStack) -> Builder:
        return stack.enter_context(Builder(space.kernel, arch=space.arch, jobs=jobs))

    def stages(self, problem: Problem, space: SearchSpace, jobs: int | None,
               stack: ExitStack, started: list[Any] | None = None) -> tuple[Any, Any]:
        """(builder, measure stage, or a list of them with ``gpus``); ``started``: the measure
        stages :meth:`start` made (else they are made and started here)."""
        gpus = self.gpus
        if self.replay is not None:
            replay = self.replay
            build_s, measure_s = self.delay

            def one(index: int | None) -> ReplayMeasure:
                return stack.enter_context(ReplayMeasure(replay, problem, space, build_s=build_s,
                                                         measure_s=measure_s, device_index=index))
            measure = one(gpus[0] if gpus else None)
            builder = stack.enter_context(measure.builder(jobs or os.cpu_count() or 1))
            if gpus is None:
                return builder, measure
            return builder, [measure, *(one(i) for i in gpus[1:])]
        measures = started or self.start(stack)
        builder = self.builder(space, jobs, stack)
        return builder, (measures[0] if gpus is None else measures)

    def start(self, stack: ExitStack) -> list[Any]:
        """Make and start the measure stages now, for :meth:`stages` (``started``); none when
        replaying. The command calls it first, so the GPU worker's torch import and CUDA
        context (seconds) come up while it opens the study database and makes the sampler."""
        if self.replay is not None:
            return []
        factory = self.ready().measure_factory
        assert factory is not None
        gpus = self.gpus
        gpu_class = measure_pkg.GpuMeasure
        if gpus is None:
            measures = [stack.enter_context(factory())]
        elif isinstance(factory, type) and issubclass(factory, gpu_class):
            measures = [stack.enter_context(factory(device_index=i)) for i in gpus]
        else:
            measures = [stack.enter_context(factory()) for _ in gpus]
        for stage in measures:     # started at once: the worker comes up while the rest gets going
            start = getattr(stage, "start", None)     # an injected stage may be duck-typed
            if callable(start):
                start()
        return measures

    def with_budget(self, budget_s: float) -> "StageFactory":
        """The GPU stage with ``budget_s``; an injected factory takes no options and is kept as is."""
        factory = self.ready().measure_factory
        if isinstance(factory, type) and issubclass(factory, measure_pkg.GpuMeasure):
            gpu = factory
            return StageFactory(lambda: gpu(budget_s=budget_s), self.replay, self.delay, self.gpus)
        return self


def packaged_spaces() -> dict[str, Path]:
    """The space files a command may name instead of a path: the packaged ones by file stem
    (``flashcore``, ``hopper``, ``hopper_grid``, ``hopper_wide``), each family's default space
    by the family's name, and ``default``: the default family's space (FlashCore's
    ``flashcore.toml``, named ``default.toml`` before space files were named after their family)."""
    from evotuner.family import DEFAULT_FAMILY, families, get_family
    from evotuner.family.base import packaged

    folder = packaged("evotuner.search_spaces")
    names = {p.stem: p for p in sorted(folder.glob("*.toml"))} if folder.is_dir() else {}
    for fam in families():
        names.setdefault(fam.name, fam.default_space())
    names.setdefault("default", get_family(DEFAULT_FAMILY).default_space())
    return names


def pick_space(space: str | Path | None = None, *, family: str | None = None, problem: Problem | None = None,
               replay: Path | None = None, store: StudyStore | None = None, study: str | None = None,
               on_wait: Callable[[str], None] | None = None) -> tuple[SearchSpace, str | None]:
    """The space a command works on, and a note saying why when the user did not name it:

    ``space`` (a file, or a packaged name: :func:`packaged_spaces`), else ``family``'s
    default space, else the space of the existing ``study``, else the packaged space the
    ``replay`` sweep was recorded with, else the default space of the family
    ``evotuner.flash_attention`` runs for ``problem`` (its recommended config is fastest)."""
    from evotuner.defaults import fastest_recommended
    from evotuner.family import get_family
    from evotuner.space import load_space

    if space is not None:
        chosen = load_space(_space_path(space))
        if family is not None and chosen.kernel != family:
            raise EvotunerError(f"--space {space} tunes the {chosen.kernel} family, not --family {family}",
                                "drop one of the two options")
        _takes_packed(chosen.kernel, problem, f"--space {space}")
        return chosen, None
    if family is not None:
        if problem is not None:
            _takes_packed(family, problem, f"--family {family}")
            return load_space(get_family(family).space_for(problem)), None
        return load_space(family=family), None
    # a worker starting beside its creator: the study may be on the way (or its creator died)
    if (store is not None and study is not None and store.study_exists(study)
            and await_study(store, study, on_wait=on_wait) is True):
        return study_space(store, study), None
    if replay is not None:
        from evotuner.measure.sweep import read_sweep

        recorded = read_sweep(replay).header.get("space_fingerprint")
        for name, path in packaged_spaces().items():
            candidate = load_space(path)
            if candidate.fingerprint() == recorded:
                return candidate, f"space {name}: the packaged space {replay.name} was recorded with"
    if problem is None:
        return load_space(None), None
    fam = fastest_recommended(problem)[0]
    chosen = load_space(fam.space_for(problem))
    call = "evotuner.flash_attention_varlen" if problem.varlen else "evotuner.flash_attention"
    return chosen, (f"tuning the {fam.name} family (space {Path(str(chosen.path)).stem}): the kernel "
                    f"{call} runs for {problem}; --family or --space picks another")


def _takes_packed(family: str, problem: Problem | None, option: str) -> None:
    """Refuse a family without a packed kernel for a packed problem, naming the option."""
    from evotuner.family import get_family

    fam = get_family(family)
    if problem is not None and problem.varlen and not fam.varlen:
        raise EvotunerError(f"{option}: the {fam.name} family has no kernel for packed variable-length batches",
                            "tune a packed problem (--lengths) with the hopper family: drop the option or name hopper")


def _refuses_problem(space: SearchSpace, problem: Problem) -> bool:
    """True when a constraint of ``space`` naming only the problem and device (its head dims) fails at ``problem``."""
    from evotuner.spacemodel import problem_env

    env = {**problem_env(problem), **space.device.as_dict()}
    try:                              # an expression it cannot evaluate here: let validation speak
        return any(not c.expr.evaluate(env) for c in space.constraints if set(c.expr.names) <= set(env))
    except SpaceError:
        return False


def space_for_config(config: KernelConfig, problem: Problem) -> SearchSpace:
    """The packaged space of the family ``config`` names that takes it (:meth:`SearchSpace.validate`),
    among those whose problem-only constraints (head dims) take ``problem`` (all when none does):
    the space for ``problem`` (hopper: hopper_split.toml when small), else another; else the one
    with the fewest of the config's values unlisted, the most values of those parameters listed,
    then the family's default space, then the space for ``problem`` (validation then names a
    value that is really wrong, in the space that documents its parameter)."""
    fam = config_family(config)
    first, default = fam.space_for(problem), fam.default_space()
    paths = list(dict.fromkeys((first, default, *packaged_spaces().values())))
    spaces = [s for s in map(load_space, paths) if s.kernel == fam.name]
    spaces = [s for s in spaces if not _refuses_problem(s, problem)] or spaces
    for candidate in spaces:
        try:
            candidate.validate(config)   # its parameters, a knob it leaves out at the family's default
        except SpaceError:
            continue
        return candidate

    def rank(space: SearchSpace) -> tuple[int, int, int]:
        allowed = {p.name: set(p.values) for p in space.params}
        misfit = [name for name, value in config if value not in allowed.get(name, ())]
        listed = sum(len(allowed.get(name, ())) for name in misfit)
        return len(misfit), -listed, 0 if Path(space.path).resolve() == Path(default).resolve() else 1

    return min(spaces, key=rank) if spaces else load_space(paths[0])


def _space_path(space: str | Path) -> Path:
    """A space file's path from a path or a packaged space's name."""
    path = Path(space)
    if path.is_file():
        return path
    named = packaged_spaces()
    text = str(space)
    if text in named:
        return named[text]
    if text.strip() and (path.suffix or "/" in text or os.sep in text or path.exists()):   # '' is not '.'
        return path        # load_space says the file is not found, or is a folder
    raise EvotunerError(f"--space {text!r}: no such file and no packaged space of that name",
                        f"give a space file, or one of {', '.join(sorted(named))}")


def sampler_name(given: str | None, space: SearchSpace) -> str:
    """``--sampler`` as given, else the default of the space's kernel family."""
    from evotuner.family.registry import get_family

    return given if given is not None else get_family(space.kernel).default_sampler   # '' is refused as unknown


def start_study(store: StudyStore, study: str, problem: Problem, space: SearchSpace, sampler: str, seed: int,
                builder: Any, on_wait: Callable[[str], None] | None = None) -> bool:
    """Create ``study``, or check that the existing one has this problem, space, sampler and
    seed (StudyMismatchError naming the difference). True when it was created. Several
    workers may start one study at once: one creates it, the others wait for its row and
    check it (:func:`evotuner.storage.start.ensure_study`); a wait of more than a second is
    told to ``on_wait`` once."""
    if problem.varlen and not problem.lengths_q:
        raise EvotunerError(f"problem {problem}: a packed problem without sequence lengths cannot be measured",
                            "give the lengths: Problem.packed(lengths, ...) or `evotuner search --lengths ...`")
    space.check_feasible(problem)        # a space that would propose nothing makes no study
    if builder is not None and ensure_study(store, study, lambda replacing: store.create_study(
            study, problem, space, sampler, seed, source_hash=builder.source_hash(),
            nvcc_version=builder.nvcc_version(), replacing=replacing), on_wait=on_wait):
        return True
    # its creator may not have completed it yet
    if store.study_exists(study) and await_study(store, study, on_wait=on_wait) is True:
        store.load_study(study, problem=problem, space=space)   # refuses a problem/space mismatch
        recorded = store.summary(study)
        if (recorded.sampler, recorded.seed) != (sampler, seed):
            raise StudyMismatchError(
                f"study {study!r} runs sampler {recorded.sampler} with seed {recorded.seed}, "
                f"not {sampler} with seed {seed}",
                f"continue it with `evotuner resume --study {study}`, or choose another --study name "
                f"(every worker of a study passes the study's --seed; each runs its own seed derived from it)",
            )
        return False
    raise StorageError(f"study {study!r} not found", "start it with `evotuner search`")


def check_exists(store: StudyStore, study: str, sampler: str, seed: int, problem: Problem,
                 space: SearchSpace, on_wait: Callable[[str], None] | None = None) -> bool:
    """Before building any stage: True when ``study`` exists (and matches), False when new."""
    if not store.study_exists(study) or await_study(store, study, on_wait=on_wait) is not True:
        return False                               # (start_study takes over a dead creation)
    start_study(store, study, problem, space, sampler, seed, builder=None, on_wait=on_wait)
    return True


@dataclass(frozen=True)
class Resumed:
    """What a resume continues: the study's own problem, space, sampler and seed."""

    problem: Problem
    space: SearchSpace
    sampler: str
    seed: int


def resume_study(store: StudyStore, study: str, *, shape: dict[str, int] | None = None,
                 space: SearchSpace | None = None) -> Resumed:
    """The study's problem, space, sampler and seed; the ``shape`` sizes given (--shape's keys,
    :func:`evotuner.problem.parse_shape_values`) and the ``space`` given must be the study's."""
    info = store.summary(study)                 # StorageError naming the study if not found
    problem = info.problem
    recorded = study_space(store, study)
    if shape and problem.shape.differs_from(shape):
        given = shape_values_text(shape)
        raise StudyMismatchError(f"study {study!r} tunes {problem}, not --shape {given}",
                                 "drop --shape (resume reads it from the study), or start a new study with "
                                 f"`evotuner search --study NEW --shape {given}`")
    if space is not None and space.fingerprint() != recorded.fingerprint():
        raise StudyMismatchError(
            f"study {study!r} was started with another search space than {space.path}",
            "drop --space (resume reads it from the study), or start a new study",
        )
    return Resumed(problem, recorded, info.sampler, info.seed)


def run_study(store: StudyStore, study: str, problem: Problem, space: SearchSpace, sampler: str, seed: int,
              trials: int, builder: Any, measure: MeasureStage,
              on_event: Callable[[object], None] | None = None, *, stale_after: float | None = None,
              mixed_gpus: bool = False, transfer: bool = True, racing: RaceRule | None = DEFAULT_RULE) -> SearchResult:
    """Run ``study`` to ``trials`` finished trials; a new study starts from its family's
    recommended config and, with ``transfer``, from the nearest studies of its family and GPU
    model in the database (:mod:`evotuner.transfer`: their measurements for a sampler of
    MODEL_SAMPLERS, their best configs enqueued for the others; the study records which, and
    its sampler reloads them whenever the study runs). Other workers may run the study at once
    (each worker samples with its own seed, derived from the study's); ``measure`` a list: one
    measure stage per GPU (``--gpus``), run by one coordinator (:mod:`evotuner.multigpu`).
    ``racing``: the rule by which a clearly slower config's timing stops early
    (:mod:`evotuner.measure.racing`, :func:`race_rule`); None gives every config the whole
    budget (``--full-timing``)."""
    first = measure[0] if isinstance(measure, list) else measure

    def sampler_for(worker_seed: int | None) -> Any:
        return make_sampler(sampler, space, worker_seed, problem,   # picks: one per GPU (GuidedSampler)
                            picks=len(measure) if isinstance(measure, list) else 1,
                            related=lambda: related_studies(store, study, problem, space, first))

    start: Any = recommended(problem, space.kernel)
    if transfer:                    # planned only if this worker starts a new study (loop._enqueue_start)
        recommended_start = start
        start = lambda: seeded_start(store, study, problem, space, first, recommended_start, on_event,  # noqa: E731
                                     takes_related=sampler in MODEL_SAMPLERS)
    common: dict[str, Any] = dict(store=store, study_name=study, problem=problem, space=space, trials=trials,
                                  builder=builder, on_event=on_event, start=start,
                                  racing=racing)
    if isinstance(measure, list):
        from evotuner.multigpu import run_multi

        return run_multi(measures=measure, sampler_for=sampler_for, seed=seed, stale_after=stale_after,
                         allow_mixed=mixed_gpus, **common)
    return run_search(sampler=sampler_for, seed=seed, measure=measure, stale_after=stale_after,
                      allow_mixed_gpus=mixed_gpus, **common)


def race_rule(*, full_timing: bool = False, paired: bool | None = None) -> RaceRule | None:
    """The racing rule of ``--full-timing`` (None: no racing) and ``--paired-race/--no-paired-race``
    (None: paired unless ``full_timing``; docs/measurement.md, "Paired racing", has the H100 runs)."""
    if paired is None:
        paired = not full_timing
    if full_timing and paired:
        raise EvotunerError("--full-timing times every config in full; --paired-race stops the slower ones early",
                            "drop one of the two options")
    if full_timing:
        return None
    return replace(DEFAULT_RULE, paired_margin=PAIRED_MARGIN) if paired else DEFAULT_RULE


def seeded_start(store: StudyStore, study: str, problem: Problem, space: SearchSpace, measure: MeasureStage,
                 start: tuple[KernelConfig, ...], on_event: Callable[[object], None] | None, *,
                 takes_related: bool) -> tuple[KernelConfig, ...]:
    """``start`` (the family's recommended configs), then -- for a sampler that cannot take
    other studies' measurements -- the transfer plan's configs; records the plan's studies
    with the study and says where they came from through ``on_event`` (``Seeded``). The
    recommended configs stay first: measured across shapes, they are within 2% of the
    optimum at most recorded problems (one evaluation). A sampler that takes measurements
    (``takes_related``) gets nothing enqueued: its own first pick weighs the sources against
    the cost model, where an enqueued seed that is not within 2% costs an evaluation
    (docs/transfer.md)."""
    from evotuner.transfer import plan_transfer

    plan = plan_transfer(store, study, problem, space, measure.device(), observations=takes_related)
    if not plan.sources:
        return start
    store.record_transfer(study, plan.studies)
    enqueued = () if takes_related else plan.configs
    if on_event is not None:
        on_event(ev.Seeded(tuple((s.study, str(s.problem), 0 if takes_related else len(s.configs),
                                  len(s.observations)) for s in plan.sources), len(enqueued), takes_related))
    return tuple(dict.fromkeys(tuple(start) + enqueued))


def related_studies(store: StudyStore, study: str, problem: Problem, space: SearchSpace,
                    measure: MeasureStage) -> tuple[Any, ...]:
    """The measurements of the studies that seeded ``study`` (recorded by :func:`seeded_start`),
    as the guided sampler's related studies; none for a study started cold."""
    from evotuner.family.registry import get_family
    from evotuner.transfer import plan_transfer, related

    names = store.transfer_sources(study)
    if not names:
        return ()
    plan = plan_transfer(store, study, problem, space, measure.device(), studies=len(names), only=names)
    return related(plan.sources, get_family(space.kernel).estimate_us)
