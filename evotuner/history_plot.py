"""``history.png``: the tuned improvement made visible.

The y axis is fitted to the study's own latencies: from just below its best to
the slower of its first best and the 90th percentile of its trials. An SDPA
backend far slower (or faster) than every config would otherwise stretch the
axis until the best-so-far line is flat; such a baseline is marked at the edge
it lies beyond, with its value. Trials slower than the axis are drawn as
triangles on the top edge. PRUNED and FAIL trials, which have no latency, are
drawn in a strip under the axis, one marker per reason class (see
:func:`reason_class`), so a run of failures is visible where it happened.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evotuner.measure.base import FAILURE_KINDS

#: The share of trials the axis must show whole; slower ones sit on the top edge.
SHOWN_QUANTILE = 0.9
_MARKERS = {"constraint": "x", "gate": "s", "build": "D", "interrupted": "|"}


@dataclass(frozen=True)
class HistoryFacts:
    """What history.png shows (written to report.json so it can be checked)."""

    ylim: tuple[float, float] | None
    above_axis: int = 0                                   # trials slower than the axis (drawn on the edge)
    off_scale_baselines: dict[str, float] = field(default_factory=dict)
    not_measured: dict[str, int] = field(default_factory=dict)   # "PRUNED constraint" -> count

    def as_json(self) -> dict[str, Any]:
        return {"ylim": list(self.ylim) if self.ylim else None, "above_axis": self.above_axis,
                "off_scale_baselines": self.off_scale_baselines, "not_measured": self.not_measured}


def reason_class(trial: Any) -> str:
    """``PRUNED constraint|gate``, ``FAIL build|<measure kind>|interrupted|error``."""
    reason = str(getattr(trial, "error", None) or "")
    if trial.state == "PRUNED":
        return "PRUNED gate" if getattr(trial, "gate", None) else "PRUNED constraint"
    if reason.startswith("interrupted"):
        return "FAIL interrupted"
    kind = reason.split(":", 1)[0].strip()
    if kind in FAILURE_KINDS:
        return f"FAIL {kind}"
    return "FAIL build" if not getattr(trial, "gate", None) else "FAIL error"


def _axis(values: list[float], best_line: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    q = ordered[min(len(ordered) - 1, max(0, math.ceil(SHOWN_QUANTILE * len(ordered)) - 1))]
    lo, hi = min(ordered), max(q, best_line[0])
    pad = max((hi - lo) * 0.06, lo * 0.005, 1e-6)
    return lo - pad, hi + pad


def draw_history(plt: Any, summary: Any, title: str, path: Any) -> HistoryFacts:
    """Write history.png for ``summary`` (a StudySummary) to ``path`` (a path or a binary
    file) and return what it shows."""
    trials = sorted(summary.trials, key=lambda t: t.number)
    complete = [t for t in trials if t.state == "COMPLETE" and t.value is not None]
    unmeasured = [t for t in trials if t.state in ("PRUNED", "FAIL")]
    fig, (ax, strip) = plt.subplots(2, 1, figsize=(8, 5.4), sharex=True,
                                    gridspec_kw={"height_ratios": [5, 1], "hspace": 0.05})
    facts_ylim = None
    above = 0
    off_scale: dict[str, float] = {}
    if complete:
        best, bx, by = math.inf, [], []
        for t in complete:
            best = min(best, t.value)
            bx.append(t.number)
            by.append(best)
        lo, hi = _axis([t.value for t in complete], by)
        facts_ylim = (lo, hi)
        own = [t for t in complete if t.duplicate_of is None and t.value <= hi]
        copies = [t for t in complete if t.duplicate_of is not None and t.value <= hi]
        slow = [t for t in complete if t.value > hi]
        above = len(slow)
        ax.scatter([t.number for t in own], [t.value for t in own], s=16, color="tab:blue", alpha=0.7,
                   label="COMPLETE trial (median µs)")
        if copies:
            ax.scatter([t.number for t in copies], [t.value for t in copies], s=16, facecolors="none",
                       edgecolors="tab:blue", alpha=0.5, label="repeat of an earlier config (not re-measured)")
        if slow:
            ax.scatter([t.number for t in slow], [hi] * len(slow), marker="^", s=22, color="tab:blue",
                       alpha=0.5, clip_on=False, label=f"{len(slow)} slower trials (above the axis)")
        last = trials[-1].number
        ax.step(bx + [last], by + [by[-1]], where="post", color="tab:red", linewidth=2,
                label=f"best so far: {by[0]:.1f} -> {by[-1]:.1f} µs")
        ax.set_ylim(lo, hi)
        styles = iter(["--", ":", "-.", (0, (5, 1))])
        stacked = Counter()                      # off-scale labels at each edge so far: one under the other
        for name, us in sorted(summary.baselines.items()):
            if us is None:
                continue
            if lo <= us <= hi:
                ax.axhline(us, color="grey", linestyle=next(styles, "--"), linewidth=1.2,
                           label=f"{name} {us:.1f} µs")
                continue
            off_scale[name] = us
            edge, va, arrow, step = (hi, "top", "↑", -11) if us > hi else (lo, "bottom", "↓", 11)
            ax.annotate(f"{arrow} {name} {us:.1f} µs (off scale)", xy=(0.01, edge), xycoords=("axes fraction", "data"),
                        xytext=(0, step * stacked[edge]), textcoords="offset points",
                        va=va, ha="left", fontsize=8, color="dimgrey")
            stacked[edge] += 1
    else:
        ax.text(0.5, 0.5, "no COMPLETE trial yet", transform=ax.transAxes, ha="center", va="center")
    counts = Counter(reason_class(t) for t in unmeasured)
    classes = sorted(counts)
    for row, cls in enumerate(classes):
        xs = [t.number for t in unmeasured if reason_class(t) == cls]
        kind = cls.split(" ", 1)[1]
        strip.scatter(xs, [row] * len(xs), s=14, marker=_MARKERS.get(kind, "o"),
                      color="tab:orange" if cls.startswith("PRUNED") else "tab:red",
                      label=f"{cls} ({counts[cls]})")
    strip.set_yticks(range(len(classes)))
    strip.set_yticklabels(classes, fontsize=7)
    strip.set_ylim(-0.7, max(0.7, len(classes) - 0.3))
    if not classes:
        strip.text(0.5, 0.5, "no PRUNED or FAIL trial", transform=strip.transAxes, ha="center", va="center",
                   fontsize=8)
    strip.set_xlabel("trial number")
    strip.grid(alpha=0.3, axis="x")
    ax.set_ylabel("median latency (µs, lower is better)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    # the legend beside the plot, never over its points (bbox_inches="tight" makes room for it);
    # none where nothing is labelled (no COMPLETE trial, no baseline on the scale)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.savefig(path, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return HistoryFacts(ylim=facts_ylim, above_axis=above, off_scale_baselines=off_scale,
                        not_measured=dict(sorted(counts.items())))
