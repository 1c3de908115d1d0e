#!/usr/bin/env python3
"""Racing on recorded timings: how often the rule stops a config it should not, and how
many repetitions it saves (docs/measurement.md; tests/test_racing.py runs the same code).

    python scripts/race_simulation.py [--sweeps 'tests/data/sweep_h100_*.csv'] [--orders 20] [--top 0]
                                      [--rho 0.0] [--seed 0] [--boundary 20000] [--output FILE.json]

Each recorded config of a sweep (``status == ok``) has a median, a p20 and a p80 and the
repetitions its full budget gave. Its repetitions are drawn from a split normal with that
median (the 50% point), ``(median - p20) / z80`` below and ``(p80 - median) / z80`` above
(so p20 and p80 match); ``--rho`` makes successive repetitions AR(1)-correlated (drift)
with the same marginal quantiles.

* **study**: the sweep's configs (``--top N``: its N fastest, the neighbourhood a guided
  study spends most of its trials in) in a random order (``--orders`` orders), the first one
  timed in full, each next one raced against the best simulated median so far, with the
  rule's looks; a *false stop* is a stopped config whose true (recorded) median is within
  ``margin`` of the incumbent it was stopped against, or better; a *lost winner* is a
  stopped config whose full-budget median (the same draws, timed to the end) would have
  beaten the study's final best. Reports both, and the share of repetitions saved.
* **boundary**: ``--boundary`` configs whose true median is exactly
  ``incumbent * (1 + margin)`` (the worst case the rule guards), spreads taken from the
  sweep's rows in turn: the share stopped is the rule's false-stop rate at its edge
  (the theory says at most ``alpha`` for independent repetitions).
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from evotuner.measure.racing import DEFAULT_RULE, RaceRule
from evotuner.scriptargs import ArgumentParser, at_least, output_path, positive, seed

#: The standard normal's 80% point: p80 = median + Z80 * sigma_hi for a split normal.
Z80 = 0.8416212335729143


@dataclass(frozen=True)
class Recorded:
    median_us: float
    p20_us: float
    p80_us: float
    repetitions: int          # what the full budget gave when the sweep was recorded


class SweepFileError(Exception):
    """A file of ``--sweeps`` that is no sweep CSV this script can read (the message names it)."""


NEEDED = ("status", "median_us", "p20_us", "p80_us", "repetitions")


def read_recorded(path: Path | str) -> list[Recorded]:
    """The measured configs of sweep CSV ``path``; SweepFileError when it is no sweep CSV."""
    out = []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [k for k in NEEDED if k not in (reader.fieldnames or ())]
            if missing:
                raise SweepFileError(f"{path}: no column {missing[0]}, so it is no sweep CSV"
                                     if reader.fieldnames else f"{path}: empty file, no sweep CSV")
            for lineno, row in enumerate(reader, start=2):
                if row.get("status") != "ok":
                    continue
                try:
                    med, p20, p80 = (float(row[k]) for k in ("median_us", "p20_us", "p80_us"))
                    reps = int(float(row.get("repetitions") or 0))
                except (TypeError, ValueError):
                    raise SweepFileError(f"{path}: line {lineno}: an ok row without a number in median_us, p20_us, "
                                         "p80_us or repetitions") from None
                if not (med > 0 and p20 <= med <= p80 and reps > 0):
                    continue
                out.append(Recorded(med, p20, p80, reps))
    except OSError as exc:
        raise SweepFileError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise SweepFileError(f"{path}: not a CSV text file ({type(exc).__name__})") from None
    return out


def draw(rng: np.random.Generator, rec: Recorded, n: int, rho: float = 0.0, median_us: float | None = None
         ) -> np.ndarray:
    """``n`` repetitions with ``rec``'s relative spread around ``median_us`` (default its own)."""
    med = rec.median_us if median_us is None else median_us
    lo = (rec.median_us - rec.p20_us) / rec.median_us / Z80 * med
    hi = (rec.p80_us - rec.median_us) / rec.median_us / Z80 * med
    w = rng.standard_normal(n)
    if rho > 0.0:
        e = np.empty(n)
        e[0] = w[0]
        s = math.sqrt(1.0 - rho * rho)
        for i in range(1, n):
            e[i] = rho * e[i - 1] + s * w[i]
        w = e
    return med + np.where(w > 0, hi * w, lo * w)


def race(samples: np.ndarray, planned: int, incumbent_us: float | None, rule: RaceRule) -> int:
    """Repetitions the worker would run: the first look at which the rule stops, else ``planned``."""
    if incumbent_us is None:
        return planned
    for n in rule.looks():
        if n >= planned:
            break
        if rule.stops(samples[:n].tolist(), incumbent_us):
            return n
    return planned


@dataclass(frozen=True)
class StudyStats:
    configs: int
    stopped: int
    contenders: int           # raced configs truly within margin of (or better than) their incumbent
    false_stops: int          # contenders that were stopped
    lost_winners: int         # stopped though its full timing would have beaten the study's final best
    reps_full: int
    reps_raced: int

    @property
    def saved(self) -> float:
        return 1.0 - self.reps_raced / self.reps_full if self.reps_full else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "saved": round(self.saved, 4)}


