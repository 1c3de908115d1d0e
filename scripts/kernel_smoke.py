#!/usr/bin/env python3
"""GPU smoke run of the FlashCore kernel through the library (kernel development).

A thin driver: configs are built with evotuner.compiler.Builder (cached, parallel, nvcc
timeout), gated with evotuner.gate on their ptxas report, loaded with
evotuner.runtime.KernelModule, checked with evotuner.runtime.check (fresh random inputs,
NaN-poisoned output, FA2's tolerance rule, LSE) and timed with evotuner.runtime.timing next
to SDPA's backends -- no runtime of its own.

    python scripts/kernel_smoke.py --out DIR [--no-timing] [--no-faults]
    python scripts/kernel_smoke.py --out DIR --focus d128 [--ref-kernels OLD_ROOT] [--rounds N]
    python scripts/kernel_smoke.py --out DIR --build-only [--match TEXT]   # no GPU needed

Correctness: the family's recommended config of every (head dim, dtype, causal) on ragged
shapes (both layouts where Sq != Sk), plus the planted faults (``-DFLASHCORE_FAULT=n``; 1
and 2 -- illegal address, hang -- in a child process with a timeout). Timing (default): every
statically feasible config of the default space at four shapes. ``--focus d128``: the D=128
candidates (and ``-DFLASHCORE_RESCALE_LOG2=0`` variants) at the issue-3 shapes, in N
interleaved rounds with SDPA; ``--ref-kernels ROOT`` also builds them from ROOT (an older
kernels/ folder, ``Builder(kernels_root=ROOT)``) for an A/B in one process.
Writes DIR/smoke.log, DIR/ptxas.json (gate report per build) and DIR/timing.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from evotuner.compiler import Builder
from evotuner.config import KernelConfig
from evotuner.defaults import recommended
from evotuner.gate import apply_gate
from evotuner.problem import Problem, Shape
from evotuner.space import load_space
from evotuner.scriptargs import ArgumentParser, output_folder, positive

FAMILY = "flashcore"
CHECK_SHAPES = [(1, 1, 1, 1), (2, 3, 17, 17), (1, 2, 97, 200), (2, 2, 200, 97), (1, 2, 513, 513),
                (1, 1, 128, 256), (1, 2, 300, 1000), (1, 1, 1000, 300)]          # (B, H, Sq, Sk)
TIME_SHAPES = [(16, 16, 2048, 64, False), (8, 16, 2048, 128, False), (4, 16, 4096, 64, True),
               (4, 32, 4096, 128, True)]                                           # (B, H, S, D, causal)
FOCUS_SHAPES = [(8, 16, 2048, 128, False), (16, 16, 2048, 64, False), (4, 32, 4096, 128, True),
                (4, 16, 4096, 64, True)]
HEAD_DIMS = (32, 64, 96, 128, 256)


@dataclass(frozen=True)
class Job:
    """One build: a config for a problem, extra nvcc flags, an optional other kernels root."""

    role: str                      # check | fault | time
    problem: Problem
    config: KernelConfig
    flags: tuple[str, ...] = ()
    root: str = ""                 # "" = the packaged kernels, "ref" = --ref-kernels

    def label(self) -> str:
        p = self.problem
        cfg = ",".join(f"{k}={v}" for k, v in self.config.items)
        extra = "".join(f" {f}" for f in self.flags) + (" [ref]" if self.root else "")
        return f"D{p.shape.head_dim} {p.dtype}{' causal' if p.causal else ''} {cfg}{extra}"


def _cfg(bm: int, bn: int, warps: int, stages: int, minb: int = 1) -> KernelConfig:
    return KernelConfig.of({"BLOCK_M": bm, "BLOCK_N": bn, "NUM_WARPS": warps, "STAGES": stages, "MIN_BLOCKS": minb})


def _timing_problem(b: int, h: int, s: int, d: int, causal: bool, dtype: str = "fp16") -> Problem:
    return Problem(Shape(b, h, s, s, d), dtype=dtype, causal=causal)


def plan(args: argparse.Namespace) -> list[Job]:
    """Every build the run needs, in order (checks, faults, timing)."""
    jobs: list[Job] = []
    for d in HEAD_DIMS:
        for dtype in ("fp16", "bf16"):
            for causal in (False, True):
                problem = Problem(Shape(1, 1, 128, 128, d), dtype=dtype, causal=causal)
                jobs += [Job("check", problem, c) for c in recommended(problem, FAMILY)]
    if not args.no_faults:
        problem = Problem(Shape(1, 1, 128, 128, 64))
        faults = range(3, 7) if args.focus else range(1, 7)
        jobs += [Job("fault", problem, _cfg(64, 64, 4, 2), (f"-DFLASHCORE_FAULT={n}",)) for n in faults]
    if args.no_timing:
        return _only(jobs, args.match)
    if args.focus:
        for b, h, s, d, causal in FOCUS_SHAPES:
            problem = _timing_problem(b, h, s, d, causal)
            if d == 128:
                base = [(_cfg(128, 64, 4, 2), ()), (_cfg(128, 32, 4, 2), ()), (_cfg(128, 128, 8, 2), ()),
                        (_cfg(128, 128, 8, 3), ())]
                if not causal:
                    resc = ("-DFLASHCORE_RESCALE_LOG2=0",)
                    base += [(_cfg(128, 64, 4, 2), resc), (_cfg(128, 32, 4, 2), resc), (_cfg(128, 64, 4, 1), ())]
                olds = [_cfg(128, 32, 4, 2), _cfg(128, 64, 4, 2)] + ([_cfg(128, 128, 8, 2)] if causal else [])
            else:
                base = [(_cfg(128, 64, 4, 2), ()), (_cfg(128, 64, 4, 2), ("-DFLASHCORE_RESCALE_LOG2=0",)),
                        (_cfg(128, 64, 4, 3), ())]
                olds = [_cfg(128, 64, 4, 2)]
            jobs += [Job("time", problem, c, f) for c, f in base]
            # every current candidate is also checked (fp16 and bf16) on the ragged shapes
            for c, f in base:
                for dtype in ("fp16", "bf16"):
                    jobs.append(Job("check", Problem(Shape(1, 1, 128, 128, d), dtype=dtype, causal=causal), c, f))
            if args.ref_kernels is not None:
                jobs += [Job("time", problem, c, (), "ref") for c in olds]
    else:
        space = load_space(family=FAMILY)
        for b, h, s, d, causal in TIME_SHAPES:
            problem = _timing_problem(b, h, s, d, causal)
            jobs += [Job("time", problem, c) for c in space.configs() if space.violated(c, problem) is None]
    return _only(list(dict.fromkeys(jobs)), args.match)


def _only(jobs: list[Job], match: str | None) -> list[Job]:
    return [j for j in jobs if match is None or match in j.label()]


def build_all(jobs: list[Job], args: argparse.Namespace, say) -> dict[Job, object]:
    """Build every job with the real Builder (one per flag set and root), gate each on its
    ptxas report; returns job -> BuildResult and writes DIR/ptxas.json."""
    space = load_space(family=FAMILY)
    roots = {"": None, "ref": args.ref_kernels}
    builders: dict[tuple[tuple[str, ...], str], Builder] = {}
    futures = {}
    try:
        for job in jobs:
            key = (job.flags, job.root)
            if key not in builders:
                builders[key] = Builder(FAMILY, arch=space.arch, jobs=args.jobs, extra_flags=job.flags,
                                        kernels_root=roots[job.root], cache_dir=args.cache_dir)
            futures[job] = builders[key].submit(job.config, job.problem)
        results = {job: f.result() for job, f in futures.items()}
    finally:
        for b in builders.values():
            b.close()
    report = {}
    for job, r in results.items():
        if not r.ok:
            say(f"BUILD FAIL {job.label()}: {r.error}")
            report[job.label()] = {"ok": False, "error": r.error}
            continue
        gate = apply_gate(r, space.gate)
        report[job.label()] = {"ok": True, "gate": gate.passed, "reason": gate.reason, **gate.report.as_dict()}
    say(f"built {sum(r.ok for r in results.values())}/{len(results)} cubins")
    _write(args.out / "ptxas.json", json.dumps(report, indent=1))
    return results


def run_gpu(jobs: list[Job], builds: dict, args: argparse.Namespace, say) -> int:
    import torch
    from torch.nn.attention import SDPBackend

    from evotuner.runtime import check as rcheck
    from evotuner.runtime.loader import KernelModule
    from evotuner.runtime.timing import time_cuda

    failures = 0
    seed = 0                              # fresh inputs for every check
    for job in (j for j in jobs if j.role == "check"):
        build = builds[job]
        if not build.ok:
            failures += 1
            continue
        module = KernelModule.load(build.artifact)
        worst = 0.0
        for b, h, sq, sk in CHECK_SHAPES:
            for layout in (("bhsd", "bshd") if sq != sk else ("bhsd",)):
                seed += 1
                r = rcheck.check(module.launch, Shape(b, h, sq, sk, job.problem.shape.head_dim),
                                 job.problem.dtype, job.problem.causal, layout=layout, seed=seed)
                if not r.ok:
                    failures += 1
                    say(f"  FAIL {job.label()} {(b, h, sq, sk)} {layout}: {r.reason}")
                worst = max(worst, r.max_error / r.tolerance if r.tolerance else 0.0)
        say(f"check {job.label()} worst err/tol={worst:.3f}")
    say(f"correctness: {failures} failures")
    for job in (j for j in jobs if j.role == "fault" and builds[j].ok):
        code = ("import sys; from evotuner.runtime import check; from evotuner.runtime.loader import KernelModule;"
                "from evotuner.problem import Shape; m = KernelModule.load(sys.argv[1]);"
                "r = check.check(m.launch, Shape(1, 1, 128, 128, 64), 'fp16', False); print(r.ok, r.kind, r.reason)")
        try:
            p = subprocess.run([sys.executable, "-c", code, str(builds[job].artifact.cubin)],
                               capture_output=True, text=True, timeout=60)
            say(f"fault {job.flags[0]}: rc={p.returncode} {(p.stdout + p.stderr).strip()[-300:]!r}")
        except subprocess.TimeoutExpired:
            say(f"fault {job.flags[0]}: timed out after 60 s (killed)")
    timings: dict[str, list[dict]] = {}
    timed = [j for j in jobs if j.role == "time" and builds[j].ok]
    for problem in dict.fromkeys(j.problem for j in timed):
        q, k, v = rcheck.make_inputs(problem.shape, problem.dtype, device="cuda")
        o = torch.empty_like(q)
        scale = rcheck.default_scale(problem.shape.head_dim)
        backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
        fns = {name: (lambda be=be: _sdpa(be, q, k, v, problem.causal)) for name, be in backends.items()}
        for j in (j for j in timed if j.problem == problem):
            module = KernelModule.load(builds[j].artifact)
            fns[j.label()] = lambda m=module: m.launch(q, k, v, o, None, scale)
        rounds: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(max(1, args.rounds)):
            for name, fn in fns.items():
                try:
                    rounds[name].append(time_cuda(fn, warmup=5, reps=30).median_us)
                except Exception as exc:  # noqa: BLE001 -- a backend SDPA lacks here is reported, not fatal
                    say(f"  {name}: {exc}")
        med = {n: statistics.median(v) for n, v in rounds.items() if v}
        ref = med.get("sdpa_flash")
        say(f"timing {problem}:")
        for name, us in sorted(med.items(), key=lambda kv: kv[1]):
            say(f"  {us:9.1f} us  {ref / us if ref else float('nan'):5.2f}x SDPA-FA2  {name}")
        timings[str(problem)] = [{"name": n, "median_us": us} for n, us in med.items()]
    _write(args.out / "timing.json", json.dumps(timings, indent=1))
    return 1 if failures else 0


def _sdpa(backend, q, k, v, causal):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _write(path: Path, text: str) -> None:
    from evotuner.atomicfile import write_text_atomic

    write_text_atomic(path, text, option="--out folder")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=output_folder("a folder for the smoke files"), required=True,
                    help="folder for smoke.log, ptxas.json, timing.json (created; files there are replaced)")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-faults", action="store_true")
    ap.add_argument("--focus", choices=["d128"], default=None)
    ap.add_argument("--ref-kernels", type=Path, default=None, help="an older kernels/ root (A/B in one process)")
    ap.add_argument("--rounds", type=positive, default=3, help="interleaved timing rounds (median of the round medians)")
    ap.add_argument("--jobs", type=positive, default=None, help="parallel nvcc builds (default: CPU count)")
    ap.add_argument("--cache-dir", type=Path, default=None, help="build cache (default: evotuner's)")
    ap.add_argument("--match", default=None, help="only the builds whose label contains this text")
    ap.add_argument("--build-only", action="store_true", help="build and gate only (no GPU)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from evotuner.atomicfile import check_target
    from evotuner.errors import EvotunerError

    args = parse_args(argv)
    jobs = plan(args)
    if not jobs:
        print(f"error: --match {args.match!r} selects none of the planned builds (give text from a build's "
              "label, e.g. 'D64 fp16', or leave --match out)", file=sys.stderr)
        return 1
    if not args.build_only:
        from evotuner.measure import gpu_available

        if not gpu_available():
            print("error: no CUDA GPU on this machine: kernel_smoke.py needs a CUDA GPU "
                  "(run it on the GPU machine, or pass --build-only)", file=sys.stderr)
            return 1
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        log_path = args.out / "smoke.log"
        check_target(log_path, option="--out folder")
        log = open(log_path, "w")
    except EvotunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {args.out}: {exc.strerror or exc} (give an --out folder you can write)", file=sys.stderr)
        return 1
    with log:
        def say(line: str) -> None:
            print(line, flush=True)
            log.write(line + "\n")

        say(f"{len(jobs)} builds planned")
        builds = build_all(jobs, args, say)
        if args.build_only:
            return 0 if all(r.ok for r in builds.values()) else 1
        return run_gpu(jobs, builds, args, say)


if __name__ == "__main__":
    sys.exit(main())
