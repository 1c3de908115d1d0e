"""Transfer: a new study starts from what the nearest studies in its database measured.

Users tune many shapes. A new study of the hopper family at B4 H32 S4096 D128 causal
should not start cold when the same database holds finished studies at B8 H16 S2048
D128 and at B16 H8 S1024 D128 causal (Kernel Tuner and Triton's autotuner start every
problem cold). :func:`plan_transfer` picks the nearest studies; the session then uses
them in one of two ways (``evotuner search`` says which: "seeded from studies A, B";
``--no-transfer`` turns it off):

* a sampler that takes prior knowledge (``guided``) gets the sources' compiled trials
  as observations of correlated problems (:class:`evotuner.gpmodel.Related`; nothing is
  enqueued): its first pick stays its own, its second is the model's choice among the
  sources' fastest configs, and its GP learns from them where the cost model is wrong;
* any other sampler gets the ``per_study`` best distinct configs of each source,
  enqueued after the family's recommended config, nearest study first.

Which studies may seed (every rule is a reason a study is left out, listed in the
plan's ``skipped``):

* same kernel family (a config of another family means nothing here);
* same device model, by the GPU's name in the studies' device fingerprints (a
  replayed study carries the fingerprint of the GPU its sweep was recorded on); a
  study never measured (no device) cannot seed;
* same head dim (it changes which tiles fit and what each costs);
* at least one COMPLETE trial.

Nearness is :func:`similarity`, the correlation the guided sampler assumes between the
cost model's errors at two problems (``scripts/transfer_benchmark.py --correlations``
measures it on the recorded sweeps; docs/transfer.md has the figures): errors correlate
strongly within one head dim; a dtype change moves them least, a causal change most;
sizes move them per doubling of the query rows B x H x Sq (how many tiles, how many
waves on the SMs) and of the key length (each tile's loop), not of Sq and B x H apart
(2,16,1024 and 1,8,4096 have one tile count). The weights below are round figures set
under those correlations, not fitted to the benchmark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError
from evotuner.problem import Problem
from evotuner.vocabulary import is_interrupted

#: How many of the nearest studies seed a new one, and how many configs each gives to a
#: sampler that cannot take observations.
DEFAULT_STUDIES = 4
DEFAULT_PER_STUDY = 4
#: Log-similarity lost to a dtype change, a causal change, each doubling of the query rows
#: B x H x Sq and each doubling of the key length (see the module docstring).
DTYPE_STEP = 0.02
CAUSAL_STEP = 0.2
ROWS_STEP = 0.05
KEYS_STEP = 0.05
#: Observations one source gives at most: its best measured configs, then its compiled
#: failures (the GP's cost grows with the cube of its points).
MEASURED_PER_SOURCE = 64
FAILED_PER_SOURCE = 32


@dataclass(frozen=True)
class Observation:
    """One compiled config of a source study: its median µs, or None when it failed past the
    compiler (gate, launch, wrong result)."""

    config: KernelConfig
    median_us: float | None


@dataclass(frozen=True)
class Source:
    """One study that seeds the new one."""

    study: str
    problem: Problem
    similarity: float
    configs: tuple[KernelConfig, ...] = ()              # its best admitted configs, to enqueue
    observations: tuple[Observation, ...] = field(default=(), repr=False)


@dataclass(frozen=True)
class TransferPlan:
    """The nearest studies (nearest first), their configs to enqueue, and who was left out why."""

    configs: tuple[KernelConfig, ...] = ()
    sources: tuple[Source, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()      # (study, why it cannot seed)

    @property
    def studies(self) -> tuple[str, ...]:
        return tuple(s.study for s in self.sources)


def similarity(target: Problem, other: Problem) -> float:
    """How alike the cost model's errors are at ``other`` and ``target``, in (0, 1]; 0 for another
    head dim: exp(-(DTYPE_STEP [dtype differs] + CAUSAL_STEP [causal differs] + ROWS_STEP x
    |log2 ratio of the query rows B x H x Sq| + KEYS_STEP x |log2 ratio of the key lengths|))."""
    a, b = target.shape, other.shape
    if a.head_dim != b.head_dim:
        return 0.0
    rows = abs(math.log2(query_rows(target) / query_rows(other)))
    keys = abs(math.log2(a.seqlen_k / b.seqlen_k))
    return math.exp(-(DTYPE_STEP * (target.dtype != other.dtype) + CAUSAL_STEP * (target.causal != other.causal)
                      + ROWS_STEP * rows + KEYS_STEP * keys))


def query_rows(problem: Problem) -> int:
    """B x H x Sq: the rows the kernel's CTAs split among them (how many tiles, how many waves;
    a packed batch's: H x its total query length)."""
    return problem.query_rows


def device_model(fingerprint: Mapping[str, Any] | None) -> str | None:
    """The GPU model a device fingerprint names (None when unknown)."""
    if not fingerprint:
        return None
    name = fingerprint.get("name")
    return str(name) if name else None


