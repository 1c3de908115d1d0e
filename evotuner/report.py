"""Study reports: PNG plots (and HTML where plotly is installed) of one study.

``write_report(store, study, output_dir)`` writes

* ``history.png`` -- every COMPLETE trial's median µs by trial number, the best
  so far as a step line, the study's SDPA baselines as horizontal lines (marked at
  the edge when off the study's scale), and PRUNED/FAIL trials by reason class in a
  strip below (:mod:`evotuner.history_plot`);
* ``importances.png`` -- Optuna's parameter importances (fANOVA by default);
  needs at least two COMPLETE trials with differing parameters;
* ``resources.png`` -- latency against registers per thread and against shared
  memory per block, from the ptxas figures the gate recorded;
* ``history.html`` / ``importances.html`` -- optuna.visualization's interactive
  versions, only when plotly is installed;
* ``report.json`` -- the files written and, for every plot left out, why.

Every file goes through evotuner's output rule (:mod:`evotuner.atomicfile`): a name
that is a symbolic link, not a regular file, or the study database is refused before
anything is drawn, and each file is written to a temporary file and renamed.

Matplotlib (the ``report`` extra) renders with the Agg backend; nothing is shown
or printed, and its font cache goes to a temporary folder, not the user's home
(:func:`_private_matplotlib_folder`). Parameter names are the space's, not Optuna's ``<NAME>_index`` names.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evotuner.atomicfile import check_target, output_file, write_text_atomic
from evotuner.errors import EvotunerError
from evotuner.history_plot import draw_history
from evotuner.storage import StudyStore
from evotuner.vocabulary import INDEX_SUFFIX



class ReportError(EvotunerError):
    """A report cannot be written (matplotlib missing, output not writable)."""


@dataclass(frozen=True)
class Report:
    files: tuple[Path, ...]
    skipped: dict[str, str] = field(default_factory=dict, hash=False)   # plot -> why it is missing


def write_report(store: StudyStore, study_name: str, output_dir: str | Path) -> list[Path]:
    """Write the study's plots into ``output_dir`` (created); return the files written."""
    return list(make_report(store, study_name, output_dir).files)


def make_report(store: StudyStore, study_name: str, output_dir: str | Path) -> Report:
    """Like :func:`write_report`, also saying which plots were left out and why."""
    if str(output_dir) == "-":      # the usual "standard output" would be a stray folder named '-'
        raise ReportError("--output -: report writes a folder of plots, not to standard output",
                          "name the folder, e.g. -o report (./- for a folder named '-')")
    plt = _pyplot()
    out = Path(output_dir)
    summary = store.summary(study_name)        # a study not found, or a damaged trial, creates no folder
    study = store.optuna_study(study_name)
    if out.exists() and not out.is_dir():
        raise ReportError(f"--output {out} is a file, not a folder", "pass a folder (created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"--output {out}: cannot create the report folder: {exc.strerror}",
                          "pass a writable folder whose parents are folders") from None
    protect = store.database_files()
    for name in REPORT_FILES:                  # refuse a link or the database before drawing anything
        check_target(out / name, protect=protect)
    files: list[Path] = []
    skipped: dict[str, str] = {}
    complete = [t for t in summary.trials if t.state == "COMPLETE" and t.value is not None]

    with output_file(out / "history.png", protect=protect) as f:
        history = draw_history(plt, summary, _title(summary), f)
    files.append(out / "history.png")

    importances, why = _importances(study, complete)
    if importances is None:
        skipped["importances.png"] = why
    else:
        with output_file(out / "importances.png", protect=protect) as f:
            _importance_plot(plt, summary, importances, f)
        files.append(out / "importances.png")

    with_gate = [t for t in complete if t.gate and t.gate.get("registers") is not None]
    if with_gate:
        with output_file(out / "resources.png", protect=protect) as f:
            _resources(plt, summary, with_gate, f)
        files.append(out / "resources.png")
    else:
        skipped["resources.png"] = "no COMPLETE trial has recorded ptxas figures"

    if importlib.util.find_spec("plotly") is None:
        skipped["*.html"] = "plotly is not installed (pip install plotly for the interactive HTML plots)"
    else:
        files.extend(_html(study, importances is not None, out, protect))

    index = out / "report.json"
    write_text_atomic(index, json.dumps({
        "study": summary.study, "trials": len(summary.trials), "complete": len(complete),
        "files": [f.name for f in files], "skipped": skipped, "history": history.as_json(),
    }, indent=2) + "\n", protect=protect)
    files.append(index)
    return Report(tuple(files), skipped)


