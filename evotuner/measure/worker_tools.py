"""The GPU worker's ops beyond measuring (evotuner/measure/worker.py): a kernel run for
compute-sanitizer (``sanitize``) and one call between the profiler's start and stop for
Nsight Compute (``profile``); and what they share with the measure op: the ragged
problem of the second correctness check and unloading a module.

:class:`DiagnosticOps` is a mixin of :class:`evotuner.measure.worker.Worker`: it uses the
worker's ``_torch()``, ``_module(args)`` and ``device_index``.
"""

from __future__ import annotations

import math
from typing import Any

from evotuner.measure.protocol import Reply
from evotuner.problem import Problem, Shape

#: The ragged shape of the second correctness check: neither length a multiple of any tile.
RAGGED_SEQLEN_Q = 97
RAGGED_SEQLEN_K = 203
#: A packed problem's ragged check: Sq < Sk, no queries, Sq > Sk, no keys, whole tiles.
RAGGED_LENGTHS_Q = (97, 0, 203, 1, 64)
RAGGED_LENGTHS_K = (203, 17, 97, 0, 64)


class DiagnosticOps:
    """The ``sanitize`` and ``profile`` ops (a mixin of the worker)."""

    device_index: int
    _torch: Any         # () -> the torch module, CUDA initialised (the worker's)
    _module: Any        # (request args) -> (loaded KernelModule, its Problem) | a failure Reply

    def op_sanitize(self, args: dict[str, Any]) -> Reply:
        """Run the kernel once per ragged shape on fresh inputs (output and LSE poisoned with
        NaN), no timing: what compute-sanitizer watches. Reports whether each output is finite."""
        from evotuner.runtime import cuda
        from evotuner.runtime.check import make_inputs

        torch = self._torch()
        loaded = self._module(args)
        if isinstance(loaded, Reply):
            return loaded
        module, problem = loaded
        seed = int(args.get("seed", 0))
        results = []
        try:
            if problem.varlen:     # a packed kernel: the ragged packed lengths, through its packed launch
                from evotuner.runtime.packed import make_packed_inputs

                ragged = ragged_problem(problem)
                q, k, v, cu_q, cu_k = make_packed_inputs(ragged, device=f"cuda:{self.device_index}", seed=seed)
                o = torch.full_like(q, float("nan"))
                lse = torch.full((q.shape[1], q.shape[0]), float("nan"), dtype=torch.float32, device=q.device)
                module.launch_varlen(q, k, v, o, lse, 1.0 / math.sqrt(problem.shape.head_dim), cu_q, cu_k,
                                     max(ragged.lengths_q), max(ragged.lengths_k))
                torch.cuda.synchronize(self.device_index)
                results.append({"shape": ragged.lengths_text(), "finite": bool(torch.isfinite(o).all().item())})
            for i, dims in enumerate(() if problem.varlen else args.get("shapes") or []):
                B, H, Sq, Sk = (int(x) for x in dims)
                shape = Shape(B, H, Sq, Sk, problem.shape.head_dim)
                q, k, v = make_inputs(shape, problem.dtype, device=f"cuda:{self.device_index}", seed=seed + i)
                o = torch.full_like(q, float("nan"))
                lse = torch.full((B, H, Sq), float("nan"), dtype=torch.float32, device=q.device)
                module.launch(q, k, v, o, lse, 1.0 / math.sqrt(shape.head_dim))
                torch.cuda.synchronize(self.device_index)
                results.append({"shape": str(shape), "finite": bool(torch.isfinite(o).all().item())})
        finally:
            unload_if_healthy(module, cuda)
        return Reply.success({"shapes": results})

    def op_profile(self, args: dict[str, Any]) -> Reply:
        """Warm up, then exactly one call between cudaProfilerStart and cudaProfilerStop (what
        ``ncu --profile-from-start off`` profiles): the config's kernel, or SDPA's default backend."""
        from evotuner.runtime.check import make_inputs

        torch = self._torch()
        kind = str(args.get("kind", "config"))
        problem = Problem.from_dict(args["problem"])
        warmup = max(1, int(args.get("warmup", 3)))
        q, k, v = make_inputs(problem.shape, problem.dtype, device=f"cuda:{self.device_index}", seed=0)
        module = None
        if kind == "sdpa":
            from torch.nn.functional import scaled_dot_product_attention as sdpa

            gqa = {"enable_gqa": True} if problem.shape.kv_group > 1 else {}

            def run() -> Any:
                return sdpa(q, k, v, is_causal=problem.causal, **gqa)
        elif kind == "config":
            loaded = self._module(args)
            if isinstance(loaded, Reply):
                return loaded
            module, _ = loaded
            out = torch.empty_like(q)
            scale = 1.0 / math.sqrt(problem.shape.head_dim)
            packed: tuple[Any, ...] = ()
            if problem.varlen:     # the packed batch of the study's lengths (sdpa: its padded batch)
                from evotuner.runtime.packed import make_packed_inputs

                q, k, v, cu_q, cu_k = make_packed_inputs(problem, device=f"cuda:{self.device_index}", seed=0)
                out = torch.empty_like(q)
                packed = (cu_q, cu_k, max(problem.lengths_q), max(problem.lengths_k))

            def run() -> Any:
                if packed:
                    return module.launch_varlen(q, k, v, out, None, scale, *packed)
                return module.launch(q, k, v, out, None, scale)
        else:
            return Reply.fail("crash", f"profile: unknown kind {kind!r} (config or sdpa)")
        for _ in range(warmup):
            run()
        torch.cuda.synchronize(self.device_index)
        torch.cuda.profiler.start()
        try:
            run()
            torch.cuda.synchronize(self.device_index)
        finally:
            torch.cuda.profiler.stop()
        if module is not None:
            from evotuner.runtime import cuda

            unload_if_healthy(module, cuda)
        return Reply.success({"kind": kind, "shape": str(problem.shape)})


def ragged_problem(problem: Problem) -> Problem:
    """The second correctness check's problem: the study's head grouping, D, dtype and mask at
    lengths that are no tile's multiple (a packed problem: sequences of those lengths, one
    without queries, one without keys, Sq above and below Sk)."""
    group = problem.shape.kv_group
    if problem.varlen:
        return Problem.packed(RAGGED_LENGTHS_Q, RAGGED_LENGTHS_K, heads=2 * group, head_dim=problem.shape.head_dim,
                              heads_kv=2, dtype=problem.dtype, causal=problem.causal)
    return Problem(Shape(1, 2 * group, RAGGED_SEQLEN_Q, RAGGED_SEQLEN_K, problem.shape.head_dim, 2),
                   problem.dtype, problem.causal)


def unload_if_healthy(module: Any, cuda: Any) -> None:
    try:
        cuda.module_unload(module.module)
    except Exception:
        pass  # a broken context: the worker is about to exit anyway
