"""evotuner.report on replayed studies (real SQLite files, real matplotlib PNGs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from evotuner.loop import run_search
from evotuner.measure.replay import ReplayMeasure, read_sweep
from evotuner.propose import make_sampler
from evotuner.report import make_report, write_report
from evotuner.space import load_space
from evotuner.storage import StudyStore

SWEEP = Path(__file__).parent / "data" / "replay" / "synthetic_d64.csv"


def _study(tmp_path: Path, trials: int, sampler: str = "tpe") -> StudyStore:
    table = read_sweep(SWEEP)
    space = load_space(None)
    replay = ReplayMeasure(SWEEP, table.problem, space)
    store = StudyStore(f"sqlite:///{tmp_path / 'report.db'}")
    store.create_study("r", table.problem, space, sampler_name=sampler, seed=3, source_hash="replay", nvcc_version="none")
    run_search(store=store, study_name="r", problem=table.problem, space=space,
               sampler=make_sampler(sampler, space, 3), seed=3, trials=trials,
               builder=replay.builder(), measure=replay)
    return store


def _png(path: Path) -> tuple[int, int]:
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05          # not a blank canvas
    return image.shape[:2]


def test_report_writes_the_plots(tmp_path: Path) -> None:
    with _study(tmp_path, 50) as store:
        files = write_report(store, "r", tmp_path / "out")
        summary = store.summary("r")
    names = {f.name for f in files}
    assert {"history.png", "importances.png", "resources.png", "report.json"} <= names
    for f in files:
        assert f.is_file() and f.parent == tmp_path / "out"
        if f.suffix == ".png":
            _png(f)
    index = json.loads((tmp_path / "out" / "report.json").read_text())
    assert index["complete"] == sum(1 for t in summary.trials if t.state == "COMPLETE")
    assert set(index["files"]) == names - {"report.json"}
    if "history.html" not in names:
        assert "plotly" in index["skipped"]["*.html"]


def test_report_with_one_complete_trial_skips_importances(tmp_path: Path) -> None:
    with _study(tmp_path, 1, sampler="grid") as store:
        summary = store.summary("r")
        complete = [t for t in summary.trials if t.state == "COMPLETE"]
        assert len(complete) <= 1
        report = make_report(store, "r", tmp_path / "out")
    assert "history.png" in {f.name for f in report.files}
    assert "importances.png" not in {f.name for f in report.files}
    assert "at least 2 COMPLETE trials" in report.skipped["importances.png"]
    _png(tmp_path / "out" / "history.png")


def test_report_unknown_study_is_a_storage_error(tmp_path: Path) -> None:
    from evotuner.errors import StorageError

    with StudyStore(f"sqlite:///{tmp_path / 'empty.db'}") as store, pytest.raises(StorageError, match="nope"):
        write_report(store, "nope", tmp_path / "out")


def test_a_report_writes_nothing_in_the_users_home(tmp_path: Path) -> None:
    """The font cache matplotlib builds on first use goes to a temporary folder, removed at exit:
    the report's files are the only ones written (HOME and XDG folders of a fresh user)."""
    with _study(tmp_path, 12):
        pass
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "MPL"))}
    env.update(HOME=str(home), TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    run = subprocess.run([sys.executable, "-m", "evotuner", "report", "--study", "r", "--output", str(tmp_path / "out"),
                          "--storage", f"sqlite:///{tmp_path / 'report.db'}"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "out" / "history.png").is_file()
    assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == []
    assert list((tmp_path / "tmp").iterdir()) == []          # the temporary folder is gone too
