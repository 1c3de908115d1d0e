"""What a new user meets in the first hour (issue 26), each fixed: replays say so, errors name
the remedy that applies, and the small things (--version, python -m evotuner, the package's
description, dir(evotuner), the history plot's labels and legend)."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import evotuner
import evotuner.measure
from evotuner import cli
from evotuner.storage import StudyStore

from cli_helpers import assert_one_line_error, run, scaffold_env

ROOT = Path(__file__).parent.parent
DATA = ROOT / "tests" / "data"
SHAPE = "B=16,H=16,S=2048,D=64"
HOPPER_SWEEP = DATA / "sweep_h100_hopper_d64.csv"
HOPPER_CONFIG = ("BLOCK_N=128,CONSUMER_WGS=3,EXP_EMU=0,OVERLAP=1,PINGPONG=1,REG_CONS=160,REG_PROD=24,"
                 "RESCALE_LOG2=8,SCHED=2,STAGES=3")


@pytest.fixture
def env(monkeypatch, tmp_path, build_cache_dir):
    scaffold_env(monkeypatch, build_cache_dir, tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    return tmp_path


def _replayed(capsys, db: str, trials: int = 8) -> None:
    code, out, err = run(capsys, "search", "--study", "r", "--shape", SHAPE, "--trials", trials,
                         "--replay", HOPPER_SWEEP, "--space", ROOT / "search_spaces" / "hopper_grid.toml",
                         "--storage", db)
    assert code == 0, err


# -- replays say so ------------------------------------------------------------------------------


def test_a_replayed_study_says_so_in_show_report_and_export(env, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    db = f"sqlite:///{env / 's.db'}"
    _replayed(capsys, db)
    code, out, err = run(capsys, "show", "--study", "r", "--storage", db)
    assert code == 0, err
    device = next(line for line in out.splitlines() if line.startswith("device"))
    assert "NVIDIA H100" in device and "replayed from a recorded sweep" in device

    titles: list[str] = []
    save = Figure.savefig

    def spy(fig, fname, *args, **kwargs):
        titles.extend(t for ax in fig.axes for t in [ax.get_title(), fig._suptitle.get_text() if fig._suptitle else ""]
                      if t)
        return save(fig, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    code, out, err = run(capsys, "report", "--study", "r", "--output", env / "rep", "--storage", db)
    assert code == 0, err
    assert titles and all("replayed from a sweep recorded on NVIDIA H100" in t for t in titles), titles

    header = env / "tuned.h"
    code, out, err = run(capsys, "export", "--study", "r", "--output", header, "--storage", db)
    assert code == 0, err
    assert "r #" in out and "(replayed)" in out
    text = header.read_text()
    assert "replayed from a sweep recorded on that device: not measured by this study" in text
    assert "; device NVIDIA H100 80GB HBM3\n" in text                 # the device line names only the GPU


# -- errors that name their remedy ---------------------------------------------------------------


def test_a_hopper_config_in_the_flashcore_space_names_the_hopper_space(env, capsys):
    code, out, err = run(capsys, "compile", "--config", HOPPER_CONFIG, "--shape", "D=64", "--space", "flashcore")
    assert_one_line_error(code, out, err, "unknown parameter", "--space hopper", 'family="hopper"')


def test_a_replay_with_another_space_names_the_space_the_sweep_records(env, capsys):
    db = f"sqlite:///{env / 's.db'}"
    for space in ("hopper", "flashcore"):
        code, out, err = run(capsys, "search", "--study", f"x{space}", "--shape", SHAPE, "--replay", HOPPER_SWEEP,
                             "--space", space, "--storage", db)
        assert_one_line_error(code, out, err, "--replay", "recorded with space hopper_grid",
                              "--space hopper_grid")


def test_resume_and_bench_without_a_gpu_name_what_works_here(env, capsys, monkeypatch):
    db = f"sqlite:///{env / 's.db'}"
    _replayed(capsys, db, trials=3)
    monkeypatch.setattr(evotuner.measure, "gpu_available", lambda *a, **k: False)
    run_ = lambda *argv: cli.main([str(a) for a in argv])  # noqa: E731 -- the real GPU stage, not the scaffold
    code = run_("resume", "--study", "r", "--storage", db)
    out, err = capsys.readouterr()
    assert_one_line_error(code, out, err, "no CUDA GPU", "evotuner resume --replay SWEEP.csv")
    code = run_("bench", "--study", "r", "--storage", db)
    out, err = capsys.readouterr()
    assert_one_line_error(code, out, err, "no CUDA GPU", "evotuner bench needs one", "search --replay SWEEP.csv")


def test_report_without_matplotlib_gives_the_checkout_install(env, capsys, monkeypatch):
    db = f"sqlite:///{env / 's.db'}"
    _replayed(capsys, db, trials=3)
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find(name, *a))
    code, out, err = run(capsys, "report", "--study", "r", "--output", env / "rep", "--storage", db)
    assert_one_line_error(code, out, err, "needs matplotlib", "pip install -e '.[report]'")


# -- small things --------------------------------------------------------------------------------


def test_version_and_python_dash_m(env, capsys):
    code, out, err = run(capsys, "--version")
    assert code == 0 and out.strip() == f"evotuner {evotuner.__version__}", err
    done = subprocess.run([sys.executable, "-m", "evotuner", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"evotuner {evotuner.__version__}", done.stderr
    done = subprocess.run([sys.executable, "-m", "evotuner", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "search" in done.stdout and "export" in done.stdout


def test_the_package_describes_both_families_and_lists_only_its_names(capsys):
    names = dir(evotuner)
    assert "Any" not in names and "annotations" not in names and "_LAZY" not in names
    assert {"flash_attention", "use_tuned", "__version__"} <= set(names)
    code, out, err = run(capsys, "--help")
    description = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    for text in (evotuner.__doc__, " ".join(out.split()), description):
        assert "for the FlashCore attention kernel" not in text and "FlashCore fused attention CUDA kernel" not in text
        assert "hopper" in text.lower() and "FlashCore" in text and "kernels" in text, text


def test_choose_gives_its_figure_a_unit():
    from evotuner.defaults import fastest_recommended
    from evotuner.problem import Problem, Shape

    _, _, why = fastest_recommended(Problem(Shape.parse(SHAPE)))
    assert "TFLOP/s" in why, why


def test_history_plot_stacks_off_scale_labels_and_keeps_the_legend_off_the_points(env, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    from evotuner.history_plot import draw_history
    from evotuner.report import _pyplot

    db = f"sqlite:///{env / 's.db'}"
    _replayed(capsys, db, trials=12)
    with StudyStore(db, read_only=True) as store:
        summary = store.summary("r")
    far = dataclasses.replace(summary, baselines={"sdpa_efficient": 5200.0, "sdpa_flash": 5000.0,
                                                  "sdpa_default": 4000.0})
    plt = _pyplot()
    drawn = {}
    monkeypatch.setattr(plt, "close", lambda fig: drawn.setdefault("fig", fig))
    facts = draw_history(plt, far, "t", env / "history.png")
    assert len(facts.off_scale_baselines) == 3
    fig = drawn["fig"]
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    labels = [t.get_window_extent(renderer) for t in ax.texts if "off scale" in t.get_text()]
    assert len(labels) == 3
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            assert not a.overlaps(b), (a, b)                        # one under the other, all readable
    legend = ax.get_legend().get_window_extent(renderer)
    assert not legend.overlaps(ax.get_window_extent(renderer))       # beside the plot, not over its points
