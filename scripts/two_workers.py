#!/usr/bin/env python3
"""GPU check of issue 10: several `evotuner search` processes on one study, then `--gpus`.

    python scripts/two_workers.py [--trials 24] [--shape B=16,H=16,S=2048,D=64] [--workdir DIR]
                                  [--storage URL] [--gpus 0] [--replay SWEEP.csv]

1. starts two `evotuner search` processes on one fresh study (the second 0.5 s after the
   first), on the real GPU and nvcc, and waits for both;
2. runs `evotuner search --gpus <GPUS>` on the same study with --trials raised by 8;
3. checks the database: exactly --trials (then --trials + 8) finished trials, no config
   measured twice, no RUNNING trial, SDPA baselines measured once per backend and device,
   every worker exited 0, and (SQLite) PRAGMA integrity_check is ok.

Prints one line per check and exits non-zero when any fails. The database defaults to a
fresh SQLite file in --workdir (default: a new temporary directory); every worker's log
is kept there.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import text

from evotuner.errors import EvotunerError
from evotuner.storage import StudyStore
from evotuner.scriptargs import ArgumentParser, output_folder, positive, work_folder

STUDY = "two-workers"


def search(storage: str, shape: str, trials: int, log: Path, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "evotuner.cli", "search", "--study", STUDY, "--shape", shape,
           "--trials", str(trials), "--storage", storage, *extra]
    print("$", " ".join(cmd), f"> {log}", flush=True)
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)


def check(storage: str, trials: int) -> list[str]:
    bad = []
    with StudyStore(storage, create=False) as store:
        summary = store.summary(STUDY)
        states = Counter(t.state for t in summary.trials)
        finished = [t for t in summary.trials if t.state in ("COMPLETE", "PRUNED", "FAIL")
                    and not (t.error or "").startswith("interrupted")]
        print(f"  trials by state: {dict(states)}; finished: {len(finished)} (want {trials})")
        if len(finished) != trials:
            bad.append(f"{len(finished)} finished trials, not {trials}")
        if states.get("RUNNING"):
            bad.append(f"{states['RUNNING']} trials left RUNNING")
        with store.session() as s:
            twice = s.execute(text("SELECT config, COUNT(*) FROM evotuner_measurements GROUP BY config "
                                   "HAVING COUNT(*) > 1")).all()
            base = s.execute(text("SELECT backend, device_id, COUNT(*) FROM evotuner_baselines "
                                  "GROUP BY backend, device_id HAVING COUNT(*) > 1")).all()
            workers = s.execute(text("SELECT id, pid, seat, seed, device, state, reason FROM evotuner_workers")).all()
            if storage.startswith("sqlite"):
                integrity = s.execute(text("PRAGMA integrity_check")).scalar()
                if integrity != "ok":
                    bad.append(f"integrity_check: {integrity}")
        print(f"  workers: {[tuple(w) for w in workers]}")
        if twice:
            bad.append(f"configs measured twice: {twice}")
        if base:
            bad.append(f"baselines measured twice: {base}")
        dup = sum(1 for t in finished if t.duplicate_of is not None)
        print(f"  measured configs: {len(finished) - dup}, copied (duplicate_of): {dup}")
    return bad


def _check(storage: str, trials: int) -> list[str]:
    """check(), a database that cannot be read being one failure (never a traceback)."""
    try:
        return check(storage, trials)
    except EvotunerError as exc:
        print(f"  cannot check the study: {exc}")
        return [f"cannot check the study: {exc}"]


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=positive, default=24)
    ap.add_argument("--shape", default="B=16,H=16,S=2048,D=64")
    ap.add_argument("--workdir", type=output_folder("a folder"), default=None)
    ap.add_argument("--storage", default=None, help="database URL [default: a new SQLite file in --workdir]")
    ap.add_argument("--gpus", default="0", help="GPUs for the --gpus run [default: 0]")
    ap.add_argument("--replay", default=None, help="rehearse without a GPU: pass --replay FILE (and a delay) on")
    args = ap.parse_args(argv)
    if args.replay is not None and not Path(args.replay).is_file():
        ap.error(f"argument --replay: {args.replay}: no such file (give a sweep CSV)")
    if args.replay is None:
        from evotuner.measure import gpu_available

        if not gpu_available():
            print("error: no CUDA GPU on this machine: two_workers.py runs searches on one "
                  "(run it on the GPU machine, or rehearse with --replay SWEEP.csv)", file=sys.stderr)
            return 1
    extra = ("--replay", args.replay, "--replay-delay", "0.05,0.03") if args.replay else ()
    work = work_folder(args.workdir, "evotuner-two-workers-")
    if work is None:
        return 1
    storage = args.storage or f"sqlite:///{work / 'two_workers.db'}"
    failures: list[str] = []
    started = time.monotonic()

    first = search(storage, args.shape, args.trials, work / "worker1.log", *extra)
    time.sleep(0.5)
    second = search(storage, args.shape, args.trials, work / "worker2.log", *extra)
    for name, proc in (("worker 1", first), ("worker 2", second)):
        proc.wait()
        print(f"{name} exited {proc.returncode}")
        if proc.returncode != 0:
            failures.append(f"{name} exited {proc.returncode} (see {work})")
    print(f"two workers: {time.monotonic() - started:.0f} s")
    failures += _check(storage, args.trials)

    more = args.trials + 8
    gpus = search(storage, args.shape, more, work / "gpus.log", "--gpus", args.gpus, *extra)
    gpus.wait()
    print(f"--gpus {args.gpus} exited {gpus.returncode}")
    if gpus.returncode != 0:
        failures.append(f"--gpus {args.gpus} exited {gpus.returncode} (see {work / 'gpus.log'})")
    failures += _check(storage, more)

    for f in failures:
        print(f"FAIL: {f}")
    print("OK: exact budget, nothing measured twice, no RUNNING trial" if not failures else
          f"{len(failures)} check(s) failed; logs in {work}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
