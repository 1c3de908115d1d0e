"""Driver for tests/test_kill_resume.py: one replayed search in its own process.

    python kill_driver.py DB_URL STUDY SWEEP_CSV TRIALS CALLS_LOG

Runs ``evotuner.loop.run_search`` on an existing study with ReplayMeasure and
its ReplayBuilder (no nvcc, no GPU). Every measure() call appends
``<pid> <config>`` to CALLS_LOG (one O_APPEND write, so a line is whole even
when the process is killed). Prints ``trial`` at every TrialStarted (from the first one,
joining the study, seeding and the first proposal are behind it, so a kill from then on
lands inside the search) and ``outcome <outcome> <finished>`` at the end.
"""

from __future__ import annotations

import os
import sys

from evotuner import events as ev
from evotuner.loop import run_search
from evotuner.measure.replay import ReplayMeasure
from evotuner.propose import make_sampler
from evotuner.space import load_space
from evotuner.storage import StudyStore


class LoggedReplay(ReplayMeasure):
    def __init__(self, *args, log: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def measure(self, artifact, problem):
        outcome = super().measure(artifact, problem)
        os.write(self.fd, f"{os.getpid()} {self.config_of(artifact)}\n".encode())
        return outcome


def main() -> int:
    url, study, sweep, trials, log = sys.argv[1:6]
    with StudyStore(url) as store:
        info = store.study_info(study)
        space = load_space(None)
        replay = LoggedReplay(sweep, info.problem, space, log=log)

        def on_event(event: object) -> None:
            if isinstance(event, ev.TrialStarted):
                print("trial", flush=True)

        result = run_search(
            store=store, study_name=study, problem=info.problem, space=space,
            sampler=make_sampler(info.sampler, space, info.seed), seed=info.seed, trials=int(trials),
            builder=replay.builder(jobs=4), measure=replay, on_event=on_event,
        )
    print(f"outcome {result.outcome} {result.finished}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
