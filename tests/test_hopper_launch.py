"""The hopper launch description has one source (kernels/hopper/launch.py):

* the shipped C++ rendering (launch_rules.h) is what gen_launch.py writes from it now;
* the C++ computes what the Python computes, over edge and random inputs (a host program
  built with nvcc -x c++ includes the header and prints every rule's result);
* the enumerators the Python launcher passes are cuda.h's;
* the production extension's row and the dev harness include the header and keep no rule of
  their own (no hand-written dims, strides, box or grid);
* the translator refuses Python it cannot render, naming the line.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from evotuner.compiler.cxx import TranslationError, render
from evotuner.kernels.hopper import gen_launch, launch

KERNELS = Path(str(resources.files("evotuner.kernels")))
HEADER = KERNELS / "hopper" / "extension" / "launch_rules.h"
ROW = KERNELS / "hopper" / "extension" / "hopper_launch_row.cu.in"
DEV_LAUNCHER = Path(__file__).resolve().parent.parent / "scripts" / "hopper_dev" / "launcher.cu"


def test_the_shipped_header_is_what_the_generator_writes():
    assert HEADER.read_text() == gen_launch.generate(), "run `python3 kernels/hopper/gen_launch.py`"


def _cases(seed: int = 0) -> dict[str, list[tuple[int, ...]]]:
    rng = random.Random(seed)
    strides = [0, 1, 8, 12, 64, 68, 128, 4096, 1 << 39, (1 << 39) + 8, 5 * 64 * 97]
    fault = [(base, B, H, D, sb, sh, ss, sd)
             for base in (0x7F0000000000, 0x7F0000000008)
             for B, H in ((1, 1), (1, 4), (3, 1), (2, 8))
             for D in (64, 80, 96, 128)
             for sb, sh, ss in ((rng.choice(strides), rng.choice(strides), rng.choice(strides)) for _ in range(6))
             for sd in (1, 2)]
    fault += [(0x7F0000000000, 1, 1, 64, 12, 12, 64, 1), (0x7F0000000000, 2, 1, 64, 12, 12, 64, 1)]
    view = [(B, H, S, D, sb, sh, ss, rows, panels)
            for B, H in ((1, 1), (4, 1), (1, 8), (2, 32))
            for S in (1, 97, 4096)
            for D in (64, 96, 128, 256)
            for sb, sh, ss in ((S * H * D, S * D, D), (S * H * D, D, H * D))
            for rows, panels in ((128, max(1, D // 64)), (64, 1))]
    box = [(w, bm, bn, ob, D, cl) for w in range(4) for bm, bn, ob in ((128, 176, 64), (64, 128, 32))
           for D in (64, 96, 256) for cl in (1, 2)]
    grid = [(sched, sq, bm, splits, H, B, sms, ctas, cl)
            for sched in (0, 1, 2) for sq in (0, 1, 128, 129, 8192) for bm in (64, 128)
            for splits in (1, 3) for H, B in ((1, 1), (32, 4)) for sms in (0, 1, 132) for ctas in (1, 2)
            for cl in (1, 2)]
    # (S, sh, ss): [B,H,S,D] (packable), [B,S,H,D] (packable only with one row), a padded head stride
    packed = [(S, sh, ss) for S in (1, 17, 4096) for D in (64, 128)
              for sh, ss in ((S * D, D), (D, 8 * D), (S * D + 64, D))]
    # split-KV scratch: ragged tiles, one row, a decode-sized and a prefill-sized problem
    scratch = [(splits, B, H, sq, bm, D) for splits in (2, 3, 32) for B, H in ((1, 1), (4, 32))
               for sq in (1, 17, 4097) for bm in (64, 192) for D in (64, 96, 256)]
    # SCHED 3: tiles below, at and past the grid, ragged last rounds short and long, few key blocks
    tail = [(tiles, g, kb, min(tiles, 132 * c)) for tiles in (1, 100, 132, 133, 144, 688, 1024, 1376, 4096)
            for g in (1, 114, 132, 264) for kb in (1, 2, 3, 9, 52) for c in (1, 2) if g <= 132 * c]
    return {"tma_fault": fault, "tma_view": view, "map_box": box, "launch_grid": grid,
            "legal_stride": [(s,) for s in strides], "packed_row_stride": packed,
            "round256": [(n,) for n in (0, 1, 255, 256, 257, 1 << 40)], "split_scratch": scratch,
            "tail_slots": [(t, c) for t in (1, 133, 300, 5000) for c in (1, 2)],
            "tail_scratch": [(t, c, bm, D) for t in (1, 133, 5000) for c in (1, 2) for bm in (64, 192)
                             for D in (64, 96, 256)],
            "tail_plan": tail}


@pytest.mark.parametrize("sched", [0, 1])
@pytest.mark.parametrize("seqlen_q, heads, batch", [(128, 1, 1), (129, 1, 1), (640, 3, 2), (8192, 32, 4)])
def test_a_cluster_grid_holds_whole_pairs_that_cover_every_query_block(sched, seqlen_q, heads, batch):
    block_m, sms = 128, 132
    m_blocks = -(-seqlen_q // block_m)
    g = launch.launch_grid(sched, seqlen_q, block_m, 1, heads, batch, sms, 1, 2)
    assert g["x"] % 2 == 0                                   # __cluster_dims__(2, 1, 1) needs it
    pairs = -(-m_blocks // 2) * heads * batch               # the kernel's tiles (tile_scheduler.cuh num_tiles)
    if sched == 0:
        assert (g["x"], g["y"], g["z"]) == (2 * -(-m_blocks // 2), heads, batch)
    else:
        assert g["x"] == 2 * min(sms // 2, pairs) and g["x"] <= sms
    one = launch.launch_grid(sched, seqlen_q, block_m, 1, heads, batch, sms, 1, 1)
    assert one == {"x": m_blocks if sched == 0 else min(sms, m_blocks * heads * batch),
                   "y": heads if sched == 0 else 1, "z": batch if sched == 0 else 1}


def test_a_cluster_loads_k_and_v_one_panel_at_a_time():
    for D in (64, 128, 256):
        assert launch.map_box(launch.MAP_Q, 128, 128, 64, D, 2)["panels"] == D // 64
        assert launch.map_box(launch.MAP_K, 128, 128, 64, D, 2)["panels"] == 1
        assert launch.map_box(launch.MAP_V, 128, 128, 64, D, 2)["panels"] == 1
        assert launch.map_box(launch.MAP_K, 128, 128, 64, D, 1)["panels"] == D // 64


def _flatten(value: object) -> list[int]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in (v if isinstance(v, tuple) else (v,))]
    return [int(value)]


def _printer(fn_name: str, result_example: object) -> str:
    if isinstance(result_example, dict):
        parts = [f"r.{k}[{i}]" if isinstance(v, tuple) else f"r.{k}"
                 for k, v in result_example.items() for i in (range(len(v)) if isinstance(v, tuple) else [0])]
    else:
        parts = ["r"]
    return " ".join('std::printf("%lld ", (long long)' + p + ");" for p in parts) + ' std::printf("\\n");'


def test_the_split_scratch_holds_split_cuh_s_regions():
    """split.cuh reads the counters at 0, the LSE partials after the counters' 256-byte-rounded
    bytes and the O partials after the LSE's: the rule's total covers exactly those regions."""
    for splits, B, H, sq, bm, D in ((2, 1, 1, 1, 64, 64), (8, 4, 32, 4097, 192, 128)):
        s = launch.split_scratch(splits, B, H, sq, bm, D)
        counters = B * H * -(-sq // bm) * 4
        lse = B * H * splits * sq * 4
        assert s["counter_bytes"] == -(-counters // 256) * 256 >= counters
        assert s["bytes"] == s["counter_bytes"] + -(-lse // 256) * 256 + lse * D
        assert s["counter_bytes"] % 256 == 0


def test_the_tail_plan_splits_only_a_short_last_round_within_its_slots():
    """SCHED 3 (tile_scheduler.cuh): the last r = tiles mod grid tiles are cut into `parts` parts
    when the idle CTAs can take them, at most TAIL_PARTS, two key blocks a part, every part a
    partial slot; the parts then fit the grid, and split.cuh's regions fit the scratch."""
    cases = {(688, 132, 52): (660, 4), (1024, 132, 32): (1024, 1), (1376, 132, 13): (1320, 2),
             (133, 132, 9): (132, 4), (140, 132, 16): (132, 8), (137, 132, 2): (137, 1), (132, 132, 40): (132, 1),
             (100, 100, 40): (100, 1), (4096, 132, 16): (4092, 8)}
    for (tiles, grid, kb), want in cases.items():
        plan = launch.tail_plan(tiles, grid, kb, launch.tail_slots(tiles, 1))
        assert (plan["first"], plan["parts"]) == want, (tiles, grid, kb, plan)
    for tiles, grid, kb, slots in _cases()["tail_plan"]:
        plan = launch.tail_plan(tiles, grid, kb, slots)
        r = tiles - plan["first"]
        assert 1 <= plan["parts"] <= launch.TAIL_PARTS
        if plan["parts"] > 1:
            assert r == tiles % grid and r * plan["parts"] <= min(grid, slots) and kb // plan["parts"] >= 2
            bm, D = 192, 128
            need = -(-r * 8 * (bm // 16) // 256) * 256 + -(-r * plan["parts"] * bm * 4 // 256) * 256 + r * plan["parts"] * bm * D * 4
            assert need <= launch.tail_scratch(tiles, 2 if slots > 132 else 1, bm, D)["bytes"]
        else:
            assert r == 0
    # the kernel's bound on the parts it combines (traits.cuh kTailParts) is the plan's
    assert f"kTailParts = {launch.TAIL_PARTS};" in (KERNELS / "hopper" / "traits.cuh").read_text()


def test_the_cxx_rules_compute_what_the_python_rules_compute(tmp_path):
    nvcc = shutil.which("nvcc")
    assert nvcc, "nvcc is needed (the build box has it)"
    cases = _cases()
    body = []
    expected = []
    for name, inputs in cases.items():
        fn = getattr(launch, name)
        for args in inputs:
            result = fn(*args)
            expected.append(_flatten(result))
            call = f"hopper_{name}(" + ", ".join(f"INT64_C({a})" for a in args) + ")"
            body.append(f"{{ const auto r = {call}; {_printer(name, result)} }}")
    src = tmp_path / "rules.cpp"
    src.write_text('#include <cstdio>\n#include "hopper/extension/launch_rules.h"\nint main() {\n'
                   + "\n".join(body) + "\nreturn 0; }\n")
    exe = tmp_path / "rules"
    build = subprocess.run([nvcc, "-std=c++17", "-x", "c++", str(src), "-I", str(KERNELS), "-o", str(exe)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    got = [[int(x) for x in line.split()] for line in out]
    assert len(got) == len(expected) > 600
    mismatches = [(i, g, e) for i, (g, e) in enumerate(zip(got, expected)) if g != e]
    assert not mismatches, mismatches[:5]
    # the inputs reach every fault code, so each rule of tma_fault was compared
    codes = {launch.tma_fault(*args) for args in cases["tma_fault"]}
    assert codes == set(range(len(launch.FAULT_SUBJECTS)))


def test_the_enumerators_the_python_launcher_passes_are_cuda_h_s(tmp_path):
    names = sorted(launch.CUDA_ENUMS)
    src = tmp_path / "enums.cpp"
    src.write_text('#include <cuda.h>\n#include "hopper/extension/launch_rules.h"\n'
                   + "".join(f"static_assert(CU_TENSOR_MAP_{n} == {launch.CUDA_ENUMS[n]}, \"{n}\");\n" for n in names)
                   + "static_assert(HOPPER_TMA_SWIZZLE == CU_TENSOR_MAP_SWIZZLE_128B, \"swizzle\");\n"
                   + "int main() { return 0; }\n")
    build = subprocess.run([shutil.which("nvcc"), "-std=c++17", "-x", "c++", str(src), "-I", str(KERNELS),
                            "-o", str(tmp_path / "enums")], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr


@pytest.mark.parametrize("path", [ROW, DEV_LAUNCHER], ids=["extension row", "dev harness"])
def test_the_cxx_launchers_take_their_rules_from_the_header(path):
    text = path.read_text()
    assert '#include "hopper/extension/launch_rules.h"' in text
    for rule in ("hopper_tma_fault(", "hopper_tma_view(", "hopper_map_box(", "hopper_launch_grid("):
        assert rule in text, f"{path.name} does not call {rule}"
    # no hand-written copy of a rule: dims, strides, the swizzle, the grid's ceil-division
    for copy in ("dims[5] = {64", "SWIZZLE_128B", "+ bm - 1", "static_cast<cuuint64_t>(S)", "(H > 1 ? sh : ss)"):
        assert copy not in text, f"{path.name} still spells {copy!r} itself"
    if path == ROW:   # a split-KV row sizes its scratch by the runtime's rule
        assert "hopper_split_scratch(" in text


@pytest.mark.parametrize("source, needle", [
    ("def f(a):\n    return a / 2\n", "not translated"),
    ("def f(a):\n    x = 1\n    x = 2\n    return x\n", "assigned twice"),
    ("def f(a):\n    return 0 < a < 3\n", "one comparison operator"),
    ("def f(a):\n    return a + UNKNOWN\n", "neither a parameter"),
    ("def f(a):\n    if a:\n        return 1\n    return {'x': 1}\n", "same form"),
    ("def f(a, b=1):\n    return a\n", "plain positional"),
    ("def f(a):\n    return -1.5\n", "not a non-negative int64"),
])
def test_the_translator_refuses_what_it_cannot_render(tmp_path, source, needle):
    probe = tmp_path / "probe.py"
    probe.write_text("LIMIT = 7\n" + source)
    import importlib.util
    spec = importlib.util.spec_from_file_location("cxx_probe", probe)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(TranslationError, match=needle) as info:
        render(mod, [mod.f], prefix="t", banner="probe")
    assert "probe.py:" in str(info.value)


def test_module_constants_are_inlined_and_earlier_rules_callable(tmp_path):
    probe = tmp_path / "probe2.py"
    probe.write_text("LIMIT = 7\n"
                     "def g(a):\n    return min(a, LIMIT)\n"
                     "def f(a, b):\n    c = g(a) * 2\n    return {'pair': (c, b if b > 0 else 0), 'one': c % 3}\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("cxx_probe2", probe)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = render(mod, [mod.g, mod.f], prefix="t", banner="probe")
    assert "std::min<int64_t>(a, INT64_C(7))" in text and "t_g(a)" in text
    assert "struct TF {\n    int64_t pair[2];\n    int64_t one;\n};" in text
