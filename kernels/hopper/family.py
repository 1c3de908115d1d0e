"""The Hopper family's Python side: the :class:`~evotuner.family.KernelFamily` the generic
stages use for kernels/hopper/ (registered through the ``evotuner.families`` entry point
in pyproject.toml). Host contract: kernels/hopper/params.h and README.md."""

from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

try:
    import tomllib  # Python 3.11+
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from evotuner.config import KernelConfig
from evotuner.defaults import parse_defaults, pick_config
from evotuner.errors import EvotunerError
from evotuner.family.base import packaged
from evotuner.family import BUILD_RESERVED, AttentionArgs, DeviceInfo, KernelFamily, LaunchSpec, TensorView
from evotuner.kernels.hopper import launch
from evotuner.kernels.hopper.cost import estimate_us, packed_problem, packs_heads
from evotuner.kernels.hopper.params import (META_FIELDS, Params, TmaStrideError, check_tma_view, decode_hopper_meta,
                                            encode_tensor_map)
from evotuner.problem import Problem

#: ptxas notes that wgmma instructions were serialized (C7510-C7519): a slow kernel.
WGMMA_SERIALIZED = re.compile(r"^.*\(C751\d\).*$", re.M)
#: Head dims tuned in search_spaces/hopper_wide.toml (the rest in hopper.toml).
WIDE_HEAD_DIMS = (192, 256)
#: Head dims tuned in search_spaces/hopper_d96.toml: D=96, tiles padded to 128 columns
#: (kernels/hopper/traits.cuh kDimPad; launch.py NARROW_HEAD_DIM).
NARROW_HEAD_DIMS = (launch.NARROW_HEAD_DIM,)
#: Bytes of the SCHED=2 and 3 tile counter (one int32, zero at launch).
TILE_COUNTER_BYTES = 4
#: Problems of at most this many query rows (B*H*Sq: one wave of 64-row tiles on the
#: H100's 132 SMs) are searched in search_spaces/hopper_split.toml (split-KV).
SPLIT_SPACE_ROWS = 8448
#: SPLITS values of hopper_split.toml, and the SMs the recommended split count fills.
SPLIT_CHOICES = (1, 2, 4, 8, 16, 32)
SPLIT_SMS = 132
#: Longest chain of (row, split) steps one warp of the combining CTA may walk (split.cuh).
COMBINE_CHAIN = 64
#: The recommended config splits the keys only where they are at least this many times the
#: (packed) query rows: decoding and long-context chunks. Where Sq ~ Sk the combine costs
#: more than the idle SMs (H100, 2026-11-26, bench_attention: 1,8,512,64 with 2 splits 0.64x
#: SDPA, one split 1.2x; 1,8,1024,128 with 2 splits 0.78x, 64-row tiles unsplit 1.23x).
SPLIT_MIN_KEYS_PER_ROW = 4


