"""Split-KV in the hopper family, without a GPU: the space that offers it (hopper_split.toml,
kept word for word equal to hopper.toml elsewhere), which problems get it, the recommended
split count, the scratch layout and launch geometry, the cost model's view of it, config=
taking SPLITS, and split configs compiling clean. The GPU side: tests/gpu/test_split_kv.py."""

from __future__ import annotations

import math
import shutil
try:
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
from pathlib import Path

import pytest

from evotuner.compiler import Builder
from evotuner.config import KernelConfig
from evotuner.defaults import family_parameters
from evotuner.errors import EvotunerError
from evotuner.family import AttentionArgs, DeviceInfo, TensorView
from evotuner.family.registry import get_family
from evotuner.gate import apply_gate
from evotuner.kernels.hopper import family as HF
from evotuner.kernels.hopper import params as HP
from evotuner.kernels.hopper.cost import estimate_us
from evotuner.problem import Problem, Shape
from evotuner.space import load_space

HOPPER = get_family("hopper")
SPLIT_SPACE = load_space(HF.Hopper().space_for(Problem(Shape(1, 8, 1, 4096, 128), "fp16", False)))


def _decode(B=1, H=32, Hkv=8, Sq=1, Sk=32768, D=128, causal=False) -> Problem:
    return Problem(Shape(B, H, Sq, Sk, D, Hkv), "fp16", causal)


def test_the_split_space_is_hopper_toml_but_for_sched_and_splits():
    split = tomllib.loads(Path(SPLIT_SPACE.path).read_text(encoding="utf-8"))
    base = tomllib.loads(HOPPER.default_space().read_text(encoding="utf-8"))
    assert split["space"]["kernel"] == base["space"]["kernel"] and split["space"]["arch"] == base["space"]["arch"]
    assert split["params"].pop("SPLITS")["values"] == list(HF.SPLIT_CHOICES)
    assert split["params"].pop("SCHED")["values"] == [0]
    assert split["params"].pop("EXP_EMU")["values"] == [0]
    assert split["params"].pop("CLUSTER")["values"] == [1]
    assert split["params"].pop("TILE_OVERLAP")["values"] == [0]       # needs a persistent scheduler
    for knob in ("SCHED", "EXP_EMU", "CLUSTER", "TILE_OVERLAP"):
        base["params"].pop(knob)
    assert split["params"] == base["params"]
    assert [c for c in split["constraints"] if c["name"] not in ("split_sched", "split_varlen")] == base["constraints"]
    for table in ("derived", "device", "gate"):
        assert split[table] == base[table], table


@pytest.mark.parametrize("problem, space", [
    (_decode(), "hopper_split.toml"),
    (_decode(B=16, H=32, Sq=16), "hopper_split.toml"),          # 8192 query rows: under one wave
    (Problem(Shape(1, 16, 1024, 1024, 64), "fp16", True), "hopper.toml"),
    (Problem(Shape(1, 4, 1, 4096, 256), "fp16", False), "hopper_wide.toml"),
    (Problem(Shape(4, 8, 1, 4096, 64), "fp16", False, varlen=True), "hopper.toml"),
])
def test_which_problems_are_searched_with_split(problem, space):
    assert HOPPER.space_for(problem).name == space


def test_recommended_splits_follow_the_wave_rule():
    # 32 tiles of 64 rows: 4 splits give 128 CTAs (97% of a wave), the fewest within 85% of the best
    assert HF.recommended_splits(_decode(), 64, 128) == 4
    # 4 tiles: 32 splits (128 CTAs); but never less than two key blocks per split
    assert HF.recommended_splits(_decode(H=4, Hkv=4), 64, 128) == 32
    assert HF.recommended_splits(_decode(H=4, Hkv=4, Sk=1024), 64, 128) == 4
    # tiles filling 80% of the SMs: no split
    assert HF.recommended_splits(_decode(B=16, H=32, Sq=16), 64, 128) == 1
    # keys fewer than 4x the query rows (prefill-like): no split, however few the tiles
    assert HF.recommended_splits(_decode(H=8, Hkv=8, Sq=512, Sk=512), 64, 128) == 1
    assert HF.recommended_splits(_decode(H=8, Hkv=8, Sq=512, Sk=2047), 64, 128) == 1
    assert HF.recommended_splits(_decode(H=8, Hkv=8, Sq=512, Sk=2048), 64, 128) > 1
    # the combine's chain: 128 packed rows on 8 warps (16 each) x at most 4 splits (H100: x16 took
    # 143 µs where x4 took 24 at 1,32/4,16,4096)
    packed = HF.packed_problem(_decode(Hkv=4, Sq=16, Sk=4096))
    assert HF.recommended_splits(packed, 128, 128) == 4


