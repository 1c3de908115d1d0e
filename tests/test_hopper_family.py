"""The Hopper family (kernels/hopper/, kernels/hopper/family.py) on the CPU.

* the space file loads, names its family, and its constraints match traits.cuh;
* the shipped wgmma.cuh is what its generator (gen_wgmma.py, beside it) writes;
* ``hopper::Params`` (params.h, alignas(128), 4 CUtensorMap) is laid out exactly like
  the ctypes mirror (a host program prints sizeof/alignof/offsetof);
* every recommended config compiles with nvcc (sm_90a), has 0 spills / 0 stack, no
  ptxas wgmma-serialization note, and passes the gate; the space's smem formula equals
  the cubin's ``hopper_meta`` for those and a sample of other configs;
* the family's gate rules (register pool, C751x notes, launch-cap registers) reject;
* a knob added to a copy of the family (the space file and instantiate.cuh) is emitted, built
  and gated;
* launch(): Params bytes, grid per SCHED, the SCHED=2 tile counter, TMA stride errors;
* a replayed search + export over the SYNTHETIC hopper fixture
  (tests/data/replay/hopper_synthetic_d64.csv: made-up timings, never measurements).
"""

from __future__ import annotations

import ctypes
import json
import math
import struct
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from cli_helpers import run
from hopper_ptx import hopper_ptx
from paired_space import with_pairs
from evotuner import cli
from evotuner.compiler import Builder
from evotuner.family import AttentionArgs, DeviceInfo, TensorView, get_family
from evotuner.errors import SpaceError
from evotuner.gate import apply_gate, parse_ptxas
from evotuner.kernels.hopper import params as HP
from evotuner.problem import DTYPES, Problem, Shape
from evotuner.space import load_space

REPO = Path(__file__).resolve().parents[1]
PARAMS_H = Path(str(resources.files("evotuner.kernels"))) / "hopper" / "params.h"
SMALL = REPO / "tests" / "data" / "spaces" / "hopper_small.toml"
SYNTHETIC = REPO / "tests" / "data" / "replay" / "hopper_synthetic_d64.csv"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
HOPPER = get_family("hopper")
SPACE = load_space(HOPPER.default_space())


def _problem(d: int, dtype: str = "fp16", causal: bool = False, s: int = 2048) -> Problem:
    return Problem(Shape(4, 8, s, s, d), dtype, causal)


#: (D, dtype, causal, S): every (D, dtype, causal) at S=2048 (4x8 heads, 65536 query rows:
#: [d128.mid] and [d128.causal.mid] at D=128), at S=16384 (524288 rows: the big entries), and
#: the few-rows problems of defaults.toml's D=64 max_query_rows entries (4*8*256 = 8192 and
#: 4*8*512 = 16384 query rows: [d64.short], [d64.mid], [d64.causal.mid] in the split space
#: and out of it), of [d128.short], [d128.causal.short] and [d96.short] (8192 rows).
RECOMMENDED = [(d, dt, c, s) for d in HOPPER.head_dims for dt in DTYPES for c in (False, True) for s in (2048, 16384)] \
    + [(64, dt, c, s) for dt in DTYPES for c in (False, True) for s in (256, 512)] \
    + [(d, dt, c, 256) for d in (96, 128) for dt in DTYPES for c in (False, True)]


# --------------------------------------------------------------------------- space


def test_space_loads_and_names_the_family():
    assert SPACE.kernel == "hopper" and SPACE.arch == "sm_90a"
    assert set(SPACE.names) == {"BLOCK_N", "CONSUMER_WGS", "STAGES", "REG_PROD", "REG_CONS", "OVERLAP", "PINGPONG",
                                "SCHED", "RESCALE_LOG2", "EXP_EMU", "CTAS_PER_SM", "CLUSTER", "PACK_GQA", "TILE_OVERLAP",
                                "Q_IN_REGS"}
    feasible = [c for c in SPACE.configs() if SPACE.violated(c, _problem(64)) is None]
    assert 1000 <= len(feasible) <= 20000


@pytest.mark.parametrize("config, constraint", [
    (dict(CONSUMER_WGS=2, REG_PROD=32, REG_CONS=240), "register_pool"),      # 128*(32+480) > 384*168
    (dict(CONSUMER_WGS=3, REG_PROD=24, REG_CONS=232), "register_pool"),
    (dict(CONSUMER_WGS=1, REG_CONS=240), "consumer_regs"),                   # launch regs 255 at 256 threads
    (dict(CONSUMER_WGS=1, PINGPONG=1, REG_CONS=256), "pingpong"),
    (dict(OVERLAP=0, PINGPONG=1), "pingpong"),
    (dict(STAGES=4, BLOCK_N=192, SCHED=1), "smem_per_block"),
    # two CTAs per SM: half the registers (128 at 256 threads) and half the shared memory each
    (dict(CTAS_PER_SM=2), "register_pool"),                                  # 2 WGs: 80 launch regs
    (dict(CTAS_PER_SM=2, CONSUMER_WGS=1, PINGPONG=0, REG_CONS=240), "register_pool"),   # 128*(24+240) > 256*128
    (dict(CTAS_PER_SM=2, CONSUMER_WGS=1, PINGPONG=0, REG_CONS=232), "smem_per_sm"),     # 2 x 146 KiB
    # CTA pairs: SCHED 0 or 1 only (the pair walks its tiles in lockstep), one CTA per SM
    (dict(CLUSTER=2, SCHED=2), "cluster"),
    (dict(CLUSTER=2, CTAS_PER_SM=2, CONSUMER_WGS=1, PINGPONG=0, REG_CONS=232, STAGES=1), "cluster"),
])
def test_static_constraints_mirror_the_kernels_static_asserts(config, constraint):
    base = dict(BLOCK_N=128, CONSUMER_WGS=2, STAGES=2, REG_PROD=24, REG_CONS=240, OVERLAP=1, PINGPONG=1, SCHED=0,
                RESCALE_LOG2=8, EXP_EMU=0, CTAS_PER_SM=1)
    from evotuner.config import KernelConfig
    space = with_pairs(HOPPER.default_space()) if "CLUSTER" in config else SPACE
    violated = space.violated(KernelConfig.of({**base, **config}), _problem(128))
    assert violated is not None and violated.name == constraint, violated


