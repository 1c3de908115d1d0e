"""compute-sanitizer: the command evotuner runs and a parser for its log.

evotuner runs one tool per worker process::

    compute-sanitizer --tool memcheck --kernel-name kns=flashcore_fwd \\
        --log-file LOG --print-limit 20 python -m evotuner.measure.worker

``--log-file`` keeps every line the tool writes off the worker's stdout (the
reply pipe of :mod:`evotuner.measure.protocol`); ``--kernel-name`` instruments
only the tuned kernel (torch's own kernels run unchecked, and fast) -- except for
initcheck: it learns which global memory is initialised by watching the kernels
that write it, so with the filter every read of q/k/v (written by torch's kernels)
is "uninitialized". Measured on the H100: the recommended d64 config under
``initcheck --kernel-name kns=flashcore_fwd`` reported 30,536 uninitialized 16-byte
reads at the four ragged shapes, which is every valid q/k/v chunk load the kernel
makes there (30,552 by count; its out-of-range rows are zero-filled cp.async from
a valid address); initcheck therefore runs unfiltered.

The log (tests/data/tools/sanitizer/ holds real ones, compute-sanitizer 2025.3.1,
H100) is ``=========``-prefixed: a banner, one block per finding separated by an
empty ``=========`` line, ``Target application returned an error`` when the
process failed, and a summary::

    ========= ERROR SUMMARY: 4 errors                                  (memcheck, synccheck, initcheck)
    ========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)   (racecheck)

A log without its summary (the tool was killed at a timeout) parses as
incomplete: it never passes, and its count is the findings it holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from evotuner.tools import find_tool

#: The tools ``evotuner check`` runs, in order. initcheck applies to every FlashCore
#: config (the kernel reads only global memory its caller wrote: q, k, v; out-of-range
#: rows are zero-filled, never read).
TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
EXECUTABLE = "compute-sanitizer"
ENV_VAR = "EVOTUNER_COMPUTE_SANITIZER"
#: Findings printed per run; the summary still counts them all.
PRINT_LIMIT = 20
#: Findings kept per (config, tool) in the study.
KEEP_FINDINGS = 5

_PREFIX = "========="
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*([\d,]+)\s+errors?")
_RACE_SUMMARY = re.compile(
    r"RACECHECK SUMMARY:\s*([\d,]+)\s+hazards? displayed\s*\(([\d,]+)\s+errors?,\s*([\d,]+)\s+warnings?\)")
_AT = re.compile(r"^at (.+)$")
_BY = re.compile(r"^by thread \(([^)]*)\) in block \(([^)]*)\)")


@dataclass(frozen=True)
class SanitizerReport:
    """One tool's verdict on one run."""

    tool: str
    passed: bool
    errors: int                        # the summary's count (findings seen when incomplete)
    warnings: int = 0                  # racecheck's warnings (count against passing)
    complete: bool = True              # the summary line was there
    app_failed: bool = False           # "Target application returned an error"
    findings: tuple[str, ...] = field(default=())   # the first distinct findings, one line each

    def as_dict(self) -> dict[str, object]:
        return {"tool": self.tool, "passed": self.passed, "errors": self.errors, "warnings": self.warnings,
                "complete": self.complete, "app_failed": self.app_failed, "findings": list(self.findings)}


def executable() -> Path:
    """compute-sanitizer's path; :class:`~evotuner.tools.ToolMissingError` when absent."""
    return find_tool(EXECUTABLE, ENV_VAR)


#: Tools that must watch every kernel (see the module docstring): never given --kernel-name.
UNFILTERED = ("initcheck",)


def command(exe: Path | str, tool: str, log_file: Path | str, *, kernel_substring: str) -> list[str]:
    """The sanitizer prefix for one tool (the worker's command line follows it); every tool but
    initcheck watches only kernels whose name contains ``kernel_substring`` (the config's entry)."""
    if tool not in TOOLS:
        raise ValueError(f"unknown compute-sanitizer tool {tool!r}; one of {', '.join(TOOLS)}")
    only = [] if tool in UNFILTERED else ["--kernel-name", f"kns={kernel_substring}"]
    return [str(exe), "--tool", tool, *only, "--log-file", str(log_file), "--print-limit", str(PRINT_LIMIT)]


def _blocks(text: str) -> list[list[str]]:
    """The ``=========`` lines grouped into blocks (split at empty prefixed lines)."""
    blocks: list[list[str]] = [[]]
    for raw in text.splitlines():
        if not raw.startswith(_PREFIX):
            continue
        line = raw[len(_PREFIX):].strip()
        if not line:
            if blocks[-1]:
                blocks.append([])
            continue
        blocks[-1].append(line)
    return [b for b in blocks if b]


def _is_meta(line: str) -> bool:
    return (line == "COMPUTE-SANITIZER" or line.startswith("Target application returned")
            or "SUMMARY:" in line or line.startswith("Error: process didn't terminate"))


def _finding(block: list[str]) -> tuple[str, str] | None:
    """(dedup key, one-line text) of a finding block; None for banner/summary lines."""
    lines = [l for l in block if not _is_meta(l)]
    if not lines:
        return None
    head = lines[0]
    where = next((m.group(1) for l in lines[1:] if (m := _AT.match(l))), None)
    by = next((m for l in lines[1:] if (m := _BY.match(l))), None)
    detail = next((l for l in lines[1:] if l.startswith(("Access to", "Address", "and is"))), None)
    text = head + (f" at {where}" if where else "")
    if by:
        text += f" (thread ({by.group(1)}) block ({by.group(2)}))"
    if detail and detail.startswith("Access to"):
        text += f": {detail}"
    return head + "|" + (where or ""), text


def parse_log(text: str, tool: str) -> SanitizerReport:
    """Parse one compute-sanitizer log (see the module docstring for the format)."""
    if tool not in TOOLS:
        raise ValueError(f"unknown compute-sanitizer tool {tool!r}")
    blocks = _blocks(text)
    lines = [l for b in blocks for l in b]
    app_failed = any(l.startswith("Target application returned an error") for l in lines)
    errors = warnings = None
    for line in lines:
        if (m := _RACE_SUMMARY.search(line)):
            errors, warnings = int(m.group(2).replace(",", "")), int(m.group(3).replace(",", ""))
        elif (m := _ERROR_SUMMARY.search(line)):
            errors = int(m.group(1).replace(",", ""))
    seen: dict[str, list] = {}
    for block in blocks:
        found = _finding(block)
        if found is None:
            continue
        key, line = found
        if key in seen:
            seen[key][1] += 1
        else:
            seen[key] = [line, 1]
    findings = tuple(line + (f" [{n} like it]" if n > 1 else "") for line, n in list(seen.values())[:KEEP_FINDINGS])
    complete = errors is not None
    n_seen = sum(n for _, n in seen.values())
    if errors is None:
        errors = n_seen
    warnings = warnings or 0
    passed = complete and errors == 0 and warnings == 0 and not seen and not app_failed
    return SanitizerReport(tool=tool, passed=passed, errors=errors, warnings=warnings, complete=complete,
                           app_failed=app_failed, findings=findings)
