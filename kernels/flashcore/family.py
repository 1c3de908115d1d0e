"""The FlashCore family's Python side: the :class:`~evotuner.family.KernelFamily` the
generic stages use for kernels/flashcore/ (registered through the
``evotuner.families`` entry point in pyproject.toml)."""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from evotuner.config import KernelConfig
from evotuner.defaults import parse_defaults, pick_config
from evotuner.errors import EvotunerError
from evotuner.family.base import packaged
from evotuner.family import AttentionArgs, DeviceInfo, KernelFamily, LaunchSpec
from evotuner.kernels.flashcore.params import META_FIELDS, Params
from evotuner.problem import Problem


class FlashCore(KernelFamily):
    name = "flashcore"
    title = "FlashCore"
    macro_prefix = "FLASHCORE"
    entry = "flashcore_fwd"
    meta_symbol = "flashcore_meta"
    meta_fields = META_FIELDS
    echoed = {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "MIN_BLOCKS": "min_blocks"}
    head_dims = (32, 64, 96, 128, 256)
    dtypes = ("fp16", "bf16")
    min_blocks_label = "MIN_BLOCKS="
    export_namespace = "flashcore::tuned"
    export_macro_prefix = "FLASHCORE_TUNED"

    def default_space(self) -> Path:
        return packaged("evotuner.search_spaces", "flashcore.toml")

    def defaults_file(self) -> Path:
        return packaged("evotuner.kernels", "flashcore", "defaults.toml")

    def recommended_configs(self, problem: Problem) -> tuple[KernelConfig, ...]:
        try:
            return (pick_config(_entries(), problem.shape.head_dim, problem.dtype, problem.causal, self.title),)
        except EvotunerError:
            return ()

    def gate_hint(self, check: str, meta: Mapping[str, int]) -> str:
        min_blocks = int(meta.get("min_blocks", 1))
        lower = f", or lower MIN_BLOCKS={min_blocks}" if min_blocks > 1 else ""
        return {
            "spills": f"reduce BLOCK_M or BLOCK_N{lower}",
            "registers": f"reduce BLOCK_N or rows per warp{lower}",
            "regs_per_sm": "lower MIN_BLOCKS or NUM_WARPS",
            "smem_per_block": "reduce BLOCK_N or STAGES",
            "smem_per_sm": "lower MIN_BLOCKS, BLOCK_N or STAGES",
        }.get(check, "choose a smaller config")

    def launch(self, meta: Mapping[str, int], args: AttentionArgs, device: DeviceInfo) -> LaunchSpec:
        q, k, v, o, lse = args.q, args.k, args.v, args.o, args.lse
        B, H, Sq, _ = q.shape
        p = Params()
        p.q, p.k, p.v, p.o = q.ptr, k.ptr, v.ptr, o.ptr
        p.lse = lse.ptr if lse is not None else None
        p.q_batch_stride, p.q_head_stride, p.q_row_stride = q.strides[:3]
        p.k_batch_stride, p.k_head_stride, p.k_row_stride = k.strides[:3]
        p.v_batch_stride, p.v_head_stride, p.v_row_stride = v.strides[:3]
        p.o_batch_stride, p.o_head_stride, p.o_row_stride = o.strides[:3]
        p.batch, p.heads, p.seqlen_q, p.seqlen_k = B, H, Sq, k.shape[2]
        p.scale = float(args.scale)
        p.scale_log2 = float(args.scale) * math.log2(math.e)
        p.kv_group = H // k.shape[1]        # GQA/MQA: query heads per key/value head
        grid = (math.ceil(Sq / meta["block_m"]), H, B)
        return LaunchSpec(args=(bytes(p),), grid=grid, block=(meta["threads"], 1, 1), smem_bytes=meta["smem_bytes"])


@lru_cache(maxsize=1)
def _entries():
    path = FlashCore().defaults_file()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EvotunerError(f"{path}: cannot read the kernel's recommended configs ({exc.strerror})",
                            "pass config={...} explicitly, or reinstall evotuner") from None
    return parse_defaults(text, str(path))