def test_head_dims_the_kernel_does_not_build_are_not_hopper_problems():
    assert HOPPER.unsupported(_problem(32)) and HOPPER.recommended_configs(_problem(32)) == ()
    assert HOPPER.unsupported(_problem(64)) is None and HOPPER.unsupported(_problem(96)) is None


def test_every_recommended_config_is_in_the_space_and_has_a_figure():
    for d, dt, c, s in RECOMMENDED:
        (cfg,) = HOPPER.recommended_configs(_problem(d, dt, c, s))
        space = load_space(HOPPER.space_for(_problem(d, dt, c, s)))     # hopper_wide.toml at D=192/256
        space.validate(cfg)
        assert space.violated(cfg, _problem(d, dt, c, s)) is None, (d, dt, c, cfg)
        assert HOPPER.expected_speed(_problem(d, dt, c, s)) > 0


# --------------------------------------------------------------------------- generated sources


def test_the_shipped_wgmma_header_is_what_its_generator_writes():
    """kernels/hopper/wgmma.cuh is generated by kernels/hopper/gen_wgmma.py, beside it: the shipped
    file is the generator's output byte for byte (regenerate it rather than edit it)."""
    from evotuner.kernels.hopper import gen_wgmma

    shipped = Path(str(resources.files("evotuner.kernels"))) / "hopper" / "wgmma.cuh"
    assert gen_wgmma.OUT == shipped
    assert shipped.read_bytes() == gen_wgmma.generate().encode()
    assert shipped.read_text().startswith("// GENERATED by kernels/hopper/gen_wgmma.py;")


# --------------------------------------------------------------------------- Params ABI


def _host_compiler() -> list[str]:
    gxx = shutil.which("g++") or shutil.which("c++")
    if gxx:
        return [gxx, "-std=c++17", "-x", "c++"]
    return [shutil.which("nvcc") or pytest.skip("no host C++ compiler"), "-std=c++17", "-x", "c++"]


@needs_nvcc
def test_params_layout_matches_params_h(tmp_path):
    fields = [name for name, _ in HP.Params._fields_ if not name.startswith("_")]
    src = tmp_path / "layout.cpp"
    src.write_text("\n".join([
        "#include <cstddef>", "#include <cstdio>", '#include "hopper/params.h"', "int main() {",
        'std::printf("sizeof %zu\\n", sizeof(hopper::Params));',
        'std::printf("alignof %zu\\n", alignof(hopper::Params));',
        *[f'std::printf("{f} %zu %zu\\n", offsetof(hopper::Params, {f}), sizeof(hopper::Params::{f}));'
          for f in fields],
        *[f'std::printf("{m} %d\\n", (int)({m}));'
          for m in re.findall(r"#define\s+(HOPPER_(?:META_\w+|ABI_VERSION))\s", PARAMS_H.read_text())],
        "return 0; }"]))
    exe = tmp_path / "layout"
    # nvcc -x c++: the host compiler with the CUDA include path (params.h includes cuda.h)
    build = subprocess.run([shutil.which("nvcc"), "-std=c++17", "-x", "c++", str(src), "-I", str(PARAMS_H.parent.parent),
                            "-o", str(exe)], capture_output=True, text=True, timeout=180)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30, check=True).stdout
    host = {line.split()[0]: [int(x) for x in line.split()[1:]] for line in out.splitlines()}
    assert host["sizeof"] == [ctypes.sizeof(HP.Params)] == [640]
    assert host["alignof"] == [128]
    for f in fields:
        field = getattr(HP.Params, f)
        assert host[f] == [field.offset, field.size], f
    # the meta table: HOPPER_META_<NAME> indices are the Python order, HOPPER_META_LEN its length
    for i, name in enumerate(HP.HOPPER_META):
        assert host[f"HOPPER_META_{name.upper()}"] == [i], name
    assert host["HOPPER_META_LEN"] == [len(HP.HOPPER_META)]
    assert host["HOPPER_ABI_VERSION"] == [HP.HOPPER_ABI_VERSION]


def test_meta_table_decodes_onto_the_common_names_and_refuses_other_versions():
    values = [HP.HOPPER_ABI_VERSION, 384, 197760, 128, 128, 128, 0, 1, 2, 2, 24, 240, 1, 1, 64, 1, 8, 0, 0, 4, 1, 2, 2]
    raw = b"".join(v.to_bytes(4, "little", signed=True) for v in values)
    meta = HOPPER.decode_meta(raw)
    assert meta["threads"] == 384 and meta["min_blocks"] == 2 and meta["dtype"] == 1 and meta["sched"] == 1
    assert meta["ctas_per_sm"] == 2 and meta["cluster"] == 2
    assert meta["splits"] == 4 and meta["pack_gqa"] == 1
    assert set(meta) == set(("abi", "threads", "smem_bytes", "head_dim", "is_causal", "dtype", "min_blocks")) | set(
        HOPPER.meta_fields)
    from evotuner.abi import MetaError
    with pytest.raises(MetaError, match="HOPPER_ABI_VERSION 8"):
        HOPPER.decode_meta(b"\x08\0\0\0" + raw[4:])
    with pytest.raises(MetaError, match="expected 92"):
        HOPPER.decode_meta(raw[:-4])
    with pytest.raises(MetaError, match="inconsistent"):   # CTAS_PER_SM is 1 or 2
        HOPPER.decode_meta(raw[:-8] + (3).to_bytes(4, "little") + raw[-4:])
    with pytest.raises(MetaError, match="inconsistent"):   # CLUSTER is 1 or 2
        HOPPER.decode_meta(raw[:-4] + (4).to_bytes(4, "little"))


