"""The ptxas gate: read a compiled config's resource report and reject it before
the GPU sees it.

A config that spills, keeps a stack frame, or cannot fit the blocks per SM it
was built for (the meta table's ``min_blocks``) is never timed: the gate returns ``GateResult(passed=False, reason)``
and the loop records the reason as the trial's outcome. Every reason names the
figure, the threshold and a remedy, e.g.
``spills 976 bytes (stores 476, loads 500) > max_spill_bytes=0: ...``.

``parse_ptxas`` reads the ``-Xptxas -v`` report nvcc prints. nvcc 13 prints,
per entry function::

    ptxas info    : Compiling entry function 'my_kernel' for 'sm_90a'
    ptxas info    : Function properties for my_kernel
        256 bytes stack frame, 476 bytes spill stores, 500 bytes spill loads
    ptxas info    : Used 32 registers, used 1 barriers, 256 bytes cumulative stack size, 4096 bytes smem

Older versions omit ``used N barriers`` or add ``N bytes cmem[0]``; every
figure after ``Used N registers`` is optional and read by its own pattern.
Real nvcc 13 reports are kept in ``tests/data/ptxas/``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from evotuner.compiler.result import BuildResult
from evotuner.errors import EvotunerError
from evotuner.family import DEFAULT_FAMILY, KernelFamily, get_family
from evotuner.space import DeviceLimits, GateThresholds

_COMPILING = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_PROPERTIES = "Function properties for "
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CUMULATIVE_STACK = re.compile(r"(\d+) bytes cumulative stack size")


class GateError(EvotunerError):
    """A ptxas report cannot be read (the entry is missing, the log is truncated)."""


@dataclass(frozen=True)
class PtxasReport:
    """What ptxas says about one entry function.

    ``stack`` is the larger of the entry's stack frame and its cumulative
    stack size (which includes non-inlined callees). ``dynamic_smem`` is not in
    the ptxas report: it is the kernel's SMEM_BYTES from the artifact's meta,
    filled in by :func:`apply_gate` (None while unknown).
    """

    entry: str
    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    static_smem: int
    barriers: int
    dynamic_smem: int | None = None

    @property
    def spill_bytes(self) -> int:
        return self.spill_stores + self.spill_loads

    @property
    def smem(self) -> int:
        """Static + dynamic shared memory per block (static only while dynamic is unknown)."""
        return self.static_smem + (self.dynamic_smem or 0)

    def with_dynamic_smem(self, nbytes: int) -> "PtxasReport":
        return replace(self, dynamic_smem=nbytes)

    def as_dict(self) -> dict[str, int]:
        return {
            "registers": self.registers,
            "spill_stores": self.spill_stores,
            "spill_loads": self.spill_loads,
            "stack": self.stack,
            "smem": self.smem,
            "barriers": self.barriers,
        }


@dataclass(frozen=True)
class GateResult:
    """``passed``; else ``reason`` (one line: figure, threshold, remedy) and ``check``,
    the name of the failed check: spills, stack, registers, regs_per_sm, smem_per_block
    or smem_per_sm. ``report`` is the parsed ptxas report the decision was made on."""

    passed: bool
    reason: str | None
    report: PtxasReport
    check: str | None = None


def parse_ptxas(log: str, entry: str = "", *, arch: str | None = None) -> PtxasReport:
    """Read ``entry``'s figures from an nvcc ``-Xptxas -v`` log ("": the log's only entry).

    ``arch`` picks one block when the log holds several compilations of the
    entry (several -gencode targets); without it such a log is an error.
    """
    lines = log.splitlines()
    starts = [(i, m) for i, line in enumerate(lines) if (m := _COMPILING.search(line))]
    if not entry:
        names = sorted({m["name"] for _, m in starts})
        if len(names) > 1:
            raise GateError(f"ptxas report compiles several entry functions ({', '.join(names)})",
                            "name the entry to read (the family's KernelFamily.entry)")
        entry = names[0] if names else "(none)"
    blocks = []
    for n, (i, m) in enumerate(starts):
        end = starts[n + 1][0] if n + 1 < len(starts) else len(lines)
        if m["name"] == entry and (arch is None or m["arch"] == arch):
            blocks.append((m["arch"], lines[i + 1:end]))
    if not blocks:
        found = sorted({m["name"] + " for " + m["arch"] for _, m in starts})
        what = f"entries: {', '.join(found)}" if found else "no 'Compiling entry function' line at all"
        raise GateError(
            f"ptxas report has no entry function '{entry}'" + (f" for '{arch}'" if arch else "") + f" ({what})",
            "compile with -Xptxas -v and check the kernel name (the family's KernelFamily.entry)",
        )
    if len(blocks) > 1:
        raise GateError(
            f"ptxas report compiles '{entry}' for {len(blocks)} targets ({', '.join(a for a, _ in blocks)})",
            "pass arch= to pick one",
        )
    block_arch, body = blocks[0]

    frame = None
    for k, line in enumerate(body):
        if line.split("ptxas info    : ")[-1].strip() == _PROPERTIES + entry:
            for follow in body[k + 1:k + 3]:
                if m := _FRAME.search(follow):
                    frame = m
                    break
            break
    used_line = next((line for line in body if _USED.search(line)), None)
    if frame is None or used_line is None:
        missing = "the stack/spill line" if frame is None else "the 'Used N registers' line"
        raise GateError(
            f"ptxas report for '{entry}' ({block_arch}) lacks {missing}: the log is truncated or in an unknown format",
            "rebuild with -Xptxas -v; the build log must hold ptxas' complete output",
        )
    stack_frame, stores, loads = (int(g) for g in frame.groups())
    return PtxasReport(
        entry=entry,
        arch=block_arch,
        registers=int(_USED.search(used_line).group(1)),
        spill_stores=stores,
        spill_loads=loads,
        stack=max(stack_frame, _optional(_CUMULATIVE_STACK, used_line)),
        static_smem=_optional(_SMEM, used_line),
        barriers=_optional(_BARRIERS, used_line),
    )


def _optional(pattern: re.Pattern[str], line: str) -> int:
    m = pattern.search(line)
    return int(m.group(1)) if m else 0


def apply_gate(
    report: PtxasReport | BuildResult,
    thresholds: GateThresholds,
    *,
    threads: int | None = None,
    min_blocks: int | None = None,
    dynamic_smem: int | None = None,
    device_limits: DeviceLimits | None = None,
    family: KernelFamily | str | None = None,
) -> GateResult:
    """Decide whether a compiled config may be measured.

    Pass either a successful :class:`BuildResult` (the report is parsed from its
    ptxas log; threads, min_blocks and dynamic smem come from the artifact's
    meta table) or a :class:`PtxasReport` with ``threads`` and ``min_blocks``
    given. ``device_limits`` defaults to ``thresholds.device``. ``family`` (default:
    the artifact's, else the default family) words the remedies and adds its own
    rules (:meth:`KernelFamily.extra_gate`) after the generic ones.
    Checks, first failure wins: spills, stack, registers, registers per SM,
    shared memory per block, shared memory per SM, then the family's.
    """
    meta: dict[str, int] = {}
    log = ""
    if isinstance(report, BuildResult):
        build = report
        if not build.ok or build.artifact is None:
            raise ValueError("apply_gate: the build failed; gate only successful builds")
        if family is None and build.artifact.family:
            family = build.artifact.family
        symbol = (family if isinstance(family, KernelFamily) else get_family(family or DEFAULT_FAMILY)).meta_symbol
        meta = build.artifact.meta
        for key in ("threads", "smem_bytes", "min_blocks"):
            if key not in meta:
                raise GateError(
                    f"{build.artifact.cubin}: {symbol} has no '{key}' (has {', '.join(sorted(meta))})",
                    "rebuild the config; the kernel must fill every slot of kernels/evotuner_abi.h",
                )
        log = build.ptxas_log
        report = parse_ptxas(build.ptxas_log, build.artifact.entry)
        threads = meta["threads"] if threads is None else threads
        min_blocks = meta["min_blocks"] if min_blocks is None else min_blocks
        dynamic_smem = meta["smem_bytes"] if dynamic_smem is None else dynamic_smem
    if threads is None or min_blocks is None:
        raise ValueError("apply_gate: pass threads= and min_blocks= with a PtxasReport")
    dev = device_limits or thresholds.device
    fam = family if isinstance(family, KernelFamily) else get_family(family or DEFAULT_FAMILY)
    if dynamic_smem is not None:
        report = report.with_dynamic_smem(dynamic_smem)
    facts = {**meta, "threads": threads, "min_blocks": min_blocks}

    def fail(check: str, reason: str) -> GateResult:
        return GateResult(False, reason, report, check)

    def hint(check: str) -> str:
        return fam.gate_hint(check, facts)

    checks = fam.generic_gate_checks

    if report.spill_bytes > thresholds.max_spill_bytes and "spills" in checks:
        return fail("spills", (
            f"spills {report.spill_bytes} bytes (stores {report.spill_stores}, loads {report.spill_loads})"
            f" > max_spill_bytes={thresholds.max_spill_bytes}: {hint('spills')}"))
    if report.stack > thresholds.max_stack_bytes and "stack" in checks:
        return fail("stack", (
            f"stack frame {report.stack} bytes > max_stack_bytes={thresholds.max_stack_bytes}: a local array is"
            f" indexed at run time or a call was not inlined; fix the kernel or raise [gate] max_stack_bytes"))
    if report.registers > thresholds.max_registers and "registers" in checks:
        return fail("registers", (
            f"registers {report.registers} > max_registers={thresholds.max_registers}: {hint('registers')}"))
    allocated = math.ceil(report.registers / dev.reg_alloc_unit) * dev.reg_alloc_unit
    regs_needed = allocated * threads * min_blocks
    if regs_needed > dev.regs_per_sm and "regs_per_sm" in checks:
        return fail("regs_per_sm", (
            f"registers {report.registers} (allocated {allocated}) x threads {threads} x {fam.min_blocks_label}{min_blocks}"
            f" = {regs_needed} > regs_per_sm={dev.regs_per_sm}: {hint('regs_per_sm')}"))
    smem_detail = f"static {report.static_smem} + dynamic {report.dynamic_smem or 0}"
    if report.smem > dev.max_smem_per_block and "smem_per_block" in checks:
        return fail("smem_per_block", (
            f"smem {report.smem} bytes ({smem_detail}) > max_smem_per_block={dev.max_smem_per_block}:"
            f" {hint('smem_per_block')}"))
    smem_sm = (report.smem + dev.smem_reserved_per_block) * min_blocks
    if smem_sm > dev.max_smem_per_sm and "smem_per_sm" in checks:
        return fail("smem_per_sm", (
            f"smem ({report.smem} + {dev.smem_reserved_per_block} reserved) x {fam.min_blocks_label}{min_blocks}"
            f" = {smem_sm} > max_smem_per_sm={dev.max_smem_per_sm}: {hint('smem_per_sm')}"))
    extra = fam.extra_gate(log, report, facts, thresholds)
    if extra is not None:
        return fail(*extra)
    return GateResult(True, None, report)
