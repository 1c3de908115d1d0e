"""Parsers of compute-sanitizer logs and ncu raw CSV pages, on REAL outputs saved from an
H100 (tests/data/tools/README.md says how they were made), plus the tool commands and the
ragged shapes `evotuner check` runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from evotuner.diagnose import ragged_shapes
from evotuner.problem import Problem, Shape
from evotuner.tools import ProfilerPermissionError, ToolError, ToolMissingError, find_tool, ncu, sanitizer

DATA = Path(__file__).parent / "data" / "tools"


def _log(name: str) -> str:
    return (DATA / "sanitizer" / f"{name}.log").read_text()


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
@pytest.mark.parametrize("cfg", ["clean_nc", "clean_c"])
def test_clean_configs_pass(tool: str, cfg: str) -> None:
    r = sanitizer.parse_log(_log(f"{tool}_{cfg}"), tool)
    assert r.passed and r.complete and r.errors == 0 and r.warnings == 0 and not r.findings and not r.app_failed


def test_memcheck_reports_the_planted_out_of_bounds_write() -> None:
    r = sanitizer.parse_log(_log("memcheck_fault1"), "memcheck")
    assert not r.passed and r.complete and r.app_failed
    assert r.errors == 4                                   # "ERROR SUMMARY: 4 errors"
    first = r.findings[0]
    assert first.startswith("Invalid __global__ write of size 4 bytes at flashcore_fwd+0xa3a0")
    assert "thread (0,0,0) block (0,0,0)" in first and "is out of bounds" in first
    assert "[2 like it]" in first                         # two blocks wrote at the same place
    assert any("cudaErrorLaunchFailure" in f for f in r.findings)


@pytest.mark.parametrize("tool", ["racecheck", "synccheck"])
def test_a_failed_application_never_passes_even_with_zero_errors(tool: str) -> None:
    r = sanitizer.parse_log(_log(f"{tool}_fault1"), tool)
    assert r.complete and r.errors == 0 and r.app_failed and not r.passed


def test_initcheck_killed_at_the_timeout_is_incomplete_with_its_findings() -> None:
    # (These findings are the --kernel-name filter's artifact, see evotuner.tools.sanitizer.)
    r = sanitizer.parse_log(_log("initcheck_clean_nc"), "initcheck")
    assert not r.complete and not r.passed
    assert r.errors == 20                                  # --print-limit 20 findings before the kill
    assert r.findings[0].startswith("Uninitialized __global__ memory read of size 16 bytes at flashcore_fwd+0x")


def test_a_log_cut_before_its_summary_never_passes() -> None:
    text = "\n".join(line for line in _log("memcheck_clean_nc").splitlines() if "SUMMARY" not in line)
    r = sanitizer.parse_log(text, "memcheck")
    assert not r.complete and not r.passed and r.errors == 0
    assert not sanitizer.parse_log("", "memcheck").passed


def test_racecheck_summary_counts_errors_and_warnings() -> None:
    # The summary line's documented form with hazards (the real clean runs print 0 of each).
    text = _log("racecheck_clean_nc").replace("0 hazards displayed (0 errors, 0 warnings)",
                                               "3 hazards displayed (1 error, 2 warnings)")
    r = sanitizer.parse_log(text, "racecheck")
    assert (r.errors, r.warnings, r.passed) == (1, 2, False)


def test_sanitizer_command_keeps_output_off_stdout_and_filters_the_kernel(tmp_path: Path) -> None:
    cmd = sanitizer.command("/x/compute-sanitizer", "racecheck", tmp_path / "l.log", kernel_substring="flashcore_fwd")
    assert cmd[:3] == ["/x/compute-sanitizer", "--tool", "racecheck"]
    assert cmd[cmd.index("--log-file") + 1] == str(tmp_path / "l.log")
    assert cmd[cmd.index("--kernel-name") + 1] == "kns=flashcore_fwd"
    with pytest.raises(ValueError):
        sanitizer.command("cs", "leakcheck", "l", kernel_substring="k")
    # initcheck must see torch's kernels write q/k/v, or every read of them is "uninitialized"
    assert "--kernel-name" not in sanitizer.command("cs", "initcheck", "l", kernel_substring="k")


def test_ncu_figures_of_the_flashcore_kernel() -> None:
    (p,) = ncu.parse_raw_csv((DATA / "ncu" / "flashcore_d64_b16h16s2048.csv").read_text())
    assert p.kernel == "flashcore_fwd" and p.units["gpu__time_duration.sum"] == "ns"
    f = ncu.combine([p])
    assert f["duration_us"] == pytest.approx(1071.616)
    assert (f["achieved_occupancy_pct"], f["theoretical_occupancy_pct"]) == (12.32, 12.5)
    assert f["tensor_pipe_pct"] == 50.54
    assert (f["dram_throughput_pct"], f["l2_throughput_pct"], f["sm_throughput_pct"]) == (7.29, 18.92, 49.02)
    assert (f["smem_bank_conflicts"], f["smem_bank_conflicts_ld"], f["smem_bank_conflicts_st"]) == (58980, 26138, 32828)
    assert (f["registers"], f["smem_per_block"], f["block_size"], f["grid_size"]) == (254, 50176, 128, 4096)
    assert f["top_stalls"] == [["wait", 1.38], ["math_pipe_throttle", 0.43], ["not_selected", 0.35]]
    assert f["kernels"] == 1


def test_ncu_figures_of_sdpa_default_backend_cudnn() -> None:
    (p,) = ncu.parse_raw_csv((DATA / "ncu" / "sdpa_cudnn_d64_b16h16s2048.csv").read_text())
    assert p.kernel.startswith("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16")
    f = ncu.figures(p)
    assert f["registers"] == 168 and f["duration_us"] == pytest.approx(734.432)
    assert f["tensor_pipe_pct"] == 50.03 and f["smem_bank_conflicts"] == 426203
    assert [r for r, _ in f["top_stalls"]] == ["barrier", "wait", "long_scoreboard"]


def test_ncu_permission_error_names_the_missing_permission() -> None:
    # ncu's documented message (the capture ran as root with RmProfilingAdminOnly=0, so it has none).
    text = ("==PROF== Connected to process 4242 (/usr/bin/python3.12)\n"
            "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
            "Counters on the target device 0. For instructions on enabling permissions and to get more "
            "information see https://developer.nvidia.com/ERR_NVGPUCTRPERM\n"
            "==PROF== Disconnected from process 4242\n")
    with pytest.raises(ProfilerPermissionError, match="ERR_NVGPUCTRPERM") as info:
        ncu.parse_raw_csv(text)
    assert "NVreg_RestrictProfilingToAdminUsers" in str(info.value)


def test_ncu_without_a_profiled_kernel_or_with_an_error() -> None:
    with pytest.raises(ToolError, match="profiled no kernel"):
        ncu.parse_raw_csv("==PROF== Connected to process 1\n==WARNING== No kernels were profiled.\n")
    with pytest.raises(ToolError, match="Failed to connect"):
        ncu.parse_raw_csv("==ERROR== Failed to connect to process 1.\n")


def test_ncu_command(tmp_path: Path) -> None:
    cmd = ncu.command("ncu", tmp_path / "n.log")
    for flag in ("--profile-from-start", "--csv", "--log-file", "--metrics"):
        assert flag in cmd
    assert cmd[cmd.index("--page") + 1] == "raw" and cmd[cmd.index("--print-units") + 1] == "base"


def test_missing_tool_names_itself(monkeypatch, tmp_path: Path) -> None:
    import evotuner.tools as tools

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(tools, "CUDA_ROOTS", ())
    with pytest.raises(ToolMissingError, match="compute-sanitizer not found on PATH"):
        find_tool("compute-sanitizer", "EVOTUNER_TEST_NO_SUCH_VAR")
    monkeypatch.setenv("EVOTUNER_TEST_CS", str(tmp_path / "nope"))
    with pytest.raises(ToolMissingError, match="EVOTUNER_TEST_CS="):
        find_tool("compute-sanitizer", "EVOTUNER_TEST_CS")


@pytest.mark.parametrize("bm,bn", [(128, 64), (64, 32), (128, 128), (64, 16), (16, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_ragged_shapes_have_partial_tiles_on_both_axes(bm: int, bn: int, causal: bool) -> None:
    problem = Problem(Shape(16, 16, 2048, 2048, 64), "fp16", causal)
    shapes = ragged_shapes(problem, {"block_m": bm, "block_n": bn})
    assert len(shapes) == 4
    assert any(sq < sk for _, _, sq, sk in shapes) and any(sq > sk for _, _, sq, sk in shapes)
    for _, _, sq, sk in shapes:
        for n in (sq, sk):
            assert n >= 3 and n % bm and n % bn, (bm, bn, sq, sk)