# --------------------------------------------------------------------------- build + gate


@pytest.fixture(scope="module")
def builder(build_cache_dir):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    with Builder("hopper", cache_dir=build_cache_dir, jobs=2) as b:
        yield b


def _smem_formula(config, problem, space=None) -> int:
    return (space or load_space(HOPPER.space_for(problem))).derive(config, problem)["smem_bytes"]


@needs_nvcc
def test_recommended_configs_compile_clean_and_pass_the_gate(builder):
    jobs = []
    for d, dt, c, s in RECOMMENDED:
        problem = _problem(d, dt, c, s)
        (cfg,) = HOPPER.recommended_configs(problem)
        jobs.append((cfg, problem, builder.submit(cfg, problem)))
    for cfg, problem, fut in jobs:
        result = fut.result()
        assert result.ok, (cfg, problem, result.error)
        log = result.ptxas_log
        report = parse_ptxas(log, HOPPER.entry)
        # ptxas reports spills per function, not per warpgroup path: require none at all
        assert report.spill_stores == 0 and report.spill_loads == 0 and report.stack == 0, (cfg, report)
        assert not re.search(r"\(C751\d\)", log), log
        gate = apply_gate(result, SPACE.gate, family=HOPPER)
        assert gate.passed, (cfg, problem, gate.reason)
        assert result.artifact.meta["smem_bytes"] == _smem_formula(cfg, problem), (cfg, problem)


@needs_nvcc
def test_three_warpgroups_at_d256_are_refused_since_ptxas_cannot_build_them(builder):
    """hopper_wide.toml's `wide_accumulator`: no CONSUMER_WGS=3 config at D=256, and the reason
    holds (ptxas stops, C7602, even at the smallest tile without OVERLAP). D=192 keeps them (the
    gate's spill check decides) and D=256 keeps two warpgroups."""
    from evotuner.config import KernelConfig

    base = dict(BLOCK_N=64, CONSUMER_WGS=3, STAGES=1, REG_PROD=24, REG_CONS=160, OVERLAP=0, PINGPONG=0, SCHED=0,
                RESCALE_LOG2=0, EXP_EMU=0)
    wide = load_space(HOPPER.space_for(_problem(256)))
    cfg = wide.complete(KernelConfig.of(base))
    violated = wide.violated(cfg, _problem(256))
    assert violated is not None and violated.name == "wide_accumulator", violated
    assert wide.violated(cfg, _problem(192)) is None
    assert wide.violated(wide.complete(KernelConfig.of({**base, "CONSUMER_WGS": 2, "REG_CONS": 240})),
                         _problem(256)) is None
    result = builder.submit(cfg, _problem(256)).result()
    assert not result.ok and "C7602" in (result.error or ""), result.error


@needs_nvcc
def test_q_in_registers_builds_clean_at_two_warpgroups_and_is_refused_at_three(builder, tmp_path):
    """Q_IN_REGS=1: at two warpgroups (D=64, 96, 128) the build passes the gate (no spill) and
    S = Q K^T is an RS-wgmma over K-major K (trans-b 0) fed by ldmatrix; the constraint
    `q_in_regs` refuses three warpgroups, and the reason holds (ptxas spills there)."""
    from evotuner.config import KernelConfig

    two = dict(BLOCK_N=128, CONSUMER_WGS=2, STAGES=2, REG_PROD=24, REG_CONS=240, OVERLAP=1, PINGPONG=1, SCHED=2,
               RESCALE_LOG2=8, EXP_EMU=0, TILE_OVERLAP=1, Q_IN_REGS=1)
    three = {**two, "BLOCK_N": 80, "CONSUMER_WGS": 3, "REG_CONS": 160}
    text = HOPPER.default_space().read_text(encoding="utf-8")   # the shipped space, Q_IN_REGS searched
    listed = "[params.Q_IN_REGS]\nvalues = [0]\n"
    assert listed in text
    tiles = "[params.BLOCK_N]\nvalues = [64, 80, 96, 112, 128, 144, 160, 176, 192]\n"   # (under the size limit)
    assert tiles in text
    text = text.replace(tiles, "[params.BLOCK_N]\nvalues = [80, 128]\n")
    (tmp_path / "hopper_q.toml").write_text(text.replace(listed, "[params.Q_IN_REGS]\nvalues = [0, 1]\n"))
    space = load_space(tmp_path / "hopper_q.toml")
    cfg2, cfg3 = space.complete(KernelConfig.of(two)), space.complete(KernelConfig.of(three))
    assert space.violated(cfg2, _problem(128)) is None
    violated = space.violated(cfg3, _problem(128))
    assert violated is not None and violated.name == "q_in_regs", violated
    jobs = [(d, builder.submit(cfg2, _problem(d))) for d in (64, 96, 128)]
    spilled = builder.submit(cfg3, _problem(128))
    for d, fut in jobs:
        result = fut.result()
        assert result.ok, (d, result.error)
        gate = apply_gate(result, space.gate, family=HOPPER)
        assert gate.passed, (d, gate.reason)
    ptx = hopper_ptx(tmp_path, **two)
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.f16\.f16 \{[^}]*\}, \{[^}]*\}, %rd\d+, p, 1, 1, 0;",
                     ptx), "S = Q K^T is not an RS-wgmma over K-major K"
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    report = parse_ptxas(spilled.result().ptxas_log, HOPPER.entry)
    assert report.spill_stores > 0, report


