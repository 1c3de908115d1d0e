"""The hopper family at head dim 96 without a GPU (issue #24): the space (hopper_d96.toml:
D=128's shared memory, D=96's registers), the routing (space_for, flash_attention's choice,
no split-KV space), the launch maps ({96, S, 1, H, B}, one 64-column panel per box) and the
kernel's build (sm_90a: six k16 steps of QK^T, wgmma N=96 for PV, a TMA per panel, 0
spills for configs of the space, split-KV and query-head packing, the HOPPER_PV_PADDED
fallback). The recommended configs' build and gate: tests/test_hopper_family.py (its
RECOMMENDED covers D=96). Correctness on the GPU: tests/gpu/test_hopper_d96_gpu.py."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pytest

from evotuner.compiler import Builder
from evotuner.config import KernelConfig
from evotuner.family import AttentionArgs, DeviceInfo, TensorView, get_family
from evotuner.gate import apply_gate, parse_ptxas
from evotuner.kernels.hopper import launch
from evotuner.kernels.hopper import params as HP
from evotuner.kernels.hopper.family import uses_split_space
from evotuner.problem import Problem, Shape
from evotuner.space import load_space
from hopper_ptx import hopper_ptx

HOPPER = get_family("hopper")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
BASE = dict(BLOCK_N=128, CONSUMER_WGS=2, STAGES=2, REG_PROD=24, REG_CONS=240, OVERLAP=1, PINGPONG=1, SCHED=0,
            RESCALE_LOG2=8, EXP_EMU=0, CTAS_PER_SM=1)


def _problem(Sq=2048, causal=False, B=4, H=8, D=96, dtype="fp16", Hkv=None, varlen=False):
    return Problem(Shape(B, H, Sq, Sq, D, Hkv or H), dtype, causal, varlen=varlen)


SPACE = load_space(HOPPER.space_for(_problem()))


# --------------------------------------------------------------------------- space and routing


def test_d96_is_a_hopper_problem_searched_in_its_own_space():
    assert 96 in HOPPER.head_dims and HOPPER.unsupported(_problem()) is None
    for prob in (_problem(), _problem(256), _problem(16384, True), _problem(1, B=1, H=4)):
        assert HOPPER.space_for(prob).name == "hopper_d96.toml", prob
        assert not uses_split_space(prob)                       # no split-KV space at D=96
    assert SPACE.name == "hopper_d96" and SPACE.kernel == "hopper"
    # hopper.toml's knobs but cross-tile pipelining and Q in registers (listed [0] there, not searched)
    assert set(SPACE.names) == set(load_space(HOPPER.default_space()).names) - {"TILE_OVERLAP", "Q_IN_REGS"}
    feasible = [c for c in SPACE.configs() if SPACE.violated(c, _problem()) is None]
    assert 1000 <= len(feasible) <= 20000
    # the space is D=96's only: other head dims are refused naming it
    violated = SPACE.violated(KernelConfig.of(BASE), _problem(D=128))
    assert violated is not None and violated.name == "head_dim" and "D=96" in violated.message


@pytest.mark.parametrize("config, constraint", [
    (dict(STAGES=4, BLOCK_N=192, SCHED=1), "smem_per_block"),     # D=128's smem: 1 + 64 + 2*4*48 KiB
    (dict(STAGES=3, SCHED=1), "smem_per_block"),                  # 32+32+3*64 KiB + 1 KiB: as at D=128
    (dict(CONSUMER_WGS=2, REG_PROD=32, REG_CONS=240), "register_pool"),
    (dict(CTAS_PER_SM=2, CONSUMER_WGS=1, PINGPONG=0, REG_CONS=232), "smem_per_sm"),
    (dict(CONSUMER_WGS=1, PINGPONG=1, REG_CONS=256), "pingpong"),
])
def test_the_space_refuses_what_cannot_fit_at_d96(config, constraint):
    violated = SPACE.violated(KernelConfig.of({**BASE, **config}), _problem())
    assert violated is not None and violated.name == constraint, violated


def test_the_space_admits_d128s_tiles_and_pads_their_smem():
    for knobs in (BASE, dict(BASE, STAGES=3), dict(BASE, SCHED=1),
                  dict(BASE, BLOCK_N=80, CONSUMER_WGS=3, REG_CONS=160, SCHED=2),
                  dict(BASE, CONSUMER_WGS=1, REG_CONS=232, PINGPONG=0, BLOCK_N=64, CTAS_PER_SM=2)):
        cfg = KernelConfig.of(knobs)
        assert SPACE.violated(cfg, _problem()) is None, knobs
        # D=96's tiles take D=128's room: the same smem as hopper.toml computes at D=128
        assert SPACE.derive(cfg, _problem())["smem_bytes"] == \
            load_space(HOPPER.default_space()).derive(cfg, _problem(D=128))["smem_bytes"]


def test_recommended_configs_and_routing_of_flash_attention_to_hopper():
    """The measured entries ([d96], [d96.causal], [d96.causal.mid]: the H100 searches' bests)
    and the unmeasured ones (D=128's tiles) are in the D=96 space; flash_attention picks hopper."""
    attention = pytest.importorskip("evotuner.runtime.attention")
    measured = {(16384, False): 112, (16384, True): 112, (2048, True): 96}     # Sq, causal: BLOCK_N
    for Sq, causal in ((256, False), (2048, False), (16384, False), (2048, True), (16384, True)):
        p96, p128 = _problem(Sq, causal), _problem(Sq, causal, D=128)
        (cfg,) = HOPPER.recommended_configs(p96)
        if (Sq, causal) in measured:
            assert cfg["BLOCK_N"] == measured[Sq, causal] and cfg["CONSUMER_WGS"] == 3, (Sq, causal, cfg)
        elif not uses_split_space(p128):
            assert cfg == HOPPER.recommended_configs(p128)[0], (Sq, causal)
        assert SPACE.violated(cfg, p96) is None
        assert HOPPER.expected_speed(p96) > 0
        choice = attention.choose(p96)
        assert choice.family == "hopper" and choice.config == cfg, choice
    gqa = _problem(Hkv=2)
    assert attention.choose(gqa).family == "hopper"
    assert attention.choose(_problem(), family="flashcore").family == "flashcore"
    refused = attention.choose(_problem(), exclude={"hopper": "q: some stride TMA cannot take"})
    assert refused.family == "flashcore" and "TMA cannot take" in refused.why


# --------------------------------------------------------------------------- launch maps


def test_d96_maps_are_one_panel_per_box_over_the_true_width():
    view = launch.tma_view(2, 3, 97, 96, 3 * 97 * 96, 97 * 96, 96, 128, 1)
    assert view["dims"] == (96, 97, 1, 3, 2) and view["box"] == (64, 128, 1, 1, 1)
    assert view["byte_strides"] == (96 * 2, 96 * 2, 97 * 96 * 2, 3 * 97 * 96 * 2)
    assert all(launch.map_box(w, 128, 80, 64, 96, 1)["panels"] == 1 for w in range(4))
    assert launch.map_box(launch.MAP_K, 128, 80, 64, 128, 1)["panels"] == 2             # D=128 unchanged
    assert launch.tma_view(1, 1, 5, 128, 640, 640, 128, 64, 2)["dims"] == (64, 5, 2, 1, 1)
    base = 0x7F0000000000
    assert launch.tma_fault(base, 2, 4, 96, 4 * 33 * 96, 33 * 96, 96, 1) == launch.FAULT_NONE
    assert launch.tma_fault(base, 2, 4, 80, 4 * 33 * 80, 33 * 80, 80, 1) == launch.FAULT_HEAD_DIM
    with pytest.raises(HP.TmaStrideError, match="D=80 is neither 96 nor a multiple of 64"):
        HP.check_tma_view("q", base, (2, 4, 33, 80), (4 * 33 * 80, 33 * 80, 80, 1))


def test_launch_encodes_every_map_with_one_panel_at_d96(monkeypatch):
    calls = []

    def encode(ptr, shape, strides, dtype, rows, panels, *, name="tensor"):
        HP.check_tma_view(name, ptr, shape, strides)
        calls.append((name, shape[3], rows, panels))
        return bytes(128)

    monkeypatch.setattr("evotuner.kernels.hopper.family.encode_tensor_map", encode)

    def view(shape, ptr):
        return TensorView(ptr, shape, tuple(math.prod(shape[i + 1:]) for i in range(4)))

    q, k = view((3, 8, 97, 96), 0x7F0000000000), view((3, 2, 513, 96), 0x7F1000000000)
    args = AttentionArgs(q=q, k=k, v=view((3, 2, 513, 96), 0x7F2000000000), o=view((3, 8, 97, 96), 0x7F3000000000),
                         lse=None, dtype="fp16", scale=1 / math.sqrt(96), workspace=0)
    meta = {"block_m": 192, "block_n": 80, "o_box_rows": 64, "threads": 512, "smem_bytes": 1, "sched": 0,
            "is_causal": 0, "head_dim": 96}
    spec = HOPPER.launch(meta, args, DeviceInfo(index=0, sm_count=132))
    p = HP.Params.from_buffer_copy(spec.args[0])
    assert calls == [("q", 96, 192, 1), ("k", 96, 80, 1), ("v", 96, 80, 1), ("o", 96, 64, 1)]
    assert p.kv_group == 4 and p.scale_log2 == pytest.approx(math.log2(math.e) / math.sqrt(96))


# --------------------------------------------------------------------------- builds


@pytest.fixture(scope="module")
def builder(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    with Builder("hopper", cache_dir=tmp_path_factory.mktemp("d96_builds"), jobs=2) as b:
        yield b


#: Configs of hopper_d96.toml (and split-KV / packing, which it does not offer) x (dtype, causal, varlen).
SAMPLE = [
    (dict(BASE), "fp16", False, False),
    (dict(BASE, BLOCK_N=176), "bf16", True, False),
    (dict(BASE, BLOCK_N=192, OVERLAP=0, PINGPONG=0, SCHED=2, STAGES=1), "fp16", True, False),
    (dict(BASE, CONSUMER_WGS=1, REG_CONS=256, PINGPONG=0, STAGES=3, RESCALE_LOG2=0), "bf16", False, False),
    (dict(BASE, CONSUMER_WGS=1, REG_CONS=232, PINGPONG=0, BLOCK_N=64, CTAS_PER_SM=2, SCHED=2), "fp16", True, False),
    (dict(BASE, SCHED=2), "bf16", True, True),                                     # packed varlen
    (dict(BASE, CONSUMER_WGS=1, REG_CONS=256, PINGPONG=0, SPLITS=4, PACK_GQA=1), "fp16", False, False),
    (dict(BASE, SPLITS=8), "bf16", True, False),
]


@needs_nvcc
def test_space_configs_build_clean_at_d96(builder):
    jobs = []
    for knobs, dtype, causal, varlen in SAMPLE:
        prob = _problem(causal=causal, dtype=dtype, varlen=varlen)
        plain = {k: v for k, v in knobs.items() if k not in ("SPLITS", "PACK_GQA")}
        assert SPACE.violated(KernelConfig.of(plain), prob) is None, knobs
        jobs.append((knobs, prob, builder.submit(KernelConfig.of(knobs), prob)))
    for knobs, prob, fut in jobs:
        result = fut.result()
        assert result.ok, (knobs, result.error)
        report = parse_ptxas(result.ptxas_log, HOPPER.entry)
        assert report.spill_stores == 0 and report.spill_loads == 0 and report.stack == 0, (knobs, report)
        assert not re.search(r"\(C751\d\)", result.ptxas_log)
        assert apply_gate(result, SPACE.gate, family=HOPPER).passed, knobs
        meta = result.artifact.meta
        assert meta["head_dim"] == 96
        plain = {k: v for k, v in knobs.items() if k not in ("SPLITS", "PACK_GQA")}
        assert meta["smem_bytes"] == SPACE.derive(KernelConfig.of(plain), prob)["smem_bytes"], knobs


def _ptx(tmp_path: Path, extra: str = "", block_n: int = 80) -> str:
    return hopper_ptx(tmp_path, extra, HEAD_DIM=96, IS_CAUSAL=1, DTYPE=1, BLOCK_N=block_n)


@needs_nvcc
def test_d96_mma_shapes_and_tma_per_panel(tmp_path):
    """QK^T: 6 k16 steps of m64n80 (not 8) at each of its 3 issue sites; PV: N=96 at 5 k16
    steps x 3 sites; Q, K, V: two TMA loads each (one per 64-column panel); O: two stores."""
    ptx = _ptx(tmp_path)
    shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", ptx)
    assert shapes.count("80") == 6 * 3 and shapes.count("96") == 5 * 3 and set(shapes) == {"80", "96"}
    assert ptx.count("cp.async.bulk.tensor.5d.shared") == 6
    assert ptx.count("cp.async.bulk.tensor.5d.global") == 2
    # the dev fallback: PV over the padded 128 columns
    padded = re.findall(r"m64n(\d+)k16", _ptx(tmp_path, "#define HOPPER_PV_PADDED 1\n"))
    assert padded.count("128") == 5 * 3 and "96" not in padded
