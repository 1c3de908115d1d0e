"""``mini``: the test-only second kernel family (tests/families/kernels/mini/).

Different from FlashCore in every way the family contract covers: its own
parameter names (ROWS, UNROLL, PERSISTENT), macro prefix, symbols, meta fields,
Params struct (and a second kernel argument, the softmax scale), launch
geometry (a persistent 1-D grid sized by the device's SM count), supported
head dims/dtypes, gate rule, recommended configs and export namespace. It is
registered by tests/conftest.py through ``evotuner.family.register``, and
nothing in evotuner names it.
"""

from __future__ import annotations

import ctypes
import math
from ctypes import c_float, c_int32, c_int64, c_void_p
from pathlib import Path
from typing import Mapping

from evotuner.config import KernelConfig
from evotuner.family import AttentionArgs, DeviceInfo, KernelFamily, LaunchSpec
from evotuner.problem import Problem

HERE = Path(__file__).resolve().parent
SPACE = HERE / "mini_space.toml"
#: Blocks per SM of the persistent grid.
BLOCKS_PER_SM = 4


class MiniParams(ctypes.Structure):
    """``mini::Params`` (kernels/mini/params.h)."""

    _fields_ = [
        ("q", c_void_p), ("k", c_void_p), ("v", c_void_p), ("o", c_void_p),
        ("q_row", c_int64), ("q_head", c_int64), ("q_batch", c_int64),
        ("k_row", c_int64), ("k_head", c_int64), ("k_batch", c_int64),
        ("v_row", c_int64), ("v_head", c_int64), ("v_batch", c_int64),
        ("o_row", c_int64), ("o_head", c_int64), ("o_batch", c_int64),
        ("batch", c_int32), ("heads", c_int32), ("seqlen_q", c_int32), ("seqlen_k", c_int32),
        ("tiles", c_int32), ("pad_", c_int32),
    ]


class Mini(KernelFamily):
    name = "mini"
    title = "mini (test family)"
    macro_prefix = "MINI"
    entry = "mini_attention"
    meta_symbol = "mini_meta"
    meta_fields = ("rows", "persistent")
    echoed = {"ROWS": "rows", "PERSISTENT": "persistent"}
    head_dims = (32, 64)
    dtypes = ("fp16",)
    export_namespace = "mini::tuned"
    export_macro_prefix = "MINI_TUNED"

    def kernels_root(self) -> Path:
        return HERE / "kernels"

    def default_space(self) -> Path:
        return SPACE

    def recommended_configs(self, problem: Problem) -> tuple[KernelConfig, ...]:
        if self.unsupported(problem):
            return ()
        return (KernelConfig.of({"ROWS": 64, "UNROLL": 1, "PERSISTENT": 1}),)

    def expected_speed(self, problem: Problem) -> float:
        return 0.0   # nothing measured: FlashCore (the default family) wins the tie

    def gate_hint(self, check: str, meta: Mapping[str, int]) -> str:
        return {"spills": "lower UNROLL or use a smaller head dim", "registers": "lower UNROLL"}.get(
            check, "lower ROWS")

    def extra_gate(self, log, report, meta, thresholds):
        # mini's own rule (ptxas does not check it): the registers of 2 blocks must fit an SM.
        need = report.registers * meta["threads"] * 2
        if need > thresholds.device.regs_per_sm:
            return ("mini_occupancy", f"registers {report.registers} x ROWS={meta['threads']} x 2 blocks = {need}"
                                      f" > regs_per_sm={thresholds.device.regs_per_sm}: lower ROWS")
        return None

    def launch(self, meta: Mapping[str, int], args: AttentionArgs, device: DeviceInfo) -> LaunchSpec:
        q, k, v, o = args.q, args.k, args.v, args.o
        B, H, Sq, _ = q.shape
        p = MiniParams(q=q.ptr, k=k.ptr, v=v.ptr, o=o.ptr)
        for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
            setattr(p, f"{name}_batch", t.strides[0])
            setattr(p, f"{name}_head", t.strides[1])
            setattr(p, f"{name}_row", t.strides[2])
        p.batch, p.heads, p.seqlen_q, p.seqlen_k = B, H, Sq, k.shape[2]
        row_tiles = math.ceil(Sq / meta["rows"])
        p.tiles = row_tiles * H * B
        if meta["persistent"]:
            grid = (max(1, min(p.tiles, device.sm_count * BLOCKS_PER_SM)), 1, 1)
        else:
            grid = (row_tiles, H, B)
        return LaunchSpec(args=(bytes(p), bytes(c_float(args.scale))), grid=grid, block=(meta["threads"], 1, 1),
                          smem_bytes=meta["smem_bytes"])
