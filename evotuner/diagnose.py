"""``evotuner check`` and ``evotuner profile``: compute-sanitizer verdicts and Nsight
Compute figures for a study's winners, recorded in the study.

Both run the kernel in the GPU worker (``python -m evotuner.measure.worker``,
driven by :class:`~evotuner.measure.GpuMeasure`: own process group, every request
under a timeout, killed and reaped on a hang), with the tool in front of the
worker's command line and its output sent to a log file (never the reply pipe):

* check: one worker per (config, tool) under ``compute-sanitizer --tool T``; the
  ``sanitize`` request runs the config once at each of :func:`ragged_shapes`
  (D, dtype and causal from the study; neither length a multiple of the tiles;
  Sq != Sk both ways); the log is parsed by :mod:`evotuner.tools.sanitizer`. A
  config passes a tool when the tool's summary reports nothing, the worker
  answered, and every output was finite.
* profile: one worker per config (and one for SDPA's default backend) under
  ``ncu``; the ``profile`` request makes exactly one call at the study's shape
  between cudaProfilerStart/Stop; :mod:`evotuner.tools.ncu` reduces the raw page
  to the recorded figures.

Nothing here prints; the CLI renders the values this module returns.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from evotuner import childproc
from evotuner.config import KernelConfig
from evotuner.errors import EvotunerError
from evotuner.problem import Problem
from evotuner.tools import ToolError, ncu, sanitizer

#: Seconds one tool run may take (worker start under the tool included).
DEFAULT_TIMEOUT_S = 600.0
#: Seconds the worker (and the tool in front of it) gets to exit and write its summary.
EXIT_GRACE_S = 120.0
#: SDPA's default backend: the subject name its profile is recorded under.
SDPA_SUBJECT = "sdpa_default"
#: Which figures the CLI shows, in order, with their headings.
PROFILE_COLUMNS = (
    ("duration_us", "duration under ncu, µs"), ("achieved_occupancy_pct", "achieved occupancy %"),
    ("theoretical_occupancy_pct", "theoretical occupancy %"), ("tensor_pipe_pct", "tensor pipe %"),
    ("dram_throughput_pct", "DRAM throughput %"), ("l2_throughput_pct", "L2 throughput %"),
    ("smem_bank_conflicts", "smem bank conflicts"), ("registers", "registers/thread"),
)


@dataclass(frozen=True)
class Target:
    """One config to check or profile: where it came from and its cubin."""

    config: KernelConfig
    trial: int | None            # the study's trial number (None for --config)
    median_us: float | None
    artifact: Any = None         # evotuner.compiler.result.Artifact, None when the build failed
    build_error: str | None = None


@dataclass(frozen=True)
class CheckOutcome:
    config: str
    tool: str
    passed: bool
    errors: int
    warnings: int
    complete: bool
    findings: tuple[str, ...]
    shapes: tuple[str, ...]
    seconds: float
    tool_version: str


@dataclass(frozen=True)
class ProfileOutcome:
    subject: str                 # str(KernelConfig) or SDPA_SUBJECT
    kind: str                    # "config" or "sdpa"
    figures: dict[str, Any] | None = field(default=None, hash=False)
    seconds: float = 0.0
    error: str | None = None     # why no figures (the run failed)
    tool_version: str = ""


def ragged_shapes(problem: Problem, meta: dict[str, int] | None = None) -> list[tuple[int, int, int, int]]:
    """Four small (B, H, Sq, Sk) shapes with partial tiles on both axes and Sq != Sk both
    ways (D, dtype and causal are the study's): two fixed ones and two from the config's
    query x key tile, the meta table's ``block_m`` x ``block_n`` where the family records them
    (one tile + 1 row; two tiles - 3 rows against one tile - 5 keys)."""
    meta = meta or {}
    bm, bn = int(meta.get("block_m") or 128), int(meta.get("block_n") or 64)

    def off(n: int, *tiles: int) -> int:
        n = max(n, 3)
        while any(n % t == 0 for t in tiles if t > 1):
            n += 1
        return n

    return [(1, 2, off(97, bm, bn), off(203, bm, bn)), (2, 1, off(203, bm, bn), off(97, bm, bn)),
            (1, 1, off(bm + 1, bm, bn), off(2 * bn + 3, bm, bn)), (1, 2, off(2 * bm - 3, bm, bn), off(bn - 5, bm, bn))]


def tool_version(exe: Path | str) -> str:
    """The ``Version ...`` line of ``exe --version`` ('' when it cannot be read)."""
    try:
        out = childproc.run([str(exe), "--version"], timeout_s=60)
    except OSError:
        return ""
    if out.timed_out:
        return ""
    text = out.output.decode("utf-8", errors="replace")
    lines = [l.strip() for l in text.splitlines() if "version" in l.lower()]
    return lines[-1] if lines else ""


def build_targets(space: Any, problem: Problem, picks: list[tuple[int | None, KernelConfig, float | None]]
                  ) -> list[Target]:
    """Build (or take from the cache) each config's cubin; a failed build is a Target with its error."""
    from evotuner.compiler import Builder

    targets = []
    with Builder(space.kernel, arch=space.arch) as builder:
        futures = [(trial, cfg, us, builder.submit(cfg, problem)) for trial, cfg, us in picks]
        for trial, cfg, us, fut in futures:
            result = fut.result()
            if result.ok and result.artifact is not None:
                targets.append(Target(cfg, trial, us, artifact=result.artifact))
            else:
                first = (result.error or "build failed").strip().splitlines()
                targets.append(Target(cfg, trial, us, build_error=first[0] if first else "build failed"))
    return targets


def _artifact_args(artifact: Any, problem: Problem) -> dict[str, Any]:
    return {"cubin": str(artifact.cubin), "entry": artifact.entry, "family": artifact.family, "key": artifact.key,
            "sha256": artifact.sha256, "meta": dict(artifact.meta), "problem": problem.as_dict()}


def _worker(prefix: list[str], timeout_s: float, python: str) -> Any:
    from evotuner.measure import GpuMeasure

    gm = GpuMeasure(worker_cmd=[*prefix, python, "-m", "evotuner.measure.worker"], timeout_s=timeout_s,
                    start_timeout_s=timeout_s)
    gm.shutdown_grace_s = EXIT_GRACE_S
    return gm


def sanitize(target: Target, problem: Problem, tool: str, *, exe: Path | str, version: str = "",
             timeout_s: float = DEFAULT_TIMEOUT_S, python: str = sys.executable, seed: int = 0) -> CheckOutcome:
    """Run one config under one compute-sanitizer tool at the ragged shapes; never raises for a bad kernel."""
    config = str(target.config)
    if target.artifact is None:
        return CheckOutcome(config, tool, False, 0, 0, False, (f"build failed: {target.build_error}",), (), 0.0, version)
    shapes = ragged_shapes(problem, target.artifact.meta)
    shape_names = tuple(f"B={b},H={h},SQ={sq},SK={sk},D={problem.shape.head_dim}" for b, h, sq, sk in shapes)
    with tempfile.TemporaryDirectory(prefix="evotuner-check-") as tmp:
        log = Path(tmp) / f"{tool}.log"
        gm = _worker(sanitizer.command(exe, tool, log, kernel_substring=target.artifact.entry), timeout_s, python)
        start = time.monotonic()
        try:
            reply = gm.call("sanitize", {**_artifact_args(target.artifact, problem), "shapes": [list(s) for s in shapes],
                                         "seed": seed}, timeout_s)
        finally:
            gm.close()
        seconds = time.monotonic() - start
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    report = sanitizer.parse_log(text, tool)
    findings = list(report.findings)
    passed = report.passed
    if not reply.ok:
        assert reply.failure is not None
        passed = False
        findings.append(f"worker: {reply.failure.kind}: {reply.failure.reason[:500]}")
    else:
        bad = [s["shape"] for s in (reply.value or {}).get("shapes", []) if not s.get("finite", False)]
        if bad:
            passed = False
            findings.append(f"output not finite at {', '.join(bad)}")
    if not text:
        findings.append(f"compute-sanitizer wrote no log ({log.name})")
    if not report.complete and text:
        findings.append("no summary in the log: the tool did not finish (timeout or killed)")
    return CheckOutcome(config, tool, passed, report.errors, report.warnings, report.complete,
                        tuple(findings[: sanitizer.KEEP_FINDINGS + 2]), shape_names, seconds, version)


def profile(problem: Problem, *, exe: Path | str, target: Target | None = None, version: str = "",
            timeout_s: float = DEFAULT_TIMEOUT_S, python: str = sys.executable) -> ProfileOutcome:
    """ncu on one call of the config (or of SDPA's default backend when ``target`` is None)
    at the problem's shape. Raises ProfilerPermissionError (every later run would fail the
    same way); any other failure is an outcome with its error."""
    kind = "sdpa" if target is None else "config"
    subject = SDPA_SUBJECT if target is None else str(target.config)
    if target is not None and target.artifact is None:
        return ProfileOutcome(subject, kind, error=f"build failed: {target.build_error}", tool_version=version)
    args: dict[str, Any] = {"kind": kind, "problem": problem.as_dict()}
    if target is not None:
        args.update(_artifact_args(target.artifact, problem))
    with tempfile.TemporaryDirectory(prefix="evotuner-profile-") as tmp:
        log = Path(tmp) / "ncu.log"
        gm = _worker(ncu.command(exe, log), timeout_s, python)
        start = time.monotonic()
        try:
            reply = gm.call("profile", args, timeout_s)
        finally:
            gm.close()
        seconds = time.monotonic() - start
        text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    try:
        profiles = ncu.parse_raw_csv(text)
    except ToolError as exc:
        if type(exc).__name__ == "ProfilerPermissionError":
            raise
        why = reply.failure.reason if not reply.ok and reply.failure else exc.message
        return ProfileOutcome(subject, kind, seconds=seconds, error=why[:500], tool_version=version)
    if not reply.ok and reply.failure is not None:
        return ProfileOutcome(subject, kind, seconds=seconds, error=f"{reply.failure.kind}: {reply.failure.reason[:500]}",
                              tool_version=version)
    return ProfileOutcome(subject, kind, figures=ncu.combine(profiles), seconds=seconds, tool_version=version)


def require_gpu(command: str) -> None:
    """NoGpuError (one line, naming what is missing) when no CUDA GPU can be used."""
    from evotuner.errors import NoGpuError
    from evotuner import measure

    if not measure.gpu_available():
        raise NoGpuError(f"no CUDA GPU on this machine: evotuner {command} runs the kernel on one",
                         f"run `evotuner {command}` on the machine with the NVIDIA Hopper GPU (check `nvidia-smi`)")


def iter_checks(targets: list[Target], problem: Problem, tools: tuple[str, ...], *, exe: Path | str,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[tuple[Target, CheckOutcome]]:
    """Every (target, tool) outcome, in order; the caller records and renders each as it comes."""
    version = tool_version(exe)
    for target in targets:
        for tool in tools:
            yield target, sanitize(target, problem, tool, exe=exe, version=version, timeout_s=timeout_s)


def parse_tools(text: str | None) -> tuple[str, ...]:
    """``memcheck,racecheck`` -> the tools, in the given order; None -> all of sanitizer.TOOLS
    (an empty --tools names none, and is refused)."""
    if text is None:
        return sanitizer.TOOLS
    tools = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = [t for t in tools if t not in sanitizer.TOOLS]
    if unknown or not tools:
        raise EvotunerError(f"--tools: unknown compute-sanitizer tool {', '.join(unknown) or '(none)'}",
                            f"use a comma-separated subset of {','.join(sanitizer.TOOLS)}")
    return tools
