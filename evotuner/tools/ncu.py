"""Nsight Compute (ncu): the command evotuner runs and a parser for its raw CSV page.

evotuner profiles one kernel launch that the GPU worker brackets with
cudaProfilerStart/Stop (``--profile-from-start off``), so warm-up launches and
torch's own kernels are never profiled::

    ncu --profile-from-start off --csv --page raw --print-units base
        --section SpeedOfLight --section Occupancy ... --metrics <METRICS>
        --log-file LOG python -m evotuner.measure.worker

``--log-file`` keeps the tool's output off the worker's reply pipe. The raw page
is one CSV: a header row of metric names, a units row, then one row per profiled
kernel; numbers carry thousands separators (``1,071,616``). Lines around it start
with ``==PROF==``, ``==WARNING==`` or ``==ERROR==``. Real outputs (ncu 2025.3.1,
H100): tests/data/tools/ncu/.

:func:`figures` reduces a kernel's row to the short set the study records.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evotuner.tools import ProfilerPermissionError, ToolError, find_tool

EXECUTABLE = "ncu"
ENV_VAR = "EVOTUNER_NCU"

#: The sections collected (their metrics all appear on the raw page).
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "MemoryWorkloadAnalysis_Tables",
            "ComputeWorkloadAnalysis")
#: Metrics asked for on top of the sections (checked on ncu 2025.3.1, H100).
METRICS = (
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_hmma.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread",
)

#: figure name -> (candidate raw metrics, first present wins; scale applied to the value).
FIGURES: dict[str, tuple[tuple[str, ...], float]] = {
    "duration_us": (("gpu__time_duration.sum",), 1e-3),           # ns -> µs (--print-units base)
    "achieved_occupancy_pct": (("sm__warps_active.avg.pct_of_peak_sustained_active",), 1.0),
    "theoretical_occupancy_pct": (("sm__maximum_warps_per_active_cycle_pct",), 1.0),
    "tensor_pipe_pct": (("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
                         "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"), 1.0),
    "sm_throughput_pct": (("sm__throughput.avg.pct_of_peak_sustained_elapsed",), 1.0),
    "dram_throughput_pct": (("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                             "dram__throughput.avg.pct_of_peak_sustained_elapsed"), 1.0),
    "l2_throughput_pct": (("lts__throughput.avg.pct_of_peak_sustained_elapsed",), 1.0),
    "smem_bank_conflicts": (("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",), 1.0),
    "smem_bank_conflicts_ld": (("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",), 1.0),
    "smem_bank_conflicts_st": (("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",), 1.0),
    "registers": (("launch__registers_per_thread",), 1.0),
    "smem_per_block": (("launch__shared_mem_per_block",), 1.0),
    "block_size": (("launch__block_size",), 1.0),
    "grid_size": (("launch__grid_size",), 1.0),
}
#: Warp stall reasons: ``smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio``
#: (warps stalled per issued instruction). "selected" is the issuing warp, not a stall.
_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
_NOT_STALLS = ("selected",)
TOP_STALLS = 3

_PERMISSION = "ERR_NVGPUCTRPERM"


@dataclass(frozen=True)
class KernelProfile:
    """One profiled kernel: its name and the raw page's values (numbers where they parse)."""

    kernel: str
    values: dict[str, Any] = field(hash=False)
    units: dict[str, str] = field(hash=False, default_factory=dict)


def executable() -> Path:
    """ncu's path; :class:`~evotuner.tools.ToolMissingError` when absent."""
    return find_tool(EXECUTABLE, ENV_VAR)


def command(exe: Path | str, log_file: Path | str) -> list[str]:
    """The ncu prefix (the worker's command line follows it)."""
    cmd = [str(exe), "--profile-from-start", "off", "--csv", "--page", "raw", "--print-units", "base"]
    for section in SECTIONS:
        cmd += ["--section", section]
    return cmd + ["--metrics", ",".join(METRICS), "--log-file", str(log_file)]