def simulate_study(recorded: Sequence[Recorded], rule: RaceRule, rng: np.random.Generator,
                   rho: float = 0.0) -> StudyStats:
    order = rng.permutation(len(recorded))
    incumbent: float | None = None
    stopped_full: list[float] = []                    # full-budget medians of stopped configs (same draws)
    stopped = contenders = false_stops = reps_full = reps_raced = 0
    for i in order:
        rec = recorded[i]
        samples = draw(rng, rec, rec.repetitions, rho)
        n = race(samples, rec.repetitions, incumbent, rule)
        reps_full += rec.repetitions
        reps_raced += n
        measured = float(np.median(samples[:n]))
        contender = incumbent is not None and rec.median_us <= incumbent * (1.0 + rule.margin)
        contenders += contender
        if n < rec.repetitions:
            stopped += 1
            stopped_full.append(float(np.median(samples)))
            false_stops += contender
        if incumbent is None or measured < incumbent:
            incumbent = measured
    lost = sum(1 for full in stopped_full if incumbent is not None and full < incumbent)
    return StudyStats(len(recorded), stopped, contenders, false_stops, lost, reps_full, reps_raced)


def boundary_rate(recorded: Sequence[Recorded], rule: RaceRule, rng: np.random.Generator, count: int,
                  rho: float = 0.0) -> tuple[int, int]:
    """(stopped, count) for configs whose true median is exactly incumbent * (1 + margin)."""
    stops = 0
    incumbent = 1000.0
    for j in range(count):
        rec = recorded[j % len(recorded)]
        samples = draw(rng, rec, rec.repetitions, rho, median_us=rule.threshold(incumbent))
        if race(samples, rec.repetitions, incumbent, rule) < rec.repetitions:
            stops += 1
    return stops, count


def top(recorded: Sequence[Recorded], n: int) -> list[Recorded]:
    """The ``n`` fastest configs (all when ``n`` is 0)."""
    ranked = sorted(recorded, key=lambda r: r.median_us)
    return ranked[:n] if n > 0 else ranked


def _rho(text: str) -> float:
    """An argparse ``type=`` for ``--rho``: an AR(1) correlation in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a correlation from 0 up to (not including) 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    p = ArgumentParser(prog="race_simulation.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--sweeps", default="tests/data/sweep_h100_*.csv")
    p.add_argument("--orders", type=positive, default=20)
    p.add_argument("--rho", type=_rho, default=0.0)
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--boundary", type=positive, default=20000)
    p.add_argument("--top", type=at_least(0, "0: every config"), default=0, help="study only the N fastest configs of each sweep "
                                                        "(a guided study's neighbourhood; 0: all)")
    p.add_argument("--output", type=output_path, default=None, help="also write the figures as JSON")
    args = p.parse_args(argv)
    rule = DEFAULT_RULE
    rng = np.random.default_rng(args.seed)
    paths = sorted(glob.glob(args.sweeps))
    if not paths:
        print(f"error: --sweeps {args.sweeps!r} matches no file (run from the repository root, or give a path)",
              file=sys.stderr)
        return 2
    try:
        read = {path: read_recorded(path) for path in paths}      # every file read before the simulation
    except SweepFileError as exc:
        print(f"error: {exc} (give --sweeps sweep CSVs that scripts/sweep.py recorded)", file=sys.stderr)
        return 1
    every = [r for path in paths for r in read[path]]
    if not every:
        print(f"error: --sweeps {args.sweeps!r}: no measured config (status ok, with median_us, p20_us, p80_us "
              "and repetitions) in the files it matches (give sweeps that timed configs)", file=sys.stderr)
        return 1
    rows = []
    for path in paths:
        recorded = top(read[path], args.top)
        if len(recorded) < 2:
            continue
        runs = [simulate_study(recorded, rule, rng, args.rho) for _ in range(args.orders)]
        total = StudyStats(*(sum(getattr(r, f) for r in runs) for f in
                             ("configs", "stopped", "contenders", "false_stops", "lost_winners", "reps_full", "reps_raced")))
        rows.append({"sweep": Path(path).name, **total.as_dict()})
        print(f"{Path(path).name:45s} configs {total.configs:6d} stopped {total.stopped:6d} "
              f"false {total.false_stops:3d} of {total.contenders:4d} lost {total.lost_winners:3d} saved {100 * total.saved:5.1f}%")
    stops, count = boundary_rate(every, rule, rng, args.boundary, args.rho)
    print(f"boundary (true median = incumbent x {1 + rule.margin:g}): {stops} of {count} stopped "
          f"({100 * stops / count:.3f}%; alpha {100 * rule.alpha:g}%)  rho={args.rho}")
    if args.output is not None:
        from evotuner.atomicfile import write_text_atomic
        from evotuner.errors import EvotunerError

        try:
            write_text_atomic(args.output, json.dumps({"rule": rule.to_wire(), "rho": args.rho, "seed": args.seed,
                                                       "sweeps": rows, "boundary": {"stopped": stops, "count": count}},
                                                      indent=2) + "\n")
        except EvotunerError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