@needs_nvcc
def test_shipped_tuned_rows_compile_clean_and_pass_the_gate(builder):
    """flash_attention serves the shipped rows without a gate of its own: a kernel change that
    makes one spill (SCHED=2's counter reset and the packed-batch walk once spilled 8 bytes in
    a 24-register producer) must fail here, not slow the served kernel silently."""
    from evotuner.tuned import load_shipped, shipped_tables

    jobs = []
    for table in shipped_tables([HOPPER]):
        for row in load_shipped(table).rows:
            heads = max(1, (row.query_rows or row.seqlen_k) // row.seqlen_k)
            problem = Problem(Shape(1, heads, row.seqlen_k, row.seqlen_k, row.head_dim), row.dtype, row.causal)
            space = load_space(HOPPER.space_for(problem))
            cfg = space.complete(row.config)
            jobs.append((row, space, builder.submit(cfg, problem)))
    assert len(jobs) >= 6
    for row, space, fut in jobs:
        result = fut.result()
        assert result.ok, (row.source, result.error)
        gate = apply_gate(result, space.gate, family=HOPPER)
        assert gate.passed, (row.source, str(row.config), gate.reason)


#: What adding the knob FAKE_KNOB (a knob that only sets a macro) to a copy of the family takes,
#: besides the space file's [params.FAKE_KNOB]: instantiate.cuh checks the macro beside the
#: others and #undefs it with them. No other file of kernels/hopper/ changes.
FAKE_KNOB_EDITS = {
    "hopper/instantiate.cuh": [
        ("#if defined(HOPPER_BLOCK_M)",
         "#ifndef HOPPER_FAKE_KNOB\n"
         '#error "HOPPER_FAKE_KNOB is not defined: the space parameter FAKE_KNOB must be #defined (0 or 1)"\n'
         "#endif\n"
         "#if HOPPER_FAKE_KNOB != 0 && HOPPER_FAKE_KNOB != 1\n"
         '#error "HOPPER_FAKE_KNOB must be 0 or 1"\n'
         "#endif\n"
         "#if defined(HOPPER_BLOCK_M)"),
        ("#undef HOPPER_SCHED\n", "#undef HOPPER_SCHED\n#undef HOPPER_FAKE_KNOB\n"),
    ],
}


@needs_nvcc
@pytest.mark.slow
def test_adding_a_parameter_to_the_hopper_family(builder, tmp_path):
    """A knob is the space file's [params.NAME] plus, in kernels/hopper/, its macro's plumbing:
    instantiate.cuh (check, #undef, the traits argument) and traits.cuh (the template parameter),
    before the code that reads ``Traits::k<Name>``. The build stage emits ``#define HOPPER_<NAME>``
    for every space parameter, and the space, the family, export and the production build take
    the name from the space file. Shown on a copy of the family with FAKE_KNOB, which only sets a
    macro and so needs instantiate.cuh alone (FAKE_KNOB_EDITS)."""
    import hashlib

    from evotuner.config import KernelConfig
    from evotuner.header import row_instantiation

    packaged = Path(str(resources.files("evotuner.kernels")))
    root = tmp_path / "kernels"
    shutil.copytree(packaged / "hopper", root / "hopper", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel, edits in FAKE_KNOB_EDITS.items():
        text = (root / rel).read_text()
        for old, new in edits:
            assert text.count(old) == 1, (rel, old)
            text = text.replace(old, new)
        (root / rel).write_text(text)
    changed = sorted(p.relative_to(root).as_posix() for p in (root / "hopper").rglob("*")
                     if p.is_file() and p.read_bytes() != (packaged / p.relative_to(root)).read_bytes())
    assert changed == ["hopper/instantiate.cuh"] and len(changed) <= 2
    space_file = tmp_path / "hopper.toml"
    # (the copy pins CTAS_PER_SM to 1 so that it stays under the size limit with one more knob)
    space_file.write_text(HOPPER.default_space().read_text().replace(
        "\n[derived]\n", '\n[params.FAKE_KNOB]\nvalues = [0, 1]\ndoc = "sets HOPPER_FAKE_KNOB, nothing else"\n\n[derived]\n', 1
    ).replace("[params.CTAS_PER_SM]\nvalues = [1, 2]", "[params.CTAS_PER_SM]\nvalues = [1]", 1))

    # the space and the family take it
    space = load_space(space_file)
    assert space.names == (*SPACE.names, "FAKE_KNOB") and space.fingerprint() != SPACE.fingerprint()
    problem = _problem(64)
    (base,) = HOPPER.recommended_configs(problem)
    config = KernelConfig.of({**base.as_dict(), "FAKE_KNOB": 1})
    space.validate(config)
    assert space.violated(config, problem) is None
    assert "FAKE_KNOB" not in HOPPER.reserved() and math.isfinite(HOPPER.estimate_us(config, problem))
    assert "#define HOPPER_FAKE_KNOB HOPPER_TUNED_0_FAKE_KNOB" in row_instantiation(
        "tuned.h", 0, ("HEAD_DIM", "IS_CAUSAL", "DTYPE", "MAX_SEQLEN", *space.names), HOPPER)

    # the build stage emits its #define; the kernel compiles with it, and without it refuses
    with Builder(HOPPER, arch=space.arch, kernels_root=root, cache_dir=tmp_path / "cache", jobs=1) as b:
        assert re.search(r"^#define HOPPER_FAKE_KNOB\s+1$", b.source(config, problem), re.M)
        result = b.build(config, problem)
        missing = b.build(base, problem)
    assert result.ok, result.error
    assert apply_gate(result, space.gate, family=HOPPER).passed
    assert not missing.ok and "HOPPER_FAKE_KNOB is not defined" in (missing.error or "")
    # a knob that only sets a macro changes nothing in the kernel: the packaged family's cubin
    plain = builder.build(base, problem)
    assert plain.ok and result.artifact.meta == plain.artifact.meta
    assert hashlib.sha256(result.artifact.cubin.read_bytes()).hexdigest() == plain.artifact.sha256


SAMPLE = [  # (head dim, causal, knobs): SCHED 0/1/2, stages 1..4, every WG count, BLOCK_N off 128, 1 and 2 CTAs
    # per SM, CTA pairs
    (64, True, dict(BLOCK_N=64, CONSUMER_WGS=1, STAGES=4, REG_PROD=24, REG_CONS=256, OVERLAP=0, PINGPONG=0, SCHED=2,
                    RESCALE_LOG2=0, EXP_EMU=0, CTAS_PER_SM=1)),
    (128, True, dict(BLOCK_N=176, CONSUMER_WGS=2, STAGES=1, REG_PROD=32, REG_CONS=232, OVERLAP=1, PINGPONG=0, SCHED=1,
                     RESCALE_LOG2=0, EXP_EMU=0, CTAS_PER_SM=1)),
    # ping-pong off: with it, causal block passing (kernel.cuh causal_skip) costs this 160-register
    # config a 4-byte spill at D=128 causal (kernels/hopper/README.md, item 11)
    (128, True, dict(BLOCK_N=80, CONSUMER_WGS=3, STAGES=3, REG_PROD=32, REG_CONS=160, OVERLAP=1, PINGPONG=0, SCHED=2,
                     RESCALE_LOG2=8, EXP_EMU=0, CTAS_PER_SM=1)),
    # two CTAs per SM: __launch_bounds__(256, 2) caps ptxas at 128 registers, which setmaxnreg
    # splits 24 / 232; 2 x 82 KiB of shared memory
    (128, True, dict(BLOCK_N=64, CONSUMER_WGS=1, STAGES=2, REG_PROD=24, REG_CONS=232, OVERLAP=1, PINGPONG=0, SCHED=1,
                     RESCALE_LOG2=8, EXP_EMU=0, CTAS_PER_SM=2)),
    (64, True, dict(BLOCK_N=128, CONSUMER_WGS=1, STAGES=3, REG_PROD=24, REG_CONS=232, OVERLAP=1, PINGPONG=0, SCHED=0,
                    RESCALE_LOG2=0, EXP_EMU=0, CTAS_PER_SM=2)),
    # CTA pairs sharing K/V loads (CLUSTER=2, non-causal only): D 64 (one panel: the pair's first
    # CTA loads it all), 128 with an odd BLOCK_N, 256 (hopper_wide.toml), SCHED 0 and 1
    (64, False, dict(BLOCK_N=128, CONSUMER_WGS=2, STAGES=3, REG_PROD=24, REG_CONS=240, OVERLAP=1, PINGPONG=1, SCHED=0,
                     RESCALE_LOG2=8, EXP_EMU=0, CTAS_PER_SM=1, CLUSTER=2)),
    (128, False, dict(BLOCK_N=176, CONSUMER_WGS=2, STAGES=2, REG_PROD=24, REG_CONS=240, OVERLAP=1, PINGPONG=1,
                      SCHED=0, RESCALE_LOG2=8, EXP_EMU=0, CTAS_PER_SM=1, CLUSTER=2)),
    (128, False, dict(BLOCK_N=128, CONSUMER_WGS=2, STAGES=2, REG_PROD=24, REG_CONS=240, OVERLAP=1, PINGPONG=1,
                      SCHED=1, RESCALE_LOG2=0, EXP_EMU=0, CTAS_PER_SM=1, CLUSTER=2)),
    (256, False, dict(BLOCK_N=80, CONSUMER_WGS=2, STAGES=2, REG_PROD=24, REG_CONS=240, OVERLAP=1, PINGPONG=1, SCHED=0,
                      RESCALE_LOG2=8, EXP_EMU=0, CLUSTER=2)),
    (256, False, dict(BLOCK_N=64, CONSUMER_WGS=2, STAGES=1, REG_PROD=24, REG_CONS=240, OVERLAP=1, PINGPONG=1, SCHED=1,
                      RESCALE_LOG2=8, EXP_EMU=0, CLUSTER=2)),
]


@needs_nvcc
@pytest.mark.parametrize("d, causal, knobs", SAMPLE)
def test_space_smem_formula_equals_the_cubins_meta_table(builder, d, causal, knobs):
    """The cubin's meta table echoes every knob (a knob left out at the family default) and its
    smem_bytes is the space's formula; the gate passes it (no spill, the launch register cap).
    A CTA pair's config (offered by a space listing CLUSTER [1, 2], not by the packaged ones) is
    refused by that space at a causal problem, before any build."""
    from evotuner.config import KernelConfig
    cfg, problem = KernelConfig.of(knobs), _problem(d, "bf16", causal)
    paired = knobs.get("CLUSTER", 1) > 1
    space = with_pairs(HOPPER.space_for(problem)) if paired else load_space(HOPPER.space_for(problem))
    assert space.violated(cfg, problem) is None
    if paired:
        with pytest.raises(SpaceError, match="CLUSTER=2 is outside"):      # the packaged spaces do not search it
            load_space(HOPPER.space_for(problem)).violated(cfg, problem)
        assert space.violated(cfg, _problem(d, "bf16", True)).name == "cluster"
    result = builder.build(cfg, problem)
    assert result.ok, result.error
    meta = result.artifact.meta
    assert meta["smem_bytes"] == _smem_formula(cfg, problem, space)
    assert meta["block_m"] == 64 * knobs["CONSUMER_WGS"] and meta["threads"] == 128 * (knobs["CONSUMER_WGS"] + 1)
    assert all(meta[f] == knobs.get(p, HOPPER.optional_params.get(p)) for p, f in HOPPER.echoed.items())
    report = parse_ptxas(result.ptxas_log, HOPPER.entry)
    assert report.spill_stores == 0 and report.spill_loads == 0 and report.stack == 0, report
    gate = apply_gate(result, space.gate, family=HOPPER)       # incl. "Used N" == the launch cap
    assert gate.passed, gate.reason


#: TILE_OVERLAP=1: the three-, two- and one-warpgroup tiles
OVERLAP_SAMPLE = [
    (128, dict(BLOCK_N=80, CONSUMER_WGS=3, REG_CONS=160, PINGPONG=1, SCHED=2)),
    (128, dict(BLOCK_N=128, CONSUMER_WGS=2, REG_CONS=240, PINGPONG=1, SCHED=1)),
    (64, dict(BLOCK_N=128, CONSUMER_WGS=1, REG_CONS=256, PINGPONG=0, SCHED=2)),
]


@needs_nvcc
@pytest.mark.parametrize("d, knobs", OVERLAP_SAMPLE)
def test_tile_overlap_builds_clean_and_its_smem_is_the_spaces(builder, d, knobs):
    """Cross-tile pipelining compiles with no spill and no wgmma serialization note (the gate),
    its cubin's smem is the space's formula (a second Q tile and its two barriers), and the
    space refuses it with SCHED 0 or causal, before any build."""
    from evotuner.config import KernelConfig
    space = SPACE
    base = dict(STAGES=2, REG_PROD=24, OVERLAP=1, RESCALE_LOG2=8, EXP_EMU=0, CTAS_PER_SM=1, CLUSTER=1, PACK_GQA=0)
    cfg, plain = KernelConfig.of({**base, **knobs, "TILE_OVERLAP": 1}), KernelConfig.of({**base, **knobs})
    problem = _problem(d, "bf16", False)
    assert space.violated(cfg, problem) is None
    assert space.violated(cfg, _problem(d, "bf16", True)).name == "tile_overlap"
    assert space.violated(KernelConfig.of({**cfg.as_dict(), "SCHED": 0}), problem).name == "tile_overlap"
    result, without = builder.build(cfg, problem), builder.build(plain, problem)
    assert result.ok and without.ok, result.error or without.error
    meta = result.artifact.meta
    assert meta["smem_bytes"] == _smem_formula(cfg, problem, space)
    assert meta["smem_bytes"] - without.artifact.meta["smem_bytes"] == 64 * knobs["CONSUMER_WGS"] * d * 2
    gate = apply_gate(result, space.gate, family=HOPPER)
    assert gate.passed, gate.reason


@needs_nvcc
def test_a_pairs_stage_release_carries_no_cluster_scope_fence(tmp_path):
    """CTA pairs free a K/V stage on both CTAs' barriers with CTA-scope arrivals: a
    `.release.cluster` arrival compiles to MEMBAR.ALL.GPU + ERRBAR each and made the pairs
    2.0-2.3x slower on the H100 (docs/measurements/cluster/README.md). The loads are multicast."""
    ptx = hopper_ptx(tmp_path, CLUSTER=2, SCHED=0)
    assert "mbarrier.arrive.release.cluster" not in ptx
    assert ptx.count("mbarrier.arrive.shared::cluster.b64") >= 2            # K and V stages, remote
    assert ".multicast::cluster" in ptx and ".reqnctapercluster 2, 1, 1" in ptx
    assert "mapa.shared::cluster" not in hopper_ptx(tmp_path, CLUSTER=1, SCHED=0)


# --------------------------------------------------------------------------- gate rules

LOG = ("ptxas info    : Compiling entry function 'hopper_fwd' for 'sm_90a'\n"
       "ptxas info    : Function properties for hopper_fwd\n"
       "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
       "ptxas info    : Used {regs} registers, used 16 barriers\n")
META = dict(abi=2, threads=384, smem_bytes=197760, head_dim=128, is_causal=0, dtype=0, min_blocks=1, block_m=128,
            block_n=128, stages=2, consumer_wgs=2, reg_prod=24, reg_cons=240, overlap=1, pingpong=1, o_box_rows=64,
            sched=1, rescale_log2=8, exp_emu=0)


def _extra(log: str, meta: dict) -> tuple[str, str] | None:
    return HOPPER.extra_gate(log, parse_ptxas(log, "hopper_fwd"), meta, SPACE.gate)


def test_gate_accepts_the_launch_cap_and_rejects_the_familys_faults():
    assert _extra(LOG.format(regs=168), META) is None
    check, reason = _extra(LOG.format(regs=168), {**META, "reg_prod": 32})
    assert check == "register_pool" and "128*(REG_PROD=32" in reason and "lower REG_CONS" in reason
    serial = LOG.format(regs=168) + ("ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async "
                                     "instructions are serialized due to the presence of Extern calls\n")
    check, reason = _extra(serial, META)
    assert check == "wgmma_serialized" and "C7512" in reason
    check, reason = _extra(LOG.format(regs=154), META)
    assert check == "launch_registers" and "154" in reason and "168" in reason


# --------------------------------------------------------------------------- launch packing


def _view(shape, strides=None, ptr=0x7F0000000000):
    if strides is None:
        strides = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    return TensorView(ptr, tuple(shape), tuple(strides))


def _args(B=3, H=5, Sq=97, Sk=513, D=128, workspace=0, lse=True, Hkv=None):
    Hkv = H if Hkv is None else Hkv
    q, k = _view((B, H, Sq, D)), _view((B, Hkv, Sk, D), ptr=0x7F1000000000)
    return AttentionArgs(q=q, k=k, v=_view((B, Hkv, Sk, D), ptr=0x7F2000000000), o=_view((B, H, Sq, D), ptr=0x7F3000000000),
                         lse=_view((B, H, Sq), ptr=0x7F4000000000) if lse else None, dtype="bf16", scale=0.125,
                         workspace=workspace)


@pytest.fixture
def fake_maps(monkeypatch):
    calls = []

    def encode(ptr, shape, strides, dtype, rows, panels, *, name="tensor"):
        HP.check_tma_view(name, ptr, shape, strides)
        calls.append((name, ptr, shape, rows, panels))
        return bytes([len(calls)]) * 128

    monkeypatch.setattr("evotuner.kernels.hopper.family.encode_tensor_map", encode)
    return calls


def test_gqa_launch_maps_k_and_v_with_their_own_heads_and_passes_the_group(fake_maps):
    spec = HOPPER.launch({**META, "sched": 0}, _args(H=8, Hkv=2), DeviceInfo(index=0, sm_count=132))
    p = HP.Params.from_buffer_copy(spec.args[0])
    assert p.heads == 8 and p.kv_group == 4 and spec.grid[1] == 8
    assert [c[2][1] for c in fake_maps] == [8, 2, 2, 8]          # q, k, v, o heads in their maps


def test_the_binder_rebinds_hopper_params_around_the_maps(fake_maps, monkeypatch):
    """The hot path's binder on the hopper family's real Params: the (fake) maps here encode
    the pointer as a raw field, the lse and tile counter are raw pointers."""
    from evotuner.runtime.binder import ArgBinder

    def maps(ptr, shape, strides, dtype, rows, panels, *, name="tensor"):
        return struct.pack("<QQ", 0xAB, ptr) + bytes(112)

    monkeypatch.setattr("evotuner.kernels.hopper.family.encode_tensor_map", maps)

    def make(ptrs):
        a = _args(workspace=ptrs["workspace"])
        a = AttentionArgs(**{**a.__dict__, **{n: _view(getattr(a, n).shape, ptr=ptrs[n]) for n in "qkvo"},
                             "lse": _view(a.lse.shape, ptr=ptrs["lse"])})
        return HOPPER.launch({**META, "sched": 2}, a, DeviceInfo(index=0, sm_count=132)).args[0]

    base = {"q": 0x7F0000000000, "k": 0x7F1000000000, "v": 0x7F2000000000, "o": 0x7F3000000000,
            "lse": 0x7F4000000000, "workspace": 0x7F5000000000}
    binder = ArgBinder.derive(make, base)
    assert binder is not None and len(binder.fields) == 6
    moved = {r: p + 0x100 * (i + 1) for i, (r, p) in enumerate(base.items())}
    assert binder.bind(moved) == make(moved)


def test_launch_packs_params_and_grid_per_scheduler(fake_maps):
    dev = DeviceInfo(index=0, sm_count=132)
    spec = HOPPER.launch({**META, "sched": 0}, _args(), dev)
    assert spec.grid == (math.ceil(97 / 128), 5, 3) and spec.block == (384, 1, 1) and spec.smem_bytes == 197760
    p = HP.Params.from_buffer_copy(spec.args[0])
    assert len(spec.args) == 1 and len(spec.args[0]) == 640
    assert (p.batch, p.heads, p.seqlen_q, p.seqlen_k) == (3, 5, 97, 513) and p.lse == 0x7F4000000000
    assert p.scale_log2 == pytest.approx(0.125 * math.log2(math.e)) and not p.tile_counter and p.kv_group == 1
    assert bytes(p.tm_q) == b"\x01" * 128 and bytes(p.tm_o) == b"\x04" * 128
    assert [(c[0], c[3], c[4]) for c in fake_maps] == [("q", 128, 2), ("k", 128, 2), ("v", 128, 2), ("o", 64, 1)]
    # persistent: one CTA per SM at most, or one per tile when there are fewer tiles
    assert HOPPER.launch({**META, "sched": 1}, _args(), dev).grid == (1 * 5 * 3, 1, 1)
    assert HOPPER.launch({**META, "sched": 1}, _args(B=16, H=16, Sq=2048), dev).grid == (132, 1, 1)
    assert HOPPER.workspace_bytes({**META, "sched": 1}) == 0 and HOPPER.workspace_bytes({**META, "sched": 2}) == 4
    spec = HOPPER.launch({**META, "sched": 2}, _args(workspace=0x7F5000000000), dev)
    assert HP.Params.from_buffer_copy(spec.args[0]).tile_counter == 0x7F5000000000
    with pytest.raises(Exception, match="tile counter"):
        HOPPER.launch({**META, "sched": 2}, _args(workspace=0), dev)
    assert HP.Params.from_buffer_copy(HOPPER.launch(META, _args(lse=False), dev).args[0]).lse is None


def test_a_cluster_launch_maps_k_and_v_a_panel_at_a_time_and_launches_whole_pairs(fake_maps):
    dev = DeviceInfo(index=0, sm_count=132)
    meta = {**META, "sched": 0, "cluster": 2}
    spec = HOPPER.launch(meta, _args(Sq=300), dev)                  # 3 query blocks: 2 pairs
    assert spec.grid == (4, 5, 3)
    assert [(c[0], c[3], c[4]) for c in fake_maps] == [("q", 128, 2), ("k", 128, 1), ("v", 128, 1), ("o", 64, 1)]
    assert HOPPER.launch({**meta, "sched": 1}, _args(Sq=300), dev).grid == (2 * 2 * 5 * 3, 1, 1)
    assert HOPPER.launch({**meta, "sched": 1}, _args(B=16, H=16, Sq=2048), dev).grid == (132, 1, 1)


def test_layouts_tma_cannot_take_are_refused_naming_the_stride(fake_maps):
    ok = {n: getattr(_args(), n) for n in "qkvo"}
    assert HOPPER.unsupported_views(ok) is None
    bshd = _view((2, 4, 33, 64), strides=(33 * 4 * 64, 64, 4 * 64, 1))      # [B, S, H, D] seen as [B, H, S, D]
    assert HOPPER.unsupported_views({**ok, "q": bshd}) is None
    padded = _view((2, 4, 33, 64), strides=(4 * 40 * 72, 40 * 72, 72, 1))    # rows of 72 elements = 144 B: fine
    assert HOPPER.unsupported_views({**ok, "k": padded}) is None
    bad_row = _view((2, 4, 33, 64), strides=(4 * 40 * 72, 40 * 72, 68, 1))   # 136 B is not a multiple of 16
    why = HOPPER.unsupported_views({**ok, "k": bad_row})
    assert why and why.startswith("k: row (S) stride 68 elements (136 B)")
    bad_head = _view((2, 4, 33, 64), strides=(4 * 33 * 64 + 8, 33 * 64 + 4, 64, 1))
    assert "head stride" in HOPPER.unsupported_views({**ok, "v": bad_head})
    with pytest.raises(HP.TmaStrideError, match="row \\(S\\) stride 68"):
        HOPPER.launch(META, AttentionArgs(**{**_args().__dict__, "k": bad_row}), DeviceInfo(0, 132))
    assert "not 16-byte aligned" in HOPPER.unsupported_views({**ok, "o": _view((2, 4, 33, 64), ptr=0x7F0000000008)})


# --------------------------------------------------------------------------- replayed search + export


@pytest.fixture
def env(monkeypatch, build_cache_dir):
    monkeypatch.delenv(cli.STORAGE_ENV, raising=False)
    monkeypatch.setenv("EVOTUNER_CACHE_DIR", str(build_cache_dir))


def test_synthetic_fixture_says_it_is_synthetic():
    sidecar = json.loads(SYNTHETIC.with_name(SYNTHETIC.name + ".json").read_text())
    assert sidecar["synthetic"] is True and sidecar["device"]["name"].startswith("SYNTHETIC")
    assert "NOT" in sidecar["note"] and "measurements" in sidecar["note"]


def test_replayed_search_resume_and_export_compile(capsys, tmp_path, env):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    code, out, err = run(capsys, "search", "--study", "h", "--shape", "B=16,H=16,S=2048,D=64", "--space", SMALL,
                         "--trials", 6, "--replay", SYNTHETIC, "--storage", db)
    assert code == 0, err
    code, out, err = run(capsys, "resume", "--study", "h", "--trials", 10, "--replay", SYNTHETIC, "--storage", db)
    assert code == 0, err
    code, out, err = run(capsys, "show", "--study", "h", "--json", "--storage", db)
    assert code == 0, err
    shown = json.loads(out)
    assert set(shown["best"]["params"]) == set(load_space(SMALL).names)
    header = tmp_path / "tuned.h"
    code, out, err = run(capsys, "export", "--study", "h", "--output", header, "--storage", db)
    assert code == 0, err
    text = header.read_text()
    assert "namespace hopper::tuned {" in text and "#define HOPPER_TUNED_COUNT 1" in text
    assert "HOPPER_TUNED_0_CONSUMER_WGS" in text
    src = tmp_path / "use.cpp"
    src.write_text('#include "tuned.h"\nint main() {\n  const auto* h = hopper::tuned::select(64, 0, false, 2048, 16LL * 16 * 2048);\n'
                   "  return h != nullptr ? 0 : 1;\n}\n")
    build = subprocess.run([*_host_compiler(), str(src), "-I", str(tmp_path), "-o", str(tmp_path / "use")],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    assert subprocess.run([str(tmp_path / "use")], timeout=30).returncode == 0


def test_flash_attention_chooses_hopper_where_it_is_recommended_and_falls_back_saying_why():
    attention = pytest.importorskip("evotuner.runtime.attention")
    for d, dt, c, s in RECOMMENDED:
        choice = attention.choose(_problem(d, dt, c, s))
        assert choice.family == "hopper" and choice.config == HOPPER.recommended_configs(_problem(d, dt, c, s))[0]
    d32 = attention.choose(_problem(32))
    assert d32.family == "flashcore" and "hopper: " in d32.why and "D=32" in d32.why
    refused = attention.choose(_problem(64), exclude={"hopper": "k: row (S) stride 68 elements (136 B) ..."})
    assert refused.family == "flashcore" and "row (S) stride 68" in refused.why
    assert attention.choose(_problem(64), family="flashcore").family == "flashcore"


def test_tensor_map_encoding_follows_params_h_and_is_cached(monkeypatch):
    """cuTensorMapEncodeTiled's arguments (a stand-in for the driver records them): rank 5,
    dims {64, S, D/64, H, B}, byte strides {ss*2, 128, sh*2, sb*2} (extent-1 dims take the row
    stride), box {64, rows, panels, 1, 1}, SWIZZLE_128B, L2_256B, a 128-B aligned map."""
    calls = []

    def fake(addr, dtype, rank, base, dims, strides, box, estr, interleave, swizzle, l2, oob):
        calls.append(dict(aligned=addr.value % 128 == 0, dtype=dtype, rank=rank, base=base.value, dims=list(dims[:5]),
                          strides=list(strides[:4]), box=list(box[:5]), estr=list(estr[:5]),
                          enums=(interleave, swizzle, l2, oob)))
        ctypes.memmove(addr.value, bytes(range(128)), 128)
        return 0

    monkeypatch.setattr(HP, "_encode_fn", fake)
    monkeypatch.setattr(HP, "_cache", type(HP._cache)())
    view = (0x7F0000000000, (2, 3, 97, 128), (97 * 3 * 128, 128, 3 * 128, 1))    # a [B, S, H, D] tensor
    data = HP.encode_tensor_map(*view, "bf16", 128, 2, name="q")
    assert data == bytes(range(128))
    assert calls == [dict(aligned=True, dtype=9, rank=5, base=0x7F0000000000, dims=[64, 97, 2, 3, 2],
                          strides=[3 * 128 * 2, 128, 128 * 2, 97 * 3 * 128 * 2], box=[64, 128, 2, 1, 1],
                          estr=[1] * 5, enums=(0, 3, 3, 0))]
    assert HP.encode_tensor_map(*view, "bf16", 128, 2, name="q") == data and len(calls) == 1   # cached
    HP.encode_tensor_map(*view, "bf16", 64, 1, name="o")                                      # another box
    HP.encode_tensor_map(0x7F0000000000, (1, 1, 5, 64), (999, 999, 64, 1), "fp16", 64, 1, name="o")
    assert len(calls) == 3 and calls[2]["dtype"] == 6 and calls[2]["strides"] == [128, 128, 128, 128]
    with pytest.raises(HP.TmaStrideError, match="q: row \\(S\\) stride 68"):
        HP.encode_tensor_map(0x7F0000000000, (1, 1, 5, 64), (340, 340, 68, 1), "fp16", 64, 1, name="q")