def launch_registers(threads: int, regs_per_sm: int = 65536, unit: int = 8, cap: int = 255,
                     ctas_per_sm: int = 1) -> int:
    """Registers per thread __launch_bounds__(threads, ctas_per_sm) leaves (traits.cuh kLaunchRegs)."""
    return min(cap, regs_per_sm // (threads * ctas_per_sm) // unit * unit)


class Hopper(KernelFamily):
    name = "hopper"
    title = "Hopper (wgmma/TMA)"
    # Bayesian optimisation on cost.py's estimates: cold, within 2% of a recorded sweep's
    # optimum in 1-6 evaluations where TPE screening its candidates (tpe-masked, the earlier
    # default) needed 14.5-139 and random search 21-136 (docs/samplers.md).
    default_sampler = "guided"
    macro_prefix = "HOPPER"
    varlen = True   # packed variable-length batches (flash_attention_varlen): HOPPER_VARLEN 1
    entry = "hopper_fwd"
    meta_symbol = "hopper_meta"
    meta_fields = META_FIELDS
    echoed = {"BLOCK_N": "block_n", "CONSUMER_WGS": "consumer_wgs", "STAGES": "stages", "REG_PROD": "reg_prod",
              "REG_CONS": "reg_cons", "OVERLAP": "overlap", "PINGPONG": "pingpong", "SCHED": "sched",
              "RESCALE_LOG2": "rescale_log2", "EXP_EMU": "exp_emu", "CTAS_PER_SM": "ctas_per_sm",
              "CLUSTER": "cluster"}
    head_dims = (64, 96, 128, 192, 256)
    dtypes = ("fp16", "bf16")
    min_blocks_label = "blocks per SM (__launch_bounds__) "
    # split-KV, GQA query-head packing, two CTAs per SM, CTA pairs sharing K/V loads,
    # cross-tile pipelining, Q in registers; the kernel's defaults: off (a config recorded before a knob
    # existed reads as the default)
    optional_params = {"SPLITS": 1, "PACK_GQA": 0, "CTAS_PER_SM": 1, "CLUSTER": 1, "TILE_OVERLAP": 0, "Q_IN_REGS": 0}
    export_namespace = "hopper::tuned"
    export_macro_prefix = "HOPPER_TUNED"

    def default_space(self) -> Path:
        return packaged("evotuner.search_spaces", "hopper.toml")

    def space_for(self, problem: Problem) -> Path:
        """hopper.toml for D=64 and 128, hopper_wide.toml for D=192 and 256 (its tiles stop
        at BLOCK_N=128; hopper.toml's recorded sweeps pin that file's constraints),
        hopper_d96.toml for D=96 (smem padded to D=128's), and hopper_split.toml (split-KV)
        for dense D=64/128 problems of under one wave of tiles."""
        if problem.shape.head_dim in WIDE_HEAD_DIMS:
            return packaged("evotuner.search_spaces", "hopper_wide.toml")
        if problem.shape.head_dim in NARROW_HEAD_DIMS:
            return packaged("evotuner.search_spaces", "hopper_d96.toml")
        if uses_split_space(problem):
            return packaged("evotuner.search_spaces", "hopper_split.toml")
        return self.default_space()

    def defaults_file(self) -> Path:
        return packaged("evotuner.kernels", "hopper", "defaults.toml")

    def reserved(self) -> frozenset[str]:
        # instantiate.cuh owns HOPPER_BLOCK_M (= 64*CONSUMER_WGS); ptx.cuh the wait timeout.
        return BUILD_RESERVED | {"BLOCK_M", "WAIT_TIMEOUT_CYCLES"}

    def decode_meta(self, raw: bytes, *, source: str = "meta table") -> dict[str, int]:
        return decode_hopper_meta(raw, source=source)

    # -- problems and configs ------------------------------------------------------------

    def recommended_configs(self, problem: Problem) -> tuple[KernelConfig, ...]:
        if self.unsupported(problem):
            return ()
        try:
            config = pick_config(_entries(), problem.shape.head_dim, problem.dtype, problem.causal, self.title,
                                 query_rows=problem.query_rows)
        except EvotunerError:
            return ()
        if uses_split_space(problem):   # a config of hopper_split.toml: SCHED 0, packing, a split count
            # eager rescale: the decode bench's grid (scripts/bench_decode.py) timed it
            values = {**config.as_dict(), "SCHED": 0, "EXP_EMU": 0, "RESCALE_LOG2": 0}
            values["PACK_GQA"] = int(packs_heads(problem))
            values["SPLITS"] = recommended_splits(packed_problem(problem) if values["PACK_GQA"] else problem,
                                                  64 * values["CONSUMER_WGS"], values["BLOCK_N"])
            config = KernelConfig.of(values)
        elif packs_heads(problem):
            # Grouped heads, non-causal: one K/V head's query heads as one head of G*Sq rows, so
            # only one query tile per K/V head is ragged (H100, 2026-11-27, bench_attention
            # --rounds 3-5: 8,32/4,1024,128 +3%, 4,64/8,2048,128 +2%, 1,32/8,4096,128 flat;
            # docs/measurements/tile_overlap/README.md)
            config = KernelConfig.of({**config.as_dict(), "PACK_GQA": 1})
        return (config,)

    def expected_speed(self, problem: Problem) -> float:
        """The measured TFLOP/s noted next to the recommended config (defaults.toml); a dtype
        not measured yet (D=96's bf16) gives the entry's ``tflops_estimate`` (the cost model's
        figure), so flash_attention still ranks the family above one that notes no figure."""
        if self.unsupported(problem):
            return 0.0
        table: Any = _raw().get(f"d{problem.shape.head_dim}", {})
        speed = table.get(f"tflops_{problem.dtype}", table.get("tflops_estimate", 0.0))
        if problem.causal and isinstance(table.get("causal"), dict):
            speed = table["causal"].get(f"tflops_{problem.dtype}", speed)
        return float(speed)

    def estimate_us(self, config: KernelConfig, problem: Problem) -> float | None:
        """kernels/hopper/cost.py's first-principles model (H100 SXM figures)."""
        if self.unsupported(problem):
            return None
        return estimate_us(config.as_dict(), problem)

    # -- gate ------------------------------------------------------------------------------

    def gate_hint(self, check: str, meta: Mapping[str, int]) -> str:
        return {
            "spills": "lower BLOCK_N, use OVERLAP=0, or give the consumers more registers (REG_CONS, fewer CONSUMER_WGS)",
            "stack": "lower BLOCK_N or OVERLAP",
            "registers": "lower REG_CONS",
            "regs_per_sm": "lower REG_CONS or CONSUMER_WGS",
            "smem_per_block": "reduce STAGES or BLOCK_N, or use SCHED=0",
            "smem_per_sm": "reduce STAGES or BLOCK_N, or use SCHED=0",
        }.get(check, "choose a smaller config")

    def extra_gate(self, log: str, report: Any, meta: Mapping[str, int],
                   thresholds: Any) -> tuple[str, str] | None:
        dev = thresholds.device
        threads, ctas = int(meta["threads"]), int(meta.get("ctas_per_sm", 1))
        cap = launch_registers(threads, dev.regs_per_sm, dev.reg_alloc_unit, dev.max_regs_per_thread, ctas)
        prod, cons, wgs = int(meta["reg_prod"]), int(meta["reg_cons"]), int(meta["consumer_wgs"])
        pool = 128 * (prod + wgs * cons)
        if pool > threads * cap:
            return ("register_pool", f"register pool 128*(REG_PROD={prod} + CONSUMER_WGS={wgs} x REG_CONS={cons}) = "
                                     f"{pool} > {threads} threads x {cap} launch registers = {threads * cap}: "
                                     "setmaxnreg.inc would block forever; lower REG_CONS or REG_PROD")
        serialized = WGMMA_SERIALIZED.search(log or "")
        if serialized:
            note = " ".join(serialized.group(0).split())
            return ("wgmma_serialized", f"ptxas serialized the wgmma instructions ({note[:200]}): "
                                        "lower BLOCK_N or use OVERLAP=0 (fewer live accumulator registers)")
        if report.registers != cap:
            return ("launch_registers", f"ptxas reports {report.registers} registers, expected the launch cap {cap} "
                                        f"of __launch_bounds__({threads}, {ctas}) that setmaxnreg redistributes: "
                                        "the kernel was not built as the family expects; rebuild (clear the cache)")
        return None

    # -- runtime ---------------------------------------------------------------------------

    def unsupported_views(self, views: Mapping[str, TensorView]) -> str | None:
        for name, view in views.items():
            try:
                check_tma_view(name, view.ptr, view.shape, view.strides)
            except TmaStrideError as exc:
                return exc.message
        return None

    def workspace_bytes(self, meta: Mapping[str, int]) -> int:
        return TILE_COUNTER_BYTES if int(meta["sched"]) >= 2 else 0

    def scratch_bytes(self, meta: Mapping[str, int], batch: int, heads: int, seqlen_q: int, seqlen_k: int) -> int:
        """Split-KV (SPLITS > 1) and SCHED 3 (the last wave split): the counters and the fp32
        partials (params.h). SCHED 3's is sized for the unpacked tiles, at least the packed ones'."""
        splits = int(meta.get("splits", 1))
        block_m, head_dim = int(meta["block_m"]), int(meta["head_dim"])
        if int(meta["sched"]) == 3:
            tiles = -(-seqlen_q // block_m) * heads * batch
            return launch.tail_scratch(tiles, int(meta.get("ctas_per_sm", 1)), block_m, head_dim)["bytes"]
        if splits <= 1:
            return 0
        return split_scratch_bytes(splits, batch, heads, seqlen_q, block_m, head_dim)

    def launch(self, meta: Mapping[str, int], args: AttentionArgs, device: DeviceInfo) -> LaunchSpec:
        q, k, v, o, lse = args.q, args.k, args.v, args.o, args.lse
        B, H, Sq, D = q.shape
        Sk = k.shape[2]
        packed = args.varlen
        if bool(meta.get("varlen", 0)) != (packed is not None):
            raise EvotunerError(f"hopper: a {'packed' if meta.get('varlen') else 'dense'} kernel launched for a "
                                f"{'packed' if packed is not None else 'dense'} batch",
                                "build the kernel for the problem (Problem.varlen) it runs")
        group = _kv_group(q, k)
        if packed is None and meta.get("pack_gqa") and group > 1 and not meta["is_causal"]:
            # GQA query-head packing: one K/V head's `group` query heads as one head of
            # group*Sq rows (each K/V block then serves them all in one tile); same kernel.
            pq, po = _pack_heads(q, group), _pack_heads(o, group)
            if pq is not None and po is not None:
                q, o, group = pq, po, 1
                B, H, Sq, D = q.shape
        p = Params()
        splits = int(meta.get("splits", 1))
        # split-KV writes O through o_ptr, never through the map
        maps = (launch.MAP_Q, launch.MAP_K, launch.MAP_V) if splits > 1 else range(len(launch.MAP_NAMES))
        for which in maps:
            view = (q, k, v, o)[which]
            box = launch.map_box(which, meta["block_m"], meta["block_n"], meta["o_box_rows"], D,
                                 meta.get("cluster", 1))
            name = launch.MAP_NAMES[which]
            data = encode_tensor_map(view.ptr, view.shape, view.strides, args.dtype, box["rows"], box["panels"],
                                     name=name)
            getattr(p, f"tm_{name}").opaque[:] = memoryview(data).cast("Q").tolist()
        p.lse = lse.ptr if lse is not None else None
        if packed is not None:   # the maps hold the packed rows; the grid spans the longest sequence
            p.cu_seqlens_q, p.cu_seqlens_k = packed.cu_seqlens_q, packed.cu_seqlens_k
            p.o_ptr, p.o_row_stride, p.o_head_stride = o.ptr, o.strides[2], o.strides[1]
            p.total_q = Sq
            B, Sq, Sk = packed.batch, packed.max_seqlen_q, packed.max_seqlen_k
        p.batch, p.heads, p.seqlen_q, p.seqlen_k = B, H, Sq, Sk
        p.scale_log2 = float(args.scale) * math.log2(math.e)
        p.kv_group = group
        sched = int(meta["sched"])
        if sched >= 2:
            if not args.workspace:
                raise EvotunerError(f"hopper SCHED={sched}: no zeroed tile counter (AttentionArgs.workspace is 0)",
                                    "launch through evotuner.runtime.KernelModule, which zeroes it per launch")
            p.tile_counter = args.workspace
        else:
            p.tile_counter = None
        g = launch.launch_grid(sched, Sq, meta["block_m"], splits, H, B, device.sm_count, meta.get("ctas_per_sm", 1),
                               meta.get("cluster", 1))
        p.tail_first, p.tail_parts = 0, 1
        if sched == 3:   # the last wave split: the plan on this grid, within the scratch's slots
            block_m = int(meta["block_m"])
            tiles = -(-Sq // block_m) * H * B
            slots = launch.tail_slots(tiles, meta.get("ctas_per_sm", 1))
            plan = launch.tail_plan(tiles, g["x"], -(-Sk // int(meta["block_n"])), slots)
            p.tail_first, p.tail_parts = plan["first"], plan["parts"]
        if splits > 1 or sched == 3:
            if not args.scratch:
                what = f"SPLITS={splits}" if splits > 1 else "SCHED=3"
                raise EvotunerError(f"hopper {what}: no scratch for the partial results (AttentionArgs.scratch is 0)",
                                    "launch through evotuner.runtime.KernelModule, which allocates it")
            p.scratch = args.scratch
            p.o_ptr = o.ptr
            p.o_batch_stride, p.o_head_stride, p.o_row_stride = o.strides[0], o.strides[1], o.strides[2]
        return LaunchSpec(args=(bytes(p),), grid=(g["x"], g["y"], g["z"]), block=(meta["threads"], 1, 1),
                          smem_bytes=meta["smem_bytes"])


def uses_split_space(problem: Problem) -> bool:
    """Whether ``problem`` is searched with split-KV (hopper_split.toml): dense, D 64 or 128,
    at most :data:`SPLIT_SPACE_ROWS` query rows."""
    return (not problem.varlen and problem.shape.head_dim not in WIDE_HEAD_DIMS + NARROW_HEAD_DIMS
            and problem.query_rows <= SPLIT_SPACE_ROWS)


def recommended_splits(problem: Problem, block_m: int, block_n: int, sms: int = SPLIT_SMS) -> int:
    """The split count a new study of ``problem`` tries first (the search then tunes it):
    FlashAttention-3's rule (hopper/heuristics.h) over :data:`SPLIT_CHOICES`: none when the
    tiles fill 80% of the SMs or the keys are fewer than :data:`SPLIT_MIN_KEYS_PER_ROW` times
    the query rows, else the fewest splits whose wave efficiency (CTAs over the
    SM slots of the waves they take) is within 85% of the best, each split keeping at
    least two key blocks and the combine's serial chain (rows per warp x splits) at most
    :data:`COMBINE_CHAIN`."""
    s = problem.shape
    tiles = -(-s.seqlen_q // block_m) * s.heads * s.batch
    blocks = -(-s.seqlen_k // block_n)
    if tiles >= 0.8 * sms or s.seqlen_k < SPLIT_MIN_KEYS_PER_ROW * s.seqlen_q:
        return 1
    # The combining CTA walks its rows one warp each (split.cuh). With the splits one after
    # another, rows per warp x splits dependent loads, past COMBINE_CHAIN that chain cost more
    # than the split saved (H100: 16 packed rows per warp x 16 splits took 143 µs where 4
    # splits took 24). split.cuh now loads 8 splits' partials at once (cost.py's COMBINE_LOADS);
    # the cap stays at what was measured until scripts/bench_decode.py times the new combine.
    rows_per_warp = -(-min(block_m, s.seqlen_q) // (block_m // 16))
    usable = [n for n in SPLIT_CHOICES if n == 1 or (blocks >= 2 * n and rows_per_warp * n <= COMBINE_CHAIN)]
    efficiency = {n: tiles * n / (-(-tiles * n // sms) * sms) for n in usable}
    best = max(efficiency.values())
    return min(n for n in usable if efficiency[n] >= 0.85 * best)


def split_scratch_bytes(splits: int, batch: int, heads: int, seqlen_q: int, block_m: int, head_dim: int) -> int:
    """Scratch bytes of a split-KV launch (launch.py's split_scratch: counters, then the fp32
    LSE and O partials)."""
    return launch.split_scratch(splits, batch, heads, seqlen_q, block_m, head_dim)["bytes"]


def _pack_heads(view: TensorView, group: int) -> TensorView | None:
    """A [B, H, S, D] view as [B, H/group, group*S, D] (query head h = kv*group + g, row s at
    packed row g*S + s), or None where no single row stride reaches every packed row
    (launch.packed_row_stride: the production extension packs by the same rule)."""
    B, H, S, D = view.shape
    sb, sh, ss, sd = view.strides
    row = launch.packed_row_stride(S, sh, ss)
    if row == 0:
        return None
    return TensorView(ptr=view.ptr, shape=(B, H // group, group * S, D), strides=(sb, group * sh, row, sd))


def _kv_group(q: TensorView, k: TensorView) -> int:
    """Query heads per key/value head (GQA/MQA); the runtime checked that it divides."""
    return q.shape[1] // k.shape[1]


def _defaults_text() -> tuple[str, str]:
    path = Hopper().defaults_file()
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except OSError as exc:
        raise EvotunerError(f"{path}: cannot read the hopper family's recommended configs ({exc.strerror})",
                            "pass config={...} explicitly, or reinstall evotuner") from None


@lru_cache(maxsize=1)
def _entries():
    return parse_defaults(*_defaults_text())


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    return tomllib.loads(_defaults_text()[0])