def test_recommended_config_of_a_decode_problem_is_a_config_of_its_space():
    problem = _decode()
    (cfg,) = HOPPER.recommended_configs(problem)
    assert cfg["SCHED"] == 0 and cfg["PACK_GQA"] == 1 and cfg["EXP_EMU"] == 0
    # packed: 8 K/V heads of one 4-row tile each -> 16 splits fill 128 of the 132 SMs
    assert cfg["SPLITS"] == HF.recommended_splits(HF.packed_problem(problem), 64 * cfg["CONSUMER_WGS"],
                                                  cfg["BLOCK_N"]) == 16
    (mha,) = HOPPER.recommended_configs(_decode(Hkv=32))
    assert mha["PACK_GQA"] == 0 and mha["SPLITS"] == 4
    SPLIT_SPACE.validate(cfg)
    assert SPLIT_SPACE.violated(cfg, problem) is None
    # a big problem's recommended config stays hopper.toml's (no SPLITS key)
    (big,) = HOPPER.recommended_configs(Problem(Shape(16, 16, 2048, 2048, 64), "fp16", False))
    assert "SPLITS" not in big.as_dict()


def test_splits_is_a_known_parameter_of_the_family():
    from evotuner.runtime.attention import resolve_config
    assert "SPLITS" in family_parameters("hopper")
    cfg = resolve_config({"SPLITS": 8, "SCHED": 0}, 128, "fp16", False, family="hopper")
    assert cfg["SPLITS"] == 8 and cfg["SCHED"] == 0
    assert "SPLITS" not in resolve_config({"SCHED": 0}, 128, "fp16", False, family="hopper").as_dict()


META = {"abi": 1, "threads": 256, "smem_bytes": 99328, "head_dim": 128, "is_causal": 0, "dtype": 0, "min_blocks": 1,
        "block_m": 64, "block_n": 128, "stages": 2, "consumer_wgs": 1, "reg_prod": 24, "reg_cons": 256,
        "overlap": 1, "pingpong": 0, "o_box_rows": 64, "sched": 0, "rescale_log2": 0, "exp_emu": 0, "varlen": 0,
        "splits": 8}


def _view(B, H, S, D, base):
    return TensorView(ptr=base, shape=(B, H, S, D), strides=(H * S * D, S * D, D, 1))


def _args(B=2, H=8, Hkv=2, Sq=5, Sk=3000, D=128, scratch=0x7F6000000000):
    return AttentionArgs(q=_view(B, H, Sq, D, 0x7F1000000000), k=_view(B, Hkv, Sk, D, 0x7F2000000000),
                         v=_view(B, Hkv, Sk, D, 0x7F3000000000), o=_view(B, H, Sq, D, 0x7F4000000000), lse=None,
                         dtype="fp16", scale=0.1, scratch=scratch)


def test_scratch_layout_and_launch_geometry(monkeypatch):
    monkeypatch.setattr(HF, "encode_tensor_map", lambda *a, **k: bytes(128))
    # counters: 2*8 tiles -> 64 B -> 256; LSE partials 2*8*8*5 fp32 = 2560 B; O partials x D
    assert HOPPER.scratch_bytes(META, 2, 8, 5, 3000) == 256 + 2560 + 2 * 8 * 8 * 5 * 128 * 4
    assert HOPPER.scratch_bytes({**META, "splits": 1}, 2, 8, 5, 3000) == 0
    spec = HOPPER.launch(META, _args(), DeviceInfo(index=0, sm_count=132))
    assert spec.grid == (1 * 8, 8, 2)     # m blocks x splits, heads, batch
    p = HP.Params.from_buffer_copy(spec.args[0])
    assert p.scratch == 0x7F6000000000 and p.o_ptr == 0x7F4000000000
    assert (p.o_batch_stride, p.o_head_stride, p.o_row_stride) == (8 * 5 * 128, 5 * 128, 128)
    assert bytes(p.tm_o) == bytes(128)    # split writes O through o_ptr: no map (one place per pointer)
    with pytest.raises(EvotunerError, match="no scratch"):
        HOPPER.launch(META, _args(scratch=0), DeviceInfo(index=0, sm_count=132))