def plan_transfer(store: Any, study: str, problem: Problem, space: Any, device: Mapping[str, Any] | None, *,
                  studies: int = DEFAULT_STUDIES, per_study: int = DEFAULT_PER_STUDY,
                  observations: bool = True, only: Sequence[str] | None = None) -> TransferPlan:
    """The transfer plan of study ``study`` (see the module docstring). ``device`` is the
    fingerprint of the GPU the new study measures on (``MeasureStage.device()``). With
    ``observations`` (a sampler that takes them) the ``studies`` nearest are the sources;
    without, a study with no config to give (none admitted here, or all given by a nearer
    one) is skipped with that reason and the next nearest takes its place. ``only`` limits
    the candidates to those studies (a study's sampler reloads the sources it recorded)."""
    model = device_model(device)
    candidates: list[tuple[float, str, Any]] = []
    skipped: list[tuple[str, str]] = []
    names = [info.name for info in store.list_studies()] if only is None else list(only)
    for name in names:
        if name == study:
            continue
        try:
            summary = store.summary(name)
        except EvotunerError as exc:
            skipped.append((name, f"unreadable: {exc}"))
            continue
        if summary.kernel_family != space.kernel:
            skipped.append((name, f"family {summary.kernel_family}, not {space.kernel}"))
            continue
        theirs = device_model(summary.device)
        if model is None or theirs is None or theirs != model:
            skipped.append((name, f"device {theirs or 'unknown'}, not {model or 'unknown'}"))
            continue
        if summary.problem.varlen != problem.varlen:    # another kernel build (packed or dense)
            skipped.append((name, "a packed variable-length batch" if summary.problem.varlen else "a dense batch"))
            continue
        near = similarity(problem, summary.problem)
        if near <= 0.0:
            skipped.append((name, f"head dim {summary.problem.shape.head_dim}, not {problem.shape.head_dim}"))
            continue
        if summary.best is None:
            skipped.append((name, "no COMPLETE trial"))
            continue
        candidates.append((near, name, summary))
    candidates.sort(key=lambda c: (-c[0], c[1]))

    chosen: list[KernelConfig] = []
    sources: list[Source] = []
    for near, name, summary in candidates:
        if len(sources) >= max(0, studies):
            break
        mine: list[KernelConfig] = []
        for config, _ in _fastest(summary.trials):
            if len(mine) >= per_study:
                break
            if config in chosen or not space.admits(config, problem):
                continue
            mine.append(config)
            chosen.append(config)
        if not mine and not observations:
            skipped.append((name, "no config of its best is new here and admitted by the space at this problem"))
            continue
        sources.append(Source(name, summary.problem, near, tuple(mine),
                              _observations(summary.trials) if observations else ()))
    return TransferPlan(tuple(chosen), tuple(sources), tuple(skipped))


def related(sources: Sequence[Source], estimate: Any) -> tuple[Any, ...]:
    """The sources as the guided sampler's related studies (:class:`evotuner.gpmodel.Related`);
    ``estimate(config, problem)`` is the family's cost model (µs; None or inf where it has none)."""
    from evotuner.gpmodel import Related

    out = []
    for source in sources:
        points = []
        for o in source.observations:
            us = estimate(o.config, source.problem)
            points.append((o.config, o.median_us, math.inf if us is None else float(us)))
        out.append(Related(source.study, source.similarity, tuple(points)))
    return tuple(out)


def _fastest(trials: Sequence[Any]) -> list[tuple[KernelConfig, float]]:
    """The study's measured configs, each once with its fastest time, fastest first (the
    configs to enqueue, and the observations' measured part)."""
    best: dict[KernelConfig, float] = {}
    for t in sorted((t for t in trials if _measured(t)), key=lambda t: (t.value, t.number)):
        config = t.kernel_config
        if config is not None and config not in best:
            best[config] = t.value
    return list(best.items())


def _observations(trials: Sequence[Any]) -> tuple[Observation, ...]:
    """The study's compiled configs, each once: its MEASURED_PER_SOURCE fastest, then up to
    FAILED_PER_SOURCE that failed past the compiler. Statically pruned trials (never compiled)
    and interrupted ones say nothing about the kernel and are left out."""
    fastest = _fastest(trials)
    taken = {c for c, _ in fastest}
    failed = [Observation(c, None) for c in _failed(trials) if c not in taken]
    return tuple(Observation(c, us) for c, us in fastest[:MEASURED_PER_SOURCE]) + tuple(failed[:FAILED_PER_SOURCE])


def _failed(trials: Sequence[Any]) -> list[KernelConfig]:
    """The configs that failed past the compiler, each once, in trial order."""
    out: dict[KernelConfig, None] = {}
    for t in trials:
        config = t.kernel_config
        if config is not None and t.duplicate_of is None and _compiled_failure(t):
            out.setdefault(config)
    return list(out)


def _measured(t: Any) -> bool:
    return t.state == "COMPLETE" and t.value is not None and t.value > 0


def _compiled_failure(t: Any) -> bool:
    if t.state == "FAIL":
        return not is_interrupted(t.state, t.error)
    return t.state == "PRUNED" and isinstance(t.gate, Mapping) and t.gate.get("passed") is False
