"""The production extension (scripts/build_extension.py) with a SCHED=3 row, the last wave split:
its plan() tells the split launch_rules.h plans on the GPU's grid, which must be the Python
rule's (kernels/hopper/launch.py tail_plan, rendered into the C++), and its attention() is right
against fp32 SDPA on fresh inputs, three calls per shape (the per-call memory's counters are
cleared each call, the kernel leaves them at 0), on a side stream, captured in a CUDA graph and
replayed on new inputs. The row's build is checked here without a GPU; the calls need one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from test_export import _GPU_PROBE, REPO, FakeStore, _build_extension_module, summary, trial
from evotuner.export import export_header

#: The three-warpgroup packed tiles of docs/measurements/tail_split (w3_sched3.toml), SCHED 3.
TAIL_ROW = {"BLOCK_N": 80, "CONSUMER_WGS": 3, "STAGES": 2, "REG_PROD": 24, "REG_CONS": 160, "OVERLAP": 1,
            "PINGPONG": 1, "SCHED": 3, "RESCALE_LOG2": 8, "EXP_EMU": 0, "PACK_GQA": 1}


def _header(tmp_path: Path) -> Path:
    header = tmp_path / "tuned.h"
    store = FakeStore(summary("h_tail", [trial(0, 420.0, TAIL_ROW)], s=4096, d=128, rows=(1, 32, 4096),
                              family="hopper"))
    export_header(store, ["h_tail"], header)
    return header


@pytest.mark.slow
def test_a_tail_split_row_builds_into_the_extension(tmp_path: Path) -> None:
    header = _header(tmp_path)
    assert "#define HOPPER_TUNED_0_SCHED 3" in " ".join(header.read_text().split())
    built = _build_extension_module().build(header, tmp_path / "ext", family="hopper", jobs=2)
    assert built.rows == 1 and built.module.is_file()
    assert "#define HOPPER_SCHED HOPPER_TUNED_0_SCHED" in (tmp_path / "ext" / "src" / "row_0.cu").read_text()


_PROBE = _GPU_PROBE.replace("MODULE", "hopper_ext") + r"""
from evotuner.kernels.hopper import launch as L

def inputs(B, H, HKV, Sq, Sk):
    q = torch.randn(B, H, Sq, 128, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, HKV, Sk, 128, device="cuda", dtype=torch.float16) for _ in range(2))
    return q, k, v

def check(q, k, v, o, what):
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.1, enable_gqa=True)
    err = (o.float() - ref).abs().max().item()
    assert err == err and err < 2e-3, (what, err)

split = 0
for B, H, HKV, Sq, Sk, want in CASES:
    q, k, v = inputs(B, H, HKV, Sq, Sk)
    p = f.plan(q, k, v, False, 0.1)
    assert p["row"] == 0 and p["sched"] == 3 and p["launches"], p
    tiles = -(-p["seqlen_q"] // 192) * p["heads"] * B
    plan = L.tail_plan(tiles, p["grid"][0], -(-Sk // 80), L.tail_slots(tiles, 1))
    assert (p["tail_first"], p["tail_parts"]) == (plan["first"], plan["parts"]), (p, plan)
    assert p["scratch_bytes"] == 256 + L.tail_scratch(tiles, 1, 192, 128)["bytes"], p
    if p["grid"][0] == 132:
        assert p["tail_parts"] == want, (B, H, HKV, Sq, Sk, p)
    split += p["tail_parts"] > 1
    for _ in range(3):   # fresh inputs each call
        q, k, v = inputs(B, H, HKV, Sq, Sk)
        check(q, k, v, on_side_stream(q, k, v, False, 0.1), (B, H, HKV, Sq, Sk))
assert split >= 2, split
q, k, v = inputs(1, 32, 8, 4096, 4096)
replays_checked(q, k, v, lambda o: check(q, k, v, o, "graph"))
print("OK")
"""

#: (B, H, HKV, Sq, Sk, parts on 132 SMs): 688 packed tiles with 28 in the last round (4 parts);
#: 144 with 12 (ragged Sq and Sk; 5 parts of its 10 key blocks); 224 with 92 (unpacked): none.
CASES = ((1, 32, 8, 4096, 4096, 4), (3, 9, 3, 1000, 777, 5), (2, 16, 16, 1280, 640, 1))


@pytest.mark.gpu
@pytest.mark.slow
def test_a_tail_split_row_of_the_extension_on_the_gpu(tmp_path: Path) -> None:
    built = _build_extension_module().build(_header(tmp_path), tmp_path / "ext", family="hopper")
    probe = _PROBE.replace("CASES", repr(CASES))
    ran = subprocess.run([sys.executable, "-c", probe, str(built.module.parent)], capture_output=True, text=True,
                         timeout=600, cwd=REPO)
    assert ran.returncode == 0 and ran.stdout.strip() == "OK", (ran.stdout + ran.stderr)[-3000:]