def _number(text: str) -> Any:
    t = text.strip()
    if not t:
        return None
    try:
        return float(t.replace(",", "")) if re.fullmatch(r"-?[\d,]*\.?\d+(e[-+]?\d+)?", t, re.I) else t
    except ValueError:
        return t


def tool_errors(text: str) -> list[str]:
    """The ``==ERROR==`` lines of an ncu output."""
    return [line.strip()[len("==ERROR=="):].strip() for line in text.splitlines() if line.startswith("==ERROR==")]


def parse_raw_csv(text: str) -> list[KernelProfile]:
    """Every kernel of an ``ncu --csv --page raw`` output.

    Raises :class:`~evotuner.tools.ProfilerPermissionError` for ERR_NVGPUCTRPERM and
    :class:`~evotuner.tools.ToolError` when ncu reported an error or profiled nothing.
    """
    errors = tool_errors(text)
    if any(_PERMISSION in e for e in errors) or _PERMISSION in text:
        raise ProfilerPermissionError(
            "ncu: no permission to read the GPU's performance counters (ERR_NVGPUCTRPERM)",
            "run as root, or set the nvidia module option NVreg_RestrictProfilingToAdminUsers=0 "
            "(https://developer.nvidia.com/ERR_NVGPUCTRPERM)",
        )
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID",')), None)
    if start is None:
        if errors:
            raise ToolError(f"ncu: {errors[0]}", "see the ncu log for the whole message")
        warned = [l.strip() for l in lines if "No kernels were profiled" in l]
        raise ToolError("ncu profiled no kernel" + (f" ({warned[0]})" if warned else ""),
                        "check that the kernel ran between cudaProfilerStart and cudaProfilerStop")
    body = [l for l in lines[start:] if l.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(body))))
    header, data = rows[0], rows[1:]
    units: dict[str, str] = {}
    if data and data[0] and data[0][0] == "":     # the units row (--print-units base)
        units = {h: u for h, u in zip(header, data[0]) if u}
        data = data[1:]
    profiles = []
    for row in data:
        values = {h: _number(v) for h, v in zip(header, row)}
        profiles.append(KernelProfile(kernel=str(values.get("Kernel Name") or "?"), values=values, units=units))
    if not profiles:
        raise ToolError("ncu profiled no kernel (empty raw page)",
                        "check that the kernel ran between cudaProfilerStart and cudaProfilerStop")
    return profiles


def figures(profile: KernelProfile) -> dict[str, Any]:
    """The study's short set of figures for one kernel (None where ncu did not report one)."""
    out: dict[str, Any] = {"kernel": profile.kernel}
    for name, (candidates, scale) in FIGURES.items():
        value = next((profile.values[c] for c in candidates if isinstance(profile.values.get(c), float)), None)
        out[name] = None if value is None else (int(value) if name in _INTEGRAL else round(value * scale, 4))
    stalls = sorted(((m.group(1), v) for k, v in profile.values.items()
                     if (m := _STALL.match(k)) and isinstance(v, float) and m.group(1) not in _NOT_STALLS),
                    key=lambda kv: -kv[1])
    out["top_stalls"] = [[reason, round(v, 3)] for reason, v in stalls[:TOP_STALLS] if v > 0]
    return out


_INTEGRAL = {"smem_bank_conflicts", "smem_bank_conflicts_ld", "smem_bank_conflicts_st", "registers",
             "smem_per_block", "block_size", "grid_size"}


def combine(profiles: list[KernelProfile]) -> dict[str, Any]:
    """Figures of the kernel that ran longest (SDPA may launch helpers beside its main kernel),
    with the number of kernels profiled and their total duration."""
    figs = [figures(p) for p in profiles]
    main = max(figs, key=lambda f: f.get("duration_us") or 0.0)
    out = dict(main)
    out["kernels"] = len(figs)
    out["total_duration_us"] = round(sum(f.get("duration_us") or 0.0 for f in figs), 4)
    return out