def test_cost_model_prefers_splits_when_tiles_leave_sms_idle():
    problem = _decode(H=8, Hkv=8, Sk=131072)
    base = dict(BLOCK_N=128, CONSUMER_WGS=1, STAGES=2, REG_PROD=24, REG_CONS=256, OVERLAP=1, PINGPONG=0, SCHED=0,
                RESCALE_LOG2=0, EXP_EMU=0)
    times = {n: estimate_us({**base, "SPLITS": n}, problem) for n in HF.SPLIT_CHOICES}
    assert times[16] < times[4] < times[1] / 3
    # the HBM floor: K and V of 8 heads x 131072 keys x D=128, fp16, read once at 3.35 TB/s
    floor = 2 * 8 * 131072 * 128 * 2 / 3.35e12 * 1e6
    assert min(times.values()) >= floor * 0.99
    big = Problem(Shape(16, 16, 2048, 2048, 64), "fp16", False)
    assert estimate_us({**base, "SPLITS": 4}, big) > estimate_us(base, big)
    assert math.isfinite(times[1])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_split_configs_compile_clean_and_pass_the_gate(build_cache_dir):
    problems = [_decode(), _decode(Sq=16, D=64, causal=True), Problem(Shape(1, 8, 512, 512, 64), "fp16", False)]
    configs = [HOPPER.recommended_configs(p)[0] for p in problems]
    configs[1] = KernelConfig.of({**configs[1].as_dict(), "SPLITS": 32})
    with Builder("hopper", cache_dir=build_cache_dir, jobs=2) as builder:
        for cfg, problem in zip(configs, problems):
            result = builder.build(cfg, problem)
            assert result.ok, (cfg, result.error)
            assert result.artifact.meta["splits"] == cfg.as_dict().get("SPLITS", 1)
            assert apply_gate(result, SPLIT_SPACE.gate, family=HOPPER).passed, cfg
            assert result.artifact.meta["smem_bytes"] == SPLIT_SPACE.derive(cfg, problem)["smem_bytes"]


def test_query_head_packing_views_a_kv_heads_query_heads_as_one_head(monkeypatch):
    maps = {}

    def encode(ptr, shape, strides, *a, name="", **k):
        maps[name] = (tuple(shape), tuple(strides))
        return bytes(128)
    monkeypatch.setattr(HF, "encode_tensor_map", encode)
    meta = {**META, "pack_gqa": 1, "splits": 1}
    spec = HOPPER.launch(meta, _args(B=2, H=8, Hkv=2, Sq=5), DeviceInfo(index=0, sm_count=132))
    p = HP.Params.from_buffer_copy(spec.args[0])
    assert (p.heads, p.seqlen_q, p.kv_group) == (2, 4 * 5, 1)
    assert spec.grid == (1, 2, 2)          # one 64-row tile of 20 packed rows per K/V head
    assert maps["q"] == maps["o"] == ((2, 2, 20, 128), (8 * 5 * 128, 4 * 5 * 128, 128, 1))
    # causal kernels and layouts no single row stride can walk are launched unpacked
    causal = HOPPER.launch({**meta, "is_causal": 1}, _args(B=2, H=8, Hkv=2, Sq=5), DeviceInfo(0, 132))
    assert HP.Params.from_buffer_copy(causal.args[0]).kv_group == 4
    bshd = TensorView(ptr=0x7F1000000000, shape=(2, 8, 5, 128), strides=(5 * 8 * 128, 128, 8 * 128, 1))
    assert HF._pack_heads(bshd, 4) is None
    one_row = TensorView(ptr=0x7F1000000000, shape=(2, 8, 1, 128), strides=(8 * 128, 128, 8 * 128, 1))
    assert HF._pack_heads(one_row, 4).strides == (8 * 128, 4 * 128, 128, 1)


def test_cost_model_sees_packing_for_grouped_decode():
    problem = _decode(H=32, Hkv=4, Sk=131072)
    base = dict(BLOCK_N=128, CONSUMER_WGS=1, STAGES=2, REG_PROD=24, REG_CONS=256, OVERLAP=1, PINGPONG=0, SCHED=0,
                RESCALE_LOG2=0, EXP_EMU=0, SPLITS=32)
    assert estimate_us({**base, "PACK_GQA": 1}, problem) < estimate_us({**base, "PACK_GQA": 0}, problem)
