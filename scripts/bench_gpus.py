#!/usr/bin/env python3
"""One study on one GPU, then on several GPUs of the host: how the search scales (issues 28, 30).

    python scripts/bench_gpus.py [--trials 256] [--shape B=4,H=32,S=4096,D=128] [--causal]
                                 [--dtype fp16] [--runs none,all] [--space NAME] [--seed 0]
                                 [--workdir DIR] [--output bench_gpus.json] [--run-timeout 900]
                                 [--replay SWEEP.csv --replay-delay BUILD,MEASURE]

Each run is the user's command, ``python -m evotuner.cli search --study ... --no-transfer``,
COLD: a fresh build cache (its own ``EVOTUNER_CACHE_DIR``) and a fresh SQLite study. ``--runs``
lists the runs in order, comma-separated: ``none`` (no ``--gpus``: one GPU, as a plain search),
``all`` (``--gpus all``) or GPU lists joined by ``+`` (``0+1`` is ``--gpus 0,1``).

After each run the script reads the study database (read-only, SQLite) and reports:

* exactness: finished trials (must equal --trials), trials left RUNNING (must be 0), configs
  measured twice (must be 0), measurements per GPU;
* wall: from launching the command to its exit;
* start-up: launch -> the first worker row (imports, store, space), -> the last SDPA baseline
  recorded, -> the first measurement recorded;
* the measuring phase: first to last measurement recorded, and its rate
  ``(measurements - 1) / phase``; the speed-up of a run over the first run is the ratio of
  these rates ("measuring phase") and of the wall times ("whole run");
* builds: how many were compiled, their summed nvcc seconds, and that sum over
  (cores x wall), the share of the host's CPUs the builds used;
* the tail: last measurement -> exit; the best measured median (µs);
* the search loop's own time split, as ``search`` prints it last ("time split ...": baselines,
  sampler, waiting on builds, gate, measuring, recording; per GPU thread on average).

Exits 1 when a run fails or an exactness check fails. ``--replay`` rehearses it all without a
GPU (every ``--gpus`` thread answers from the sweep; ``all`` then means GPU 0).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import sqlite3
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from evotuner import childproc
from evotuner.atomicfile import write_text_atomic
from evotuner.errors import EvotunerError
from evotuner.scriptargs import ArgumentParser, output_folder, output_path, positive, seed, work_folder

FINISHED = ("COMPLETE", "PRUNED", "FAIL")


def parse_runs(text: str) -> list[str]:
    runs = [part.strip() for part in text.split(",") if part.strip()]
    if not runs:
        raise SystemExit("bench_gpus: --runs is empty; e.g. --runs none,all or --runs none,0+1")
    for run in runs:
        if run not in ("none", "all") and not all(p.isdigit() for p in run.split("+")):
            raise SystemExit(f"bench_gpus: --runs item {run!r} is not none, all or GPU indices joined by +")
    return runs


def command(args: argparse.Namespace, run: str, study: str, db: Path) -> list[str]:
    cmd = [sys.executable, "-m", "evotuner.cli", "search", "--study", study, "--shape", args.shape,
           "--dtype", args.dtype, "--trials", str(args.trials), "--storage", f"sqlite:///{db}",
           "--seed", str(args.seed), "--no-transfer"]
    if args.causal:
        cmd.append("--causal")
    if args.space:
        cmd += ["--space", args.space]
    if run != "none":
        cmd += ["--gpus", run.replace("+", ",")]
    if args.replay:
        cmd += ["--replay", args.replay, "--replay-delay", args.replay_delay]
    return cmd + shlex.split(args.extra)


def _utc(text: str | None) -> float | None:
    """A stored naive-UTC timestamp as epoch seconds."""
    if not text:
        return None
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc).timestamp()


def analyse(db: Path, study: str, launched: float, exited: float, trials: int) -> dict[str, Any]:
    """What the study database says about the run (read-only)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        q = con.execute
        sid = q("SELECT id, optuna_study_id FROM evotuner_studies WHERE name = ?", (study,)).fetchone()
        if sid is None:
            return {"error": f"no study {study!r} in {db}"}
        study_id, optuna_id = sid
        states = Counter(s for (s,) in q("SELECT state FROM trials WHERE study_id = ?", (optuna_id,)))
        meas = q("SELECT trial_number, config, measured_at FROM evotuner_measurements WHERE study_id = ? "
                 "ORDER BY measured_at", (study_id,)).fetchall()
        best = q("SELECT MIN(median_us) FROM evotuner_measurements WHERE study_id = ? AND ok = 1",
                 (study_id,)).fetchone()[0]
        twice = [c for c, n in Counter(c for _, c, _ in meas).items() if n > 1]
        devices = Counter()
        for (value,) in q("SELECT a.value_json FROM trial_user_attributes a JOIN trials t ON a.trial_id = t.trial_id "
                          "WHERE t.study_id = ? AND a.key = 'device'", (optuna_id,)):
            tag = json.loads(value)
            devices[str(tag.get("device_index", tag.get("name", "?")))] += 1
        stopped = q("SELECT COUNT(*) FROM trial_user_attributes a JOIN trials t ON a.trial_id = t.trial_id "
                    "WHERE t.study_id = ? AND a.key = 'stopped_early'", (optuna_id,)).fetchone()[0]
        reps = q("SELECT SUM(repetitions) FROM evotuner_measurements WHERE study_id = ?", (study_id,)).fetchone()[0]
        builds = q("SELECT seconds FROM evotuner_builds WHERE study_id = ? AND cached = 0", (study_id,)).fetchall()
        worker_start = q("SELECT MIN(started) FROM evotuner_workers WHERE study_id = ?", (study_id,)).fetchone()[0]
        base_last = q("SELECT MAX(measured_at) FROM evotuner_baselines WHERE study_id = ?", (study_id,)).fetchone()[0]
    finally:
        con.close()
    finished = sum(states.get(s, 0) for s in FINISHED)
    times = [t for t in (_utc(m[2]) for m in meas) if t is not None]
    wall = exited - launched
    first = times[0] - launched if times else None
    phase = (times[-1] - times[0]) if len(times) > 1 else None
    build_s = sum(s for (s,) in builds)
    cores = os.cpu_count() or 1

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - launched, 2)

    return {
        "finished": finished, "states": dict(states), "running": states.get("RUNNING", 0),
        "measured": len(meas), "stopped_early": stopped, "reps_timed": reps,
        "configs_measured_twice": len(twice), "per_gpu": dict(sorted(devices.items())),
        "wall_s": round(wall, 2),
        "to_worker_row_s": rel(worker_start), "to_baselines_s": rel(_utc(base_last)),
        "to_first_measurement_s": None if first is None else round(first, 2),
        "measuring_phase_s": None if phase is None else round(phase, 2),
        "measurements_per_s": round((len(times) - 1) / phase, 3) if phase else None,
        "tail_s": round(exited - times[-1], 2) if times else None,
        "best_us": None if best is None else round(best, 2),
        "builds": len(builds), "build_cpu_s": round(build_s, 1),
        "build_cpu_share": round(build_s / (cores * wall), 3) if wall > 0 else None,
        "exact": finished == trials and states.get("RUNNING", 0) == 0 and not twice,
    }


