"""The ptxas gate: parsing real nvcc 13 reports, every gate check, and a live compile."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from evotuner.compiler.result import Artifact, BuildResult
from evotuner.config import KernelConfig
from evotuner.gate import GateError, GateResult, PtxasReport, apply_gate, parse_ptxas
from evotuner.space import load_space

DATA = Path(__file__).parent / "data" / "ptxas"
NVCC = shutil.which("nvcc")
CFG = KernelConfig.parse("BLOCK_M=128,BLOCK_N=64,NUM_WARPS=4,STAGES=2,MIN_BLOCKS=1")


def log(name: str) -> str:
    return (DATA / f"nvcc13_{name}.log").read_text()


@pytest.fixture(scope="module")
def thresholds():
    return load_space().gate


# --------------------------------------------------------------------------- parsing


def test_parse_clean_report():
    r = parse_ptxas(log("clean"))
    assert (r.entry, r.arch) == ("flashcore_fwd", "sm_90a")
    assert (r.registers, r.spill_stores, r.spill_loads, r.stack, r.static_smem, r.barriers) == (137, 0, 0, 0, 512, 1)
    assert r.dynamic_smem is None and r.smem == 512
    assert r.as_dict() == {"registers": 137, "spill_stores": 0, "spill_loads": 0, "stack": 0, "smem": 512,
                           "barriers": 1}


def test_parse_spilling_report():
    r = parse_ptxas(log("spill"))
    assert (r.registers, r.spill_stores, r.spill_loads, r.stack, r.static_smem) == (32, 476, 500, 256, 4096)
    assert r.spill_bytes == 976


def test_parse_picks_the_entry_among_several_functions():
    text = log("two_entries")
    r = parse_ptxas(text, "flashcore_fwd")
    assert (r.registers, r.stack, r.static_smem, r.barriers) == (64, 192, 1024, 1)
    other = parse_ptxas(text, "other_kernel")
    # other_kernel's own frame is 0 bytes; its non-inlined callee makes the cumulative stack 32
    assert (other.registers, other.stack, other.static_smem, other.barriers) == (14, 32, 0, 0)


def test_parse_several_targets_needs_an_arch():
    text = log("two_archs")
    with pytest.raises(GateError, match=r"compiles 'flashcore_fwd' for 2 targets \(sm_90a, sm_80\).*arch="):
        parse_ptxas(text)
    assert parse_ptxas(text, arch="sm_90a").registers == 137
    sm80 = parse_ptxas(text, arch="sm_80")          # the older line shape: "..., 372 bytes cmem[0]"
    assert (sm80.arch, sm80.registers, sm80.static_smem, sm80.barriers) == ("sm_80", 142, 512, 1)


def test_missing_entry_lists_what_is_there():
    with pytest.raises(GateError) as e:
        parse_ptxas(log("two_entries"), "flashcore_fwd_v2")
    msg = str(e.value)
    assert "no entry function 'flashcore_fwd_v2'" in msg
    assert "flashcore_fwd for sm_90a, other_kernel for sm_90a" in msg
    assert "KernelFamily.entry" in msg
    with pytest.raises(GateError, match="no 'Compiling entry function' line at all"):
        parse_ptxas("nvcc error   : 'ptxas' died due to signal 9")


def test_truncated_report_is_an_error():
    lines = log("clean").splitlines()
    truncated = "\n".join(line for line in lines if "Used" not in line)
    with pytest.raises(GateError, match=r"lacks the 'Used N registers' line"):
        parse_ptxas(truncated)
    no_frame = "\n".join(line for line in lines if "stack frame" not in line)
    with pytest.raises(GateError, match="lacks the stack/spill line"):
        parse_ptxas(no_frame)


# --------------------------------------------------------------------------- the gate


def test_clean_report_passes(thresholds):
    g = apply_gate(parse_ptxas(log("clean")), thresholds, threads=128, min_blocks=2, dynamic_smem=49152)
    assert g == GateResult(True, None, g.report)
    assert g.report.dynamic_smem == 49152 and g.report.smem == 49152 + 512
    assert g.report.as_dict()["smem"] == 49664


def test_spills_fail_with_figures_threshold_and_remedy(thresholds):
    g = apply_gate(parse_ptxas(log("spill")), thresholds, threads=1024, min_blocks=2, dynamic_smem=0)
    assert not g.passed and g.check == "spills"
    assert g.reason == ("spills 976 bytes (stores 476, loads 500) > max_spill_bytes=0:"
                        " reduce BLOCK_M or BLOCK_N, or lower MIN_BLOCKS=2")
    loose = dataclasses.replace(thresholds, max_spill_bytes=976, max_stack_bytes=256)
    assert apply_gate(parse_ptxas(log("spill")), loose, threads=1024, min_blocks=2, dynamic_smem=0).passed


def test_stack_fails(thresholds):
    g = apply_gate(parse_ptxas(log("two_entries"), "flashcore_fwd"), thresholds, threads=128, min_blocks=1, dynamic_smem=0)
    assert g.check == "stack"
    assert g.reason.startswith("stack frame 192 bytes > max_stack_bytes=0: ")
    assert "raise [gate] max_stack_bytes" in g.reason


def test_register_cap_fails(thresholds):
    tight = dataclasses.replace(thresholds, max_registers=128)
    g = apply_gate(parse_ptxas(log("clean")), tight, threads=128, min_blocks=1, dynamic_smem=0)
    assert g.check == "registers"
    assert g.reason.startswith("registers 137 > max_registers=128: ")


def test_registers_per_sm_fail(thresholds):
    # 137 registers are allocated as 144; 144 x 256 threads x 2 blocks = 73728 > 65536
    g = apply_gate(parse_ptxas(log("clean")), thresholds, threads=256, min_blocks=2, dynamic_smem=0)
    assert g.check == "regs_per_sm"
    assert g.reason == ("registers 137 (allocated 144) x threads 256 x MIN_BLOCKS=2 = 73728 > regs_per_sm=65536:"
                        " lower MIN_BLOCKS or NUM_WARPS")
    assert apply_gate(parse_ptxas(log("clean")), thresholds, threads=256, min_blocks=1, dynamic_smem=0).passed


def test_smem_per_block_counts_static_and_dynamic(thresholds):
    report = parse_ptxas(log("clean"))
    g = apply_gate(report, thresholds, threads=128, min_blocks=1, dynamic_smem=232448)
    assert g.check == "smem_per_block"
    assert g.reason == ("smem 232960 bytes (static 512 + dynamic 232448) > max_smem_per_block=232448:"
                        " reduce BLOCK_N or STAGES")
    assert apply_gate(report, thresholds, threads=128, min_blocks=1, dynamic_smem=232448 - 512).passed


def test_smem_per_sm_counts_the_reserved_kilobyte(thresholds):
    report = parse_ptxas(log("clean"))
    # (115712 + 512 + 1024) x 2 = 234496 > 233472, although 2 x 116224 = 232448 would fit without the reserve
    g = apply_gate(report, thresholds, threads=128, min_blocks=2, dynamic_smem=115712)
    assert g.check == "smem_per_sm"
    assert "x MIN_BLOCKS=2 = 234496 > max_smem_per_sm=233472" in g.reason
    assert apply_gate(report, thresholds, threads=128, min_blocks=2, dynamic_smem=115712 - 512).passed


def test_device_limits_can_be_overridden(thresholds):
    small = dataclasses.replace(thresholds.device, max_smem_per_block=1024)
    g = apply_gate(parse_ptxas(log("clean")), thresholds, threads=128, min_blocks=1, dynamic_smem=1024,
                   device_limits=small)
    assert g.check == "smem_per_block" and "max_smem_per_block=1024" in g.reason


def test_a_report_needs_the_launch_geometry(thresholds):
    with pytest.raises(ValueError, match="threads= and min_blocks="):
        apply_gate(parse_ptxas(log("clean")), thresholds)


def test_a_family_words_the_remedies_and_may_judge_a_check_itself(thresholds):
    from evotuner.family import get_family

    flashcore = get_family("flashcore")

    class ConsumerSpills(type(flashcore)):
        """Judges spills itself (say, only on a consumer path) and adds a rule of its own."""

        generic_gate_checks = tuple(c for c in flashcore.generic_gate_checks if c != "spills")

        def gate_hint(self, check, meta):
            return f"family hint for {check}"

        def extra_gate(self, log, report, meta, thresholds):
            if report.spill_stores > 400:
                return ("consumer_spills", f"consumer path spills {report.spill_stores} bytes: lower TILE")
            return None

    fam = ConsumerSpills()
    spill = parse_ptxas(log("spill"))
    assert apply_gate(spill, thresholds, threads=1024, min_blocks=2, dynamic_smem=0).check == "spills"
    roomy_stack = dataclasses.replace(thresholds, max_stack_bytes=10**6)
    g = apply_gate(spill, roomy_stack, threads=128, min_blocks=1, dynamic_smem=0, family=fam)
    assert g.check == "consumer_spills" and "lower TILE" in g.reason
    tight = dataclasses.replace(thresholds, max_registers=16)
    g = apply_gate(parse_ptxas(log("clean")), tight, threads=128, min_blocks=1, dynamic_smem=0, family=fam)
    assert g.check == "registers" and g.reason.endswith("family hint for registers")


# --------------------------------------------------------------------------- from a BuildResult


def build_result(tmp_path: Path, ptxas_log: str, meta: dict[str, int], ok: bool = True) -> BuildResult:
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\x7fELF")
    artifact = Artifact(cubin=cubin, key="k", sha256="0" * 64, meta=meta) if ok else None
    return BuildResult(config=CFG, key="k", ok=ok, artifact=artifact, ptxas_log=ptxas_log, seconds=1.0,
                       cached=False, error=None if ok else "error: boom")


META = {"abi": 1, "threads": 128, "smem_bytes": 98304, "block_m": 128, "block_n": 64, "head_dim": 128,
        "is_causal": 0, "dtype": 0, "min_blocks": 1}


def test_gate_a_build_result_uses_the_artifact_meta(tmp_path, thresholds):
    g = apply_gate(build_result(tmp_path, log("clean"), META), thresholds)
    assert g.passed and g.report.dynamic_smem == 98304 and g.report.smem == 98816
    two_blocks = apply_gate(build_result(tmp_path, log("clean"), {**META, "min_blocks": 2, "smem_bytes": 120000}),
                            thresholds)
    assert two_blocks.check == "smem_per_sm"
    spill = apply_gate(build_result(tmp_path, log("spill"), META), thresholds)
    assert spill.check == "spills" and "lower MIN_BLOCKS" not in spill.reason


def test_gate_refuses_failed_builds_and_incomplete_meta(tmp_path, thresholds):
    with pytest.raises(ValueError, match="build failed"):
        apply_gate(build_result(tmp_path, "", META, ok=False), thresholds)
    meta = {k: v for k, v in META.items() if k != "min_blocks"}
    with pytest.raises(GateError, match=r"k\.cubin: flashcore_meta has no 'min_blocks'"):
        apply_gate(build_result(tmp_path, log("clean"), meta), thresholds)


# --------------------------------------------------------------------------- live nvcc


def compile_probe(tmp_path: Path, *defines: str) -> str:
    out = subprocess.run(
        [NVCC, "-cubin", "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
         *defines, str(DATA / "probe.cu"), "-o", str(tmp_path / "probe.cubin")],
        capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout + out.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
def test_live_nvcc_report_is_parsed_and_gated(tmp_path, thresholds):
    clean = parse_ptxas(compile_probe(tmp_path))
    assert clean.arch == "sm_90a" and clean.spill_bytes == 0 and 64 < clean.registers <= 255
    assert apply_gate(clean, thresholds, threads=128, min_blocks=1, dynamic_smem=0).passed

    spilling = parse_ptxas(compile_probe(tmp_path, "-DNT=1024", "-DMINB=2"))
    assert spilling.registers <= 32 and spilling.spill_stores > 0 and spilling.spill_loads > 0
    g = apply_gate(spilling, thresholds, threads=1024, min_blocks=2, dynamic_smem=0)
    assert not g.passed and g.check == "spills"
    assert g.reason.startswith(f"spills {spilling.spill_bytes} bytes (stores {spilling.spill_stores}, ")
    assert isinstance(g.report, PtxasReport)
