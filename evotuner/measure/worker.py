"""The GPU worker process: ``python -m evotuner.measure.worker``.

The one process of a study that touches CUDA. It reads framed requests
(:mod:`evotuner.measure.protocol`) on stdin and writes one reply per request on
stdout; anything else written to stdout (a stray print, a library banner) is
redirected to stderr at start so it can never corrupt the protocol.

A measure request runs, in order:

1. load the cubin through the driver (``runtime.loader.KernelModule``),
   which refuses a kernel that needs more shared memory than the device has
   (``smem``);
2. the correctness gate (``runtime.check``'s FA2 rule) on fresh random inputs,
   output poisoned, at the study's shape and at a small ragged shape
   (Sq=97, Sk=203: partial tiles on both axes) — ``wrong_result`` / ``nan``; a packed
   problem (``Problem.varlen`` with lengths) runs through ``KernelModule.launch_varlen`` on
   packed inputs of its lengths, each sequence judged on its own
   (``runtime.packed.check_packed``), then at ragged packed lengths (:func:`ragged_problem`);
3. timing (``runtime.timing.time_cuda``: warm-up, CUDA events, L2 flushed,
   median/p20/p80; a packed problem's launch as ``flash_attention_varlen`` makes it)
   within the trial's budget; with a ``race`` in the request
   (evotuner/measure/racing.py) it stops at a look once the config is clearly slower
   than the incumbent the request carries, and says so in the measurement. A paired race
   also carries the incumbent's artifact: the worker keeps it loaded while it stays the
   incumbent and times it alternately with the config (``detail["paired"]`` says how it
   went, or why the race ran unpaired: an artifact that cannot load here). A config the
   paired race stops gets figures on the incumbent's scale (``racing.paired_figures``; its
   own median goes in ``detail["paired"]["raw_median_us"]``).

A sticky CUDA error (illegal address, launch failure...) loses the context:
the worker sends a ``fatal`` failure and exits at once (``os._exit``, no
teardown on a broken context); the parent starts a new one. A hang is the
parent's business: it kills this process group after its timeout.
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, BinaryIO, Callable

from evotuner.abi import DTYPE_CODES
from evotuner.compiler.result import Artifact
from evotuner.measure.protocol import (
    PipeClosed, ProtocolError, Reply, Request, read_message_blocking, write_message,
)
from evotuner.measure.racing import pair_ratios, paired_figures, quantile
from evotuner.measure.worker_tools import DiagnosticOps, ragged_problem, unload_if_healthy
from evotuner.problem import Problem

#: Exit status after a fatal (sticky) CUDA error.
EXIT_FATAL = 3

#: Driver error names that are sticky, for errors that arrive through torch (text only).
_STICKY_TEXT = ("illegal memory access", "unspecified launch failure", "illegal instruction",
                "misaligned address", "hardware stack error", "invalid program counter")


class Worker(DiagnosticOps):
    """Answers requests; holds the device index, the study problems' tolerances and the
    paired race's incumbent module between them."""

    def __init__(self) -> None:
        self.device_index = 0
        self.torch: Any = None
        #: FA2's (output, LSE) tolerances per study problem, from this worker's first check of it
        self._bounds: dict[Problem, tuple[float, float | None]] = {}
        #: (artifact key, loaded module) of the paired race's incumbent, kept while it stays one
        self._incumbent: tuple[str, Any] | None = None

    # ---------------------------------------------------------------- dispatch
    def handle(self, request: Request) -> Reply:
        handler: Callable[[dict[str, Any]], Reply] | None = getattr(self, f"op_{request.op}", None)
        if handler is None:
            return Reply.fail("crash", f"worker has no handler for op {request.op!r}")
        try:
            return handler(request.args)
        except Exception as exc:  # the one boundary: an unexpected error becomes a failure value
            return self._failure_from_exception(exc, during=request.op)

    def op_ping(self, args: dict[str, Any]) -> Reply:
        return Reply.success({"pid": os.getpid()})

    def op_shutdown(self, args: dict[str, Any]) -> Reply:
        return Reply.success({"pid": os.getpid()})

    def op_init(self, args: dict[str, Any]) -> Reply:
        import torch

        self.device_index = int(args.get("device_index", 0))
        if not torch.cuda.is_available():
            return Reply.fail("crash", "torch.cuda.is_available() is False in the GPU worker "
                                       f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
        count = torch.cuda.device_count()
        if self.device_index >= count:
            return Reply.fail("crash", f"device index {self.device_index} out of range: {count} GPU(s) visible")
        torch.cuda.set_device(self.device_index)
        torch.cuda.init()
        torch.empty(1, device="cuda").zero_()  # create the primary context now, not inside a trial
        torch.cuda.synchronize()
        self.torch = torch
        # the measure path's modules now, while the parent is still starting builds, not in trial 1
        import evotuner.runtime.check  # noqa: F401
        import evotuner.runtime.loader  # noqa: F401
        import evotuner.runtime.timing  # noqa: F401
        return Reply.success({"pid": os.getpid(), "device": torch.cuda.get_device_name(self.device_index)})

    def op_fingerprint(self, args: dict[str, Any]) -> Reply:
        from evotuner.measure.fingerprint import collect

        return Reply.success(collect(self.device_index))

    # ----------------------------------------------------------------- measure
    def op_measure(self, args: dict[str, Any]) -> Reply:
        from evotuner.runtime import cuda

        from evotuner.measure.racing import Race

        seed = int(args.get("seed", 0))
        budget_s = float(args.get("budget_s", 0.5))
        try:
            race = Race.from_wire(args.get("race"))
        except (KeyError, TypeError, ValueError) as exc:
            return Reply.fail("crash", f"measure request has a bad race {args.get('race')!r:.200}: {exc}")

        # Wall seconds per phase (load, correctness, timing), returned in ``detail["phases"]``
        # for scripts/bench_tuner.py's time shares; perf_counter only, no extra sync.
        asked = Problem.from_dict(args["problem"])
        if asked.varlen and not asked.lengths_q:
            return Reply.fail("launch", f"problem {asked}: a packed problem without sequence lengths cannot be "
                                        "measured; make it with Problem.packed(lengths, ...) or --lengths")
        t0 = time.perf_counter()
        loaded = self._module(args)
        if isinstance(loaded, Reply):
            return loaded
        module, problem = loaded
        t1 = time.perf_counter()
        try:
            study = self._check(module, problem, seed, reuse_bounds=True)
            if isinstance(study, Reply):
                return study
            ragged_at = ragged_problem(problem)     # keeps the study's head grouping
            ragged_text = ragged_at.lengths_text() if ragged_at.varlen else str(ragged_at.shape)
            ragged = self._check(module, ragged_at, seed + 1_000_003)
            if isinstance(ragged, Reply):
                return _annotate(ragged, f"at the ragged {'lengths' if ragged_at.varlen else 'shape'} {ragged_text}")
            t2 = time.perf_counter()
            pair, paired = self._pair(race, args["problem"])
            timing = self._time(module, problem, seed, budget_s, race, pair)
            t3 = time.perf_counter()
        finally:
            unload_if_healthy(module, cuda)
        phases = {"load_s": t1 - t0, "check_s": t2 - t1, "time_s": t3 - t2}
        median, p20, p80 = recorded_figures(timing, race)
        if median != timing.median_us:
            paired["raw_median_us"] = timing.median_us
        measurement: dict[str, Any] = {
            "median_us": median, "p20_us": p20, "p80_us": p80, "tflops": problem.tflops(median),
            "max_error": study["max_error"], "tolerance": study["tolerance"], "repetitions": timing.repetitions,
        }
        figures = _paired_figures(timing) if paired else {}
        if race is not None:
            measurement.update(stopped_early=bool(timing.stopped_early),
                               planned_repetitions=int(timing.planned_repetitions),
                               incumbent_us=race.incumbent_us)
            if figures.get("pairs") and figures.get("ratio_median") is not None:
                measurement.update(pairs=int(figures["pairs"]), pair_ratio=float(figures["ratio_median"]))
        return Reply.success({
            "measurement": measurement,
            "detail": {"ragged_max_error": ragged["max_error"], "ragged_tolerance": ragged["tolerance"],
                       "ragged_shape": ragged_text, "seed": seed, "phases": phases,
                       **({"paired": {**paired, **figures}} if paired else {})},
        })

    def _check(self, module: Any, problem: Problem, seed: int, *, reuse_bounds: bool = False
               ) -> dict[str, float] | Reply:
        """One run on fresh random inputs, output and LSE poisoned, judged by runtime.check (FA2's
        rule). ``reuse_bounds``: judge by the tolerances this worker's first check of ``problem``
        computed (check.check's ``bounds``: the inputs and the fp32 reference stay fresh)."""
        from evotuner.runtime import check, packed

        device = f"cuda:{self.device_index}"
        if problem.varlen:     # a packed batch through the runtime's packed launch, each sequence judged
            result = packed.check_packed(module.launch_varlen, problem, seed=seed, device=device)
        else:
            bounds = self._bounds.get(problem) if reuse_bounds else None
            result = check.check(module.launch, problem, seed=seed, device=device, bounds=bounds)
            if reuse_bounds and bounds is None and math.isfinite(result.tolerance):
                self._bounds[problem] = (result.tolerance, result.lse_tolerance)
        if not result.ok:
            return Reply.fail(result.kind or "wrong_result", result.reason)
        return {"max_error": float(result.max_error), "tolerance": float(result.tolerance)}

    def _time(self, module: Any, problem: Problem, seed: int, budget_s: float, race: Any = None,
              pair: Any = None) -> Any:
        """The config's Timing within ``budget_s``; raced (looks, stop) when ``race`` is given,
        timed alternately with the module ``pair`` (the incumbent's) in a paired race."""
        from evotuner.runtime.check import make_inputs
        from evotuner.runtime.timing import time_cuda

        torch = self._torch()
        device = f"cuda:{self.device_index}"
        scale = 1.0 / math.sqrt(problem.shape.head_dim)
        racing: dict[str, Any] = {} if race is None else {"looks": race.rule.looks(), "stop": race.stops}
        if problem.varlen:     # the packed batch of the problem's lengths, launched as flash_attention_varlen does
            from evotuner.runtime.packed import make_packed_inputs

            pq, pk, pv, cu_q, cu_k = make_packed_inputs(problem, device=device, seed=seed + 7)
            longest = (max(problem.lengths_q), max(problem.lengths_k))

            def call(m: Any) -> Callable[[], Any]:
                pout = torch.empty_like(pq)      # each module its own output
                return lambda: m.launch_varlen(pq, pk, pv, pout, None, scale, cu_q, cu_k, *longest)
        else:
            q, k, v = make_inputs(problem.shape, problem.dtype, device=device, seed=seed + 7)

            def call(m: Any) -> Callable[[], Any]:
                out = torch.empty_like(q)
                return lambda: m.launch(q, k, v, out, None, scale)
        if pair is not None:
            racing.update(pair=call(pair), pair_reps=race.rule.paired_reps)
        return time_cuda(call(module), budget_s=budget_s, **racing)

    def _pair(self, race: Any, problem: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """(the incumbent's module to time alternately with the config, what to report of
        it): (None, {}) for an unpaired race; (None, {"unpaired": why}) when the incumbent's
        artifact does not load here (the race then runs unpaired). The module stays loaded
        while the requests name the same artifact."""
        if race is None or not race.paired:
            return None, {}
        wire = dict(race.incumbent_artifact)
        key = str(wire.get("sha256") or wire.get("key") or wire["cubin"])
        if self._incumbent is not None and self._incumbent[0] == key:
            return self._incumbent[1], {"incumbent": key}
        self._drop_incumbent()
        try:
            loaded = self._module({**wire, "problem": problem})
        except Exception as exc:   # a missing or foreign cubin: race unpaired; a broken context is fatal
            if _is_sticky(exc):
                raise
            return None, {"unpaired": f"the incumbent's artifact did not load: {str(exc).strip()[:200]}"}
        if isinstance(loaded, Reply):
            return None, {"unpaired": loaded.failure.reason if loaded.failure else "the incumbent's artifact did not load"}
        self._incumbent = (key, loaded[0])
        return loaded[0], {"incumbent": key}

    def _drop_incumbent(self) -> None:
        """Unload the paired race's incumbent module, if one is loaded."""
        if self._incumbent is not None:
            from evotuner.runtime import cuda

            unload_if_healthy(self._incumbent[1], cuda)
            self._incumbent = None

    # ------------------------------------------------------ sanitize / profile
    def _module(self, args: dict[str, Any]) -> tuple[Any, Problem] | Reply:
        """Load the request's cubin (built for the request's problem) through its family."""
        from evotuner.runtime.loader import KernelModule

        problem = Problem.from_dict(args["problem"])
        meta = {str(k): int(v) for k, v in dict(args.get("meta") or {}).items()}
        cubin = Path(args["cubin"])
        artifact = Artifact(cubin=cubin, key=str(args.get("key") or cubin.name), sha256=str(args.get("sha256", "")),
                            meta=meta, entry=str(args.get("entry") or ""), family=str(args.get("family") or ""))
        mismatch = _static_mismatch(meta, problem)
        if mismatch:
            return Reply.fail("launch", f"{cubin.name}: built for {mismatch}; cannot run this study's problem")
        self._torch()
        return KernelModule.load(artifact, device=self.device_index, cache=False), problem

    # --------------------------------------------------------------- baselines
    def op_baselines(self, args: dict[str, Any]) -> Reply:
        from evotuner.runtime.timing import time_cuda

        torch = self._torch()
        problem = Problem.from_dict(args["problem"])
        budget_s = float(args.get("budget_s", 0.5))
        device = f"cuda:{self.device_index}"
        if problem.varlen:     # a packed batch: SDPA on the padded batch and on jagged nested tensors
            from evotuner.runtime.packed import packed_baselines

            calls = packed_baselines(problem, device=device, seed=0)
        else:
            calls = _dense_baselines(problem, device)
        result: dict[str, dict[str, Any]] = {}
        for name, run in calls.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    run()
                    torch.cuda.synchronize()
                except RuntimeError as exc:
                    if _is_sticky(exc):
                        raise
                    # SDPA says only "No available kernel"; its warnings say why each backend refused.
                    why = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()]
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    result[name] = {"us": None, "reason": f"{name} cannot run {problem}: {first[:200]}"
                                                          + (f" ({'; '.join(why)[:400]})" if why else "")}
                    continue
            stats = time_cuda(run, budget_s=budget_s)
            result[name] = {"us": float(stats.median_us), "p20_us": float(stats.p20_us),
                            "p80_us": float(stats.p80_us), "reason": None}
        return Reply.success(result)

    # ----------------------------------------------------------------- helpers
    def _torch(self) -> Any:
        if self.torch is None:
            reply = self.op_init({"device_index": self.device_index})
            if not reply.ok:
                raise RuntimeError(reply.failure.reason if reply.failure else "CUDA init failed")
        return self.torch

    def _failure_from_exception(self, exc: BaseException, *, during: str) -> Reply:
        kind = getattr(exc, "failure_kind", None)
        sticky = bool(getattr(exc, "sticky", False)) or _is_sticky(exc)
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if sticky:
            return Reply.fail("illegal_access", f"{text} (sticky CUDA error during {during}; worker restarted)",
                              fatal=True)
        if kind in ("launch", "smem"):
            return Reply.fail(kind, text)
        if type(exc).__name__ == "MetaError":
            return Reply.fail("launch", text)
        if type(exc).__name__ == "OutOfMemoryError":
            return Reply.fail("launch", f"out of GPU memory during {during}: {text[:300]}")
        # Anything else is a defect or an unexpected environment problem: report with the traceback's tail.
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        sys.stderr.write("".join(tb))
        where = tb[-2].strip().replace("\n", " ") if len(tb) >= 2 else ""
        return Reply.fail("crash", f"{type(exc).__name__} during {during}: {text[:300]} [{where[:300]}]")


def _dense_baselines(problem: Problem, device: str) -> dict[str, Callable[[], Any]]:
    """{name: a call of SDPA's backend} at the dense problem's shape (inputs made once)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from evotuner.runtime.check import make_inputs

    q, k, v = make_inputs(problem.shape, problem.dtype, device=device, seed=0)
    backends = {"sdpa_default": None, "sdpa_flash": SDPBackend.FLASH_ATTENTION,
                "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}
    # GQA/MQA: SDPA's own grouped heads (enable_gqa) where k/v have fewer heads than q
    gqa = {"enable_gqa": True} if problem.shape.kv_group > 1 else {}

    def call(backend: Any) -> Callable[[], Any]:
        def run() -> Any:
            if backend is None:
                return sdpa(q, k, v, is_causal=problem.causal, **gqa)
            with sdpa_kernel(backend):
                return sdpa(q, k, v, is_causal=problem.causal, **gqa)
        return run

    return {name: call(backend) for name, backend in backends.items()}


def _static_mismatch(meta: dict[str, int], problem: Problem) -> str | None:
    """What the cubin was compiled for, where it differs from the problem (None when it matches)."""
    wanted = {"head_dim": problem.shape.head_dim, "is_causal": int(problem.causal),
              "dtype": DTYPE_CODES[problem.dtype], "varlen": int(problem.varlen)}
    diffs = [f"{k}={meta[k]} (problem: {v})" for k, v in wanted.items() if k in meta and int(meta[k]) != v]
    return ", ".join(diffs) or None


def _is_sticky(exc: BaseException) -> bool:
    if bool(getattr(exc, "sticky", False)):
        return True
    text = str(exc).lower()
    return any(t in text for t in _STICKY_TEXT)


def _annotate(reply: Reply, where: str) -> Reply:
    assert reply.failure is not None
    return Reply.fail(reply.failure.kind, f"{reply.failure.reason} {where}", fatal=reply.fatal)


def recorded_figures(timing: Any, race: Any) -> tuple[float, float, float]:
    """The (median, p20, p80) µs a measurement records: the timing's own; for a config the
    paired rule stopped, its pair ratios on the incumbent's recorded scale
    (``racing.paired_figures``: a short window's level would let it shadow the incumbent).
    A config the unpaired rule stopped keeps its own figures, which its stop puts above
    the incumbent: scaling its pair ratios instead once recorded 14.0 µs for a config whose
    own repetitions read 21.6 µs (a pair that read slow), and it became the study's best."""
    if (timing.stopped_early and timing.pair_samples_us and race is not None and race.paired
            and race.rule.stops_paired(timing.samples_us, timing.pair_samples_us)):
        scaled = paired_figures(timing.samples_us, timing.pair_samples_us, race.incumbent_artifact_us)
        if scaled is not None:
            return scaled
    return timing.median_us, timing.p20_us, timing.p80_us


def _paired_figures(timing: Any) -> dict[str, Any]:
    """How a paired race's alternate timing went: pairs timed, the incumbent's median over
    them and the median config/incumbent ratio of adjacent repetitions."""
    theirs = list(timing.pair_samples_us)
    if not theirs:
        return {"pairs": 0}
    ratios = sorted(pair_ratios(timing.samples_us, theirs))
    return {"pairs": len(theirs), "incumbent_median_us": quantile(sorted(theirs), 0.5),
            "ratio_median": quantile(ratios, 0.5) if ratios else None}


# ---------------------------------------------------------------------- main
def serve(inp: BinaryIO, out: BinaryIO, worker: Worker | None = None) -> int:
    """Answer requests until EOF or ``shutdown``; returns the exit status."""
    worker = worker or Worker()
    while True:
        try:
            message = read_message_blocking(inp)
        except PipeClosed:
            return 0  # the parent went away
        except ProtocolError as exc:
            write_message(out, Reply.fail("crash", f"worker received a bad frame: {exc}").to_wire())
            return 2
        try:
            request = Request.from_wire(message)
        except ProtocolError as exc:
            write_message(out, Reply.fail("crash", f"worker received a bad request: {exc}").to_wire())
            continue
        reply = worker.handle(request)
        write_message(out, reply.to_wire())
        if reply.fatal:
            return EXIT_FATAL
        if request.op == "shutdown":
            return 0


def main() -> None:
    # fd 1 is the reply pipe: keep a private copy, then point fd 1 (and sys.stdout) at stderr.
    reply_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # torch now, before the first request: a worker the entry point spawned early
    # (evotuner.prestart) imports it while the parent is still importing its own modules.
    # A torch that cannot be imported is left to ``init``, which says why in its reply.
    try:
        import torch  # noqa: F401
    except BaseException:  # noqa: BLE001 -- reported by op_init
        pass
    out = os.fdopen(reply_fd, "wb", buffering=0)
    inp = os.fdopen(os.dup(0), "rb", buffering=0)
    status = serve(inp, out)
    out.flush()
    sys.stderr.flush()
    # After a sticky error the context is broken: skip interpreter/CUDA teardown entirely.
    os._exit(status)


if __name__ == "__main__":
    main()