_SPLIT = re.compile(r"time split[^:]*:(.*?)(?:\n\S|\Z)", re.S)
_PART = re.compile(r"([a-z][a-z ]*?) (\d+(?:\.\d+)?) s")


def time_split(log: str) -> dict[str, float]:
    """The ``time split`` line the search printed last, as {part: seconds}; {} if none."""
    found = _SPLIT.findall(log)
    if not found:
        return {}
    text = " ".join(found[-1].split())
    return {name.strip(): float(sec) for name, sec in _PART.findall(text)}


def gpus_in(run: str, per_gpu: dict[str, int]) -> int:
    if run == "none":
        return 1
    if run == "all":
        return max(1, len(per_gpu))
    return len(run.split("+"))


def _not_cold(here: Path) -> str:
    """The one line that refuses a run whose folder exists (its build cache would not be cold)."""
    return f"error: {here} exists, so this run would not be cold (use a fresh --workdir)"


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=positive, default=256)
    ap.add_argument("--shape", default="B=4,H=32,S=4096,D=128")
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--runs", default="none,all", help="runs in order (default none,all)")
    ap.add_argument("--space", default=None, help="--space for search (default: as search picks)")
    ap.add_argument("--seed", type=seed, default=0)
    ap.add_argument("--workdir", type=output_folder("a new folder"), default=None,
                    help="caches, databases, logs (default: a new temp dir)")
    ap.add_argument("--output", "-o", type=output_path, default="bench_gpus.json",
                    help="the JSON report (default bench_gpus.json; checked before any run)")
    ap.add_argument("--run-timeout", type=float, default=900.0, help="seconds per search command (default 900)")
    ap.add_argument("--extra", default="", help="more search options for every run, one string (e.g. '--budget 1')")
    ap.add_argument("--replay", default=None, help="rehearse without a GPU from a recorded sweep")
    ap.add_argument("--replay-delay", default="0.05,0.03", help="with --replay: BUILD,MEASURE seconds")
    args = ap.parse_args(argv)
    try:
        runs = parse_runs(args.runs)
    except SystemExit as exc:
        ap.error(str(exc.code).removeprefix("bench_gpus: "))
    try:
        shlex.split(args.extra)
    except ValueError as exc:
        ap.error(f"argument --extra: {args.extra!r}: {exc} (quote it as one shell string)")
    if not (args.run_timeout > 0 and args.run_timeout != float("inf")):
        ap.error(f"argument --run-timeout: {args.run_timeout:g} is not a positive number of seconds")
    if args.workdir is not None:
        for i, run in enumerate(runs):      # every run must start cold: say so before the first one
            if (args.workdir / f"{i}-{run}").exists():
                print(_not_cold(args.workdir / f"{i}-{run}"), file=sys.stderr)
                return 1
    if args.replay is None:
        from evotuner.measure import gpu_available

        if not gpu_available():
            print("error: no CUDA GPU on this machine: bench_gpus.py times searches on one "
                  "(run it on the GPU machine, or rehearse with --replay SWEEP.csv)", file=sys.stderr)
            return 1
    elif not Path(args.replay).is_file():
        ap.error(f"argument --replay: {args.replay}: no such file (give a sweep CSV, e.g. tests/data/...)")
    work = work_folder(args.workdir, "evotuner-bench-gpus-")
    if work is None:
        return 1
    report: dict[str, Any] = {"trials": args.trials, "shape": args.shape, "dtype": args.dtype, "causal": args.causal,
                              "cores": os.cpu_count(), "replay": args.replay, "runs": {}}
    failures: list[str] = []
    for i, run in enumerate(runs):
        label = f"{i}-{run}"
        here = work / label
        if here.exists():
            print(_not_cold(here), file=sys.stderr)
            return 1
        (here / "cache").mkdir(parents=True)
        os.environ["EVOTUNER_CACHE_DIR"] = str(here / "cache")
        study, db = f"gpus-{i}", here / "study.db"
        cmd = command(args, run, study, db)
        print("$", " ".join(cmd), flush=True)
        launched = time.time()
        outcome = childproc.run(cmd, timeout_s=args.run_timeout)
        exited = time.time()
        (here / "search.log").write_bytes(outcome.output)
        res = analyse(db, study, launched, exited, args.trials) if db.exists() else {"error": "no database"}
        res["returncode"] = outcome.returncode
        res["loop_split_s"] = time_split(outcome.output.decode("utf-8", "replace"))
        res["gpus"] = gpus_in(run, res.get("per_gpu", {}))
        report["runs"][label] = res
        if outcome.returncode != 0:
            failures.append(f"{label}: search exited {outcome.returncode} (log {here / 'search.log'})")
        elif not res.get("exact"):
            failures.append(f"{label}: not exact: {res}")
        print(json.dumps(res), flush=True)
    base = report["runs"].get(f"0-{runs[0]}", {})
    for label, res in report["runs"].items():
        if base.get("measurements_per_s") and res.get("measurements_per_s"):
            res["speedup_measuring"] = round(res["measurements_per_s"] / base["measurements_per_s"], 3)
            res["speedup_wall"] = round(base["wall_s"] / res["wall_s"], 3)
            res["efficiency_measuring"] = round(res["speedup_measuring"] * base["gpus"] / res["gpus"], 3)
    try:
        write_text_atomic(args.output, json.dumps(report, indent=1) + "\n")
    except EvotunerError as exc:
        fallback = work / "bench_gpus.json"
        write_text_atomic(fallback, json.dumps(report, indent=1) + "\n")
        print(f"error: {exc}; the report is in {fallback}", file=sys.stderr)
        failures.append(f"report not written to {args.output}")
    cols = ("gpus", "finished", "measured", "stopped_early", "reps_timed", "configs_measured_twice", "wall_s", "to_worker_row_s", "to_baselines_s",
            "to_first_measurement_s", "measuring_phase_s", "measurements_per_s", "tail_s", "best_us", "builds", "build_cpu_s",
            "build_cpu_share", "speedup_measuring", "speedup_wall", "efficiency_measuring", "per_gpu", "loop_split_s")
    for label, res in report["runs"].items():
        print(f"\n{label}")
        for c in cols:
            print(f"  {c:24} {res.get(c)}")
    for f in failures:
        print(f"FAIL: {f}")
    print(f"report: {args.output}; logs and databases under {work}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
