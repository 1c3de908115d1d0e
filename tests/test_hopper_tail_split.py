"""SCHED=3, the last wave split, on the host (no GPU): the runtime's scratch and workspace for it,
the plan a launch carries in Params (launch.py tail_plan on the launch's grid, within the
scratch's slots), its refusal without scratch, and the cost model's view of it (a short last
round split pays; whole waves cost the same). The kernel's side: tests/gpu/test_tail_split.py."""

from __future__ import annotations

import pytest

from evotuner.errors import EvotunerError
from evotuner.family import AttentionArgs, DeviceInfo, TensorView
from evotuner.family.registry import get_family
from evotuner.kernels.hopper import family as HF
from evotuner.kernels.hopper import launch as L
from evotuner.kernels.hopper import params as HP
from evotuner.kernels.hopper.cost import estimate_us
from evotuner.problem import Problem, Shape

HOPPER = get_family("hopper")
#: A three-warpgroup SCHED 3 kernel's meta table (BLOCK_M 192, BLOCK_N 80), as decode_meta gives it.
META = {"abi": 1, "threads": 512, "smem_bytes": 181376, "head_dim": 128, "is_causal": 0, "dtype": 0,
        "min_blocks": 1, "block_m": 192, "block_n": 80, "stages": 2, "consumer_wgs": 3, "reg_prod": 24,
        "reg_cons": 160, "overlap": 1, "pingpong": 1, "o_box_rows": 64, "sched": 3, "rescale_log2": 8,
        "exp_emu": 0, "varlen": 0, "splits": 1, "ctas_per_sm": 1, "cluster": 1}
W3 = dict(BLOCK_N=80, CONSUMER_WGS=3, STAGES=2, REG_PROD=24, REG_CONS=160, OVERLAP=1, PINGPONG=1,
          RESCALE_LOG2=8, EXP_EMU=0, CTAS_PER_SM=1, CLUSTER=1, PACK_GQA=1, TILE_OVERLAP=0)


def _view(B, H, S, D, base):
    return TensorView(ptr=base, shape=(B, H, S, D), strides=(H * S * D, S * D, D, 1))


def _args(B, H, Sq, Sk, D=128, scratch=0x7F6000000000):
    return AttentionArgs(q=_view(B, H, Sq, D, 0x7F1000000000), k=_view(B, H, Sk, D, 0x7F2000000000),
                         v=_view(B, H, Sk, D, 0x7F3000000000), o=_view(B, H, Sq, D, 0x7F4000000000), lse=None,
                         dtype="fp16", scale=0.1, workspace=0x7F5000000000, scratch=scratch)


def test_sched_3_takes_a_tile_counter_and_the_tail_scratch():
    assert HOPPER.workspace_bytes(META) == HF.TILE_COUNTER_BYTES
    tiles = 688   # one m block of 192 rows per head
    assert HOPPER.scratch_bytes(META, 1, 688, 150, 4096) == L.tail_scratch(tiles, 1, 192, 128)["bytes"]
    # 132 slots (one per CTA of the largest grid): two counters for each of 12 warps (256-B
    # aligned), then the LSE and O partials
    assert L.tail_scratch(tiles, 1, 192, 128)["bytes"] == 12800 + 132 * 192 * 4 + 132 * 192 * 128 * 4


def test_a_launch_carries_the_plan_of_its_grid(monkeypatch):
    monkeypatch.setattr(HF, "encode_tensor_map", lambda *a, **k: bytes(128))
    # 688 tiles on 132 SMs: 5 whole rounds, the last 28 tiles in 4 parts of 52 key blocks' share
    spec = HOPPER.launch(META, _args(1, 688, 150, 4096), DeviceInfo(index=0, sm_count=132))
    p = HP.Params.from_buffer_copy(spec.args[0])
    assert spec.grid == (132, 1, 1)
    assert (p.tail_first, p.tail_parts) == (660, 4)
    assert p.scratch == 0x7F6000000000 and p.tile_counter == 0x7F5000000000 and p.o_ptr == 0x7F4000000000
    assert (p.o_batch_stride, p.o_head_stride, p.o_row_stride) == (688 * 150 * 128, 150 * 128, 128)
    # a grid the tiles fill in whole rounds, and one of 114 SMs (H100 PCIe): its own plan
    p = HP.Params.from_buffer_copy(HOPPER.launch(META, _args(1, 660, 150, 4096),
                                                 DeviceInfo(index=0, sm_count=132)).args[0])
    assert (p.tail_first, p.tail_parts) == (660, 1)
    p = HP.Params.from_buffer_copy(HOPPER.launch(META, _args(1, 688, 150, 4096),
                                                 DeviceInfo(index=0, sm_count=114)).args[0])
    assert (p.tail_first, p.tail_parts) == (684, 8)     # 688 = 6 x 114 + 4: the last 4 in 8
    with pytest.raises(EvotunerError, match="SCHED=3: no scratch"):
        HOPPER.launch(META, _args(1, 688, 150, 4096, scratch=0), DeviceInfo(index=0, sm_count=132))


def test_the_cost_model_sees_the_short_last_round_split_and_whole_waves_unchanged():
    ragged = Problem(Shape(1, 32, 4096, 4096, 128, 8), "fp16", False)    # 688 packed tiles: 5.21 waves
    whole = Problem(Shape(1, 24, 5280, 5280, 128, 6), "fp16", False)     # 660 packed tiles: 5 waves
    assert estimate_us({**W3, "SCHED": 3}, ragged) < 0.95 * estimate_us({**W3, "SCHED": 2}, ragged)
    assert estimate_us({**W3, "SCHED": 3}, whole) == pytest.approx(estimate_us({**W3, "SCHED": 2}, whole))


def test_the_hot_path_binder_rebinds_o_in_its_map_and_as_o_ptr(monkeypatch):
    """SCHED 3's Params hold O twice (the map whole tiles store through, o_ptr the split tiles'
    combine writes through): the binder finds both, so the call stays on the fast path. The
    (fake) maps here encode the pointer as a raw field."""
    from evotuner.runtime.binder import ArgBinder
    import struct
    monkeypatch.setattr(HF, "encode_tensor_map", lambda ptr, *a, **k: struct.pack("<QQ", 0xAB, ptr) + bytes(112))

    def make(ptrs):
        a = _args(1, 688, 150, 4096, scratch=ptrs["scratch"])
        a = AttentionArgs(**{**a.__dict__, **{n: _view(*getattr(a, n).shape, ptrs[n]) for n in "qkvo"},
                             "workspace": ptrs["workspace"]})
        return HOPPER.launch(META, a, DeviceInfo(index=0, sm_count=132)).args[0]

    base = {"q": 0x7F0000000000, "k": 0x7F1000000000, "v": 0x7F2000000000, "o": 0x7F3000000000,
            "workspace": 0x7F5000000000, "scratch": 0x7F6000000000}
    binder = ArgBinder.derive(make, base)
    assert binder is not None and binder.roles == tuple(base)
    assert [f.role for f in binder.fields].count("o") == 2
    moved = {r: p + 0x100 * (i + 1) for i, (r, p) in enumerate(base.items())}
    assert binder.bind(moved) == make(moved)
