"""The device fingerprint: what a measurement was taken on.

Recorded once per study (``MeasureStage.device()``), so timings from another
GPU, driver, clock state or toolkit can be told apart. Collected INSIDE the GPU
worker (it imports torch and touches CUDA); the search process only receives
the dict. Every external command runs with a timeout; a piece that cannot be
read is recorded as ``None`` with the reason under ``"unavailable"``.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from typing import Any

#: nvidia-smi fields, in query order (clocks in MHz, power in W, temperature in °C).
SMI_FIELDS = (
    "name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
    "temperature.gpu", "power.draw", "power.limit", "pstate", "persistence_mode",
)
_TIMEOUT_S = 20.0


def collect(device_index: int) -> dict[str, Any]:
    """Fingerprint device ``device_index`` (call only where CUDA may be initialized)."""
    import torch

    unavailable: dict[str, str] = {}
    props = torch.cuda.get_device_properties(device_index)
    fp: dict[str, Any] = {
        "device_index": device_index,
        "name": props.name,
        "sm_count": props.multi_processor_count,
        "compute_capability": f"{props.major}.{props.minor}",
        "total_memory_bytes": int(props.total_memory),
        "l2_cache_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        "smem_per_block_optin": int(getattr(props, "shared_memory_per_block_optin", 0)) or None,
        "uuid": str(getattr(props, "uuid", "")) or None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    try:
        from evotuner.runtime import cuda as driver_api

        v = driver_api.driver_version()
        fp["cuda_driver_api"] = f"{v // 1000}.{(v % 1000) // 10}"
    except Exception as exc:  # the fingerprint records what it can
        fp["cuda_driver_api"] = None
        unavailable["cuda_driver_api"] = str(exc)
    smi, why = nvidia_smi_query(device_index)
    if why:
        unavailable["nvidia_smi"] = why
    fp["driver"] = smi.get("driver_version")
    fp["clocks_at_start"] = {k: smi.get(k) for k in ("clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem")}
    fp["nvidia_smi"] = smi
    fp["nvcc"], why = nvcc_version()
    if why:
        unavailable["nvcc"] = why
    fp["unavailable"] = unavailable
    return fp


def nvidia_smi_query(device_index: int) -> tuple[dict[str, Any], str | None]:
    """({field: value}, None) or ({}, why) — ``nvidia-smi --query-gpu`` with a timeout."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}, "nvidia-smi is not on PATH"
    cmd = [exe, f"--id={device_index}", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {}, f"nvidia-smi did not answer within {_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return {}, f"nvidia-smi could not run ({exc})"
    if out.returncode != 0:
        return {}, f"nvidia-smi exit status {out.returncode}: {out.stderr.strip()[:200]}"
    return parse_smi_line(out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""), None


def parse_smi_line(line: str) -> dict[str, Any]:
    """One ``--format=csv,noheader,nounits`` line → {field: number | str | None}."""
    values = [v.strip() for v in line.split(",")]
    parsed: dict[str, Any] = {}
    for key, raw in zip(SMI_FIELDS, values):
        if raw in ("", "[N/A]", "N/A", "[Not Supported]"):
            parsed[key] = None
            continue
        try:
            number = float(raw)
            parsed[key] = int(number) if number.is_integer() else number
        except ValueError:
            parsed[key] = raw
    return parsed


def nvcc_version() -> tuple[str | None, str | None]:
    """(release, None) of the nvcc the build stage uses (``evotuner.compiler.nvcc``: the same
    search order, $EVOTUNER_NVCC first), or (None, why)."""
    from evotuner.compiler.nvcc import find_nvcc, probe
    from evotuner.errors import EvotunerError

    try:
        return probe(find_nvcc()).release, None
    except EvotunerError as exc:
        return None, exc.message