#: Every file a report may write into its folder (the CLI adds ncu_profiles.md).
REPORT_FILES = ("history.png", "importances.png", "resources.png", "history.html", "importances.html",
                "report.json", "ncu_profiles.md")


# --------------------------------------------------------------------------- plots


def _private_matplotlib_folder() -> None:
    """Matplotlib keeps a font cache in its config folder (``~/.cache/matplotlib`` or
    ``~/.config/matplotlib``), written the first time it draws text. A report writes only
    where it was asked to: unless ``MPLCONFIGDIR`` names a folder (or matplotlib is loaded
    already, its folder chosen), this process gets a temporary one, removed at exit (the
    cache is rebuilt per report: about a second)."""
    if "matplotlib" in sys.modules or os.environ.get("MPLCONFIGDIR"):
        return
    folder = tempfile.mkdtemp(prefix="evotuner-matplotlib-")
    atexit.register(shutil.rmtree, folder, True)
    os.environ["MPLCONFIGDIR"] = folder


def _pyplot() -> Any:
    if importlib.util.find_spec("matplotlib") is None:
        raise ReportError("evotuner report needs matplotlib, which is not installed",
                          "in the checkout: pip install -e '.[report]' (or pip install matplotlib)")
    _private_matplotlib_folder()
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _title(summary: Any) -> str:
    p = summary.problem
    device = summary.device or {}
    on = f"replayed from a sweep recorded on {device.get('name', 'no device')}" if device.get("replayed") \
        else f"on {device.get('name', 'no device')}"
    what = str(p) if p.lengths_q else f"{p.shape} {p.dtype}{' causal' if p.causal else ''}"
    return f"{summary.study}: {what} {on}"


def _importances(study: Any, complete: list[Any]) -> tuple[dict[str, float] | None, str]:
    if len(complete) < 2:
        return None, f"parameter importances need at least 2 COMPLETE trials; the study has {len(complete)}"
    import optuna

    try:
        raw = optuna.importance.get_param_importances(study)
    except (ValueError, RuntimeError) as exc:   # e.g. every COMPLETE trial has the same params
        return None, f"optuna could not compute parameter importances: {str(exc).splitlines()[0]}"
    if not raw:
        return None, "optuna found no parameter that varies across COMPLETE trials"
    return {_display(k): float(v) for k, v in raw.items()}, ""


def _display(name: str) -> str:
    return name[: -len(INDEX_SUFFIX)] if name.endswith(INDEX_SUFFIX) else name


def _importance_plot(plt: Any, summary: Any, importances: dict[str, float], path: Any) -> Any:
    names = list(importances)[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.6))
    ax.barh(names, [importances[n] for n in names], color="tab:green")
    for i, n in enumerate(names):
        ax.text(importances[n], i, f" {importances[n]:.2f}", va="center", fontsize=8)
    ax.set_xlabel("importance for median latency (fANOVA, sums to 1)")
    ax.set_xlim(0, max(1.0, max(importances.values()) * 1.15))
    ax.set_title(_title(summary), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)
    return path


def _resources(plt: Any, summary: Any, trials: list[Any], path: Any) -> Any:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    ys = [t.value for t in trials]
    for ax, key, label in ((axes[0], "registers", "registers per thread"),
                           (axes[1], "smem", "shared memory per block (KiB)")):
        xs = [t.gate.get(key) for t in trials]
        pts = [(x / 1024 if key == "smem" else x, y) for x, y in zip(xs, ys) if x is not None]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=16, alpha=0.7, color="tab:purple")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("median latency (µs)")
    best = min(trials, key=lambda t: t.value)
    for ax, key in ((axes[0], "registers"), (axes[1], "smem")):
        x = best.gate.get(key)
        if x is not None:
            ax.scatter([x / 1024 if key == "smem" else x], [best.value], s=60, color="tab:red", marker="*",
                       label=f"best #{best.number}")
            ax.legend(fontsize=8)
    fig.suptitle(_title(summary), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)
    return path


def _html(study: Any, importances: bool, out: Path, protect: tuple[Path, ...]) -> list[Path]:
    import optuna

    files = []
    fig = optuna.visualization.plot_optimization_history(study)
    write_text_atomic(out / "history.html", fig.to_html(), protect=protect)
    files.append(out / "history.html")
    if importances:
        fig = optuna.visualization.plot_param_importances(study)
        write_text_atomic(out / "importances.html", fig.to_html(), protect=protect)
        files.append(out / "importances.html")
    return files
