"""Transfer: a new study starts from the best configs of the nearest studies already in its database.

Users tune many shapes. A new study of the hopper family at B4 H32 S4096 D128 causal
should not start cold when the same database holds finished studies at B8 H16 S2048
D128 and at B4 H16 S4096 D64 causal: the winners of the nearest problems are the
best first guesses there are (Kernel Tuner and Triton's autotuner start every
problem cold). :func:`plan_transfer` picks them; the session enqueues them right after
the family's recommended config (``evotuner search`` says "seeded from studies A, B";
``--no-transfer`` turns it off).

Which studies may seed (every rule is a reason a study is left out, listed in the
plan's ``skipped``):

* same kernel family (a config of another family means nothing here);
* same device model, by the GPU's name in the studies' device fingerprints (a
  replayed study carries the fingerprint of the GPU its sweep was recorded on); a
  study never measured (no device) cannot seed;
* at least one COMPLETE trial.

Nearness is lexicographic, as a kernel engineer would judge it: the head dim first
(it changes the tile shapes that fit), then dtype, then causal, then the distance
in sequence lengths and in batch x heads on a log2 scale (a 2x longer sequence is
as far as a 2x shorter one). The ``studies`` nearest give their ``per_study`` best
distinct configs, nearest study first, each config once; a config that is not in
the new study's space or breaks one of its static constraints for the new problem
is dropped (it would cost a trial and teach nothing). A study left with no config
to give is skipped (with that reason) and the next nearest takes its place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError
from evotuner.problem import Problem

#: How many of the nearest studies seed a new one, and how many configs each gives.
DEFAULT_STUDIES = 2
DEFAULT_PER_STUDY = 4


@dataclass(frozen=True)
class Source:
    """One study that seeds the new one."""

    study: str
    problem: Problem
    distance: tuple[float, ...] = field(hash=False)
    configs: tuple[KernelConfig, ...] = ()


@dataclass(frozen=True)
class TransferPlan:
    """The configs to enqueue first (nearest study's best first) and where they came from."""

    configs: tuple[KernelConfig, ...] = ()
    sources: tuple[Source, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()      # (study, why it cannot seed)

    @property
    def studies(self) -> tuple[str, ...]:
        return tuple(s.study for s in self.sources if s.configs)


def distance(target: Problem, other: Problem) -> tuple[float, ...]:
    """How far ``other`` is from ``target``: (head dim differs, dtype differs, causal differs,
    |log2| sequence-length ratio summed over q and k, |log2| batch*heads ratio)."""
    a, b = target.shape, other.shape
    seq = abs(math.log2(a.seqlen_q / b.seqlen_q)) + abs(math.log2(a.seqlen_k / b.seqlen_k))
    bh = abs(math.log2((a.batch * a.heads) / (b.batch * b.heads)))
    return (float(a.head_dim != b.head_dim), float(target.dtype != other.dtype),
            float(target.causal != other.causal), round(seq, 6), round(bh, 6))


def device_model(fingerprint: Mapping[str, Any] | None) -> str | None:
    """The GPU model a device fingerprint names (None when unknown)."""
    if not fingerprint:
        return None
    name = fingerprint.get("name")
    return str(name) if name else None


def plan_transfer(store: Any, study: str, problem: Problem, space: Any, device: Mapping[str, Any] | None, *,
                  studies: int = DEFAULT_STUDIES, per_study: int = DEFAULT_PER_STUDY) -> TransferPlan:
    """The transfer plan of new study ``study`` (see the module docstring). ``device`` is the
    fingerprint of the GPU the new study measures on (``MeasureStage.device()``)."""
    model = device_model(device)
    candidates: list[tuple[tuple[float, ...], str, Any]] = []
    skipped: list[tuple[str, str]] = []
    for info in store.list_studies():
        if info.name == study:
            continue
        try:
            summary = store.summary(info.name)
        except EvotunerError as exc:
            skipped.append((info.name, f"unreadable: {exc}"))
            continue
        if summary.kernel_family != space.kernel:
            skipped.append((info.name, f"family {summary.kernel_family}, not {space.kernel}"))
            continue
        theirs = device_model(summary.device)
        if model is None or theirs is None or theirs != model:
            skipped.append((info.name, f"device {theirs or 'unknown'}, not {model or 'unknown'}"))
            continue
        if summary.best is None:
            skipped.append((info.name, "no COMPLETE trial"))
            continue
        candidates.append((distance(problem, summary.problem), info.name, summary))
    candidates.sort(key=lambda c: (c[0], c[1]))

    chosen: list[KernelConfig] = []
    sources: list[Source] = []
    for dist, name, summary in candidates:
        if len(sources) >= max(0, studies):
            break
        mine: list[KernelConfig] = []
        for config in _best_configs(summary.trials):
            if len(mine) >= per_study:
                break
            if config in chosen or not space.admits(config, problem):
                continue
            mine.append(config)
            chosen.append(config)
        if not mine:    # it would be named as a source and give nothing: the next one takes its place
            skipped.append((name, "no config of its best is new here and admitted by the space at this problem"))
            continue
        sources.append(Source(name, summary.problem, dist, tuple(mine)))
    return TransferPlan(tuple(chosen), tuple(sources), tuple(skipped))


def _best_configs(trials: Sequence[Any]) -> list[KernelConfig]:
    """The study's distinct COMPLETE configs, fastest first."""
    done = sorted((t for t in trials if t.state == "COMPLETE" and t.value is not None),
                  key=lambda t: (t.value, t.number))
    out: list[KernelConfig] = []
    for t in done:
        config = t.kernel_config
        if config is not None and config not in out:
            out.append(config)
    return out
