"""The ctypes mirror of flashcore::Params matches params.h, and the shared ABI
(kernels/evotuner_abi.h) matches its one Python mirror, evotuner/abi.py.

A tiny host program including kernels/flashcore/params.h prints sizeof/offsetof
of every field and the value of every meta macro (compiled with g++, or nvcc
-x c++ when there is no g++); the test compares them with the Python side.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from evotuner import abi as A
from evotuner.kernels.flashcore import params as P

PARAMS_H = Path(str(resources.files("evotuner.kernels"))) / "flashcore" / "params.h"
ABI_H = PARAMS_H.parent.parent / A.ABI_HEADER
#: Every macro whose value the host program prints.
MACROS = (re.findall(r"#define\s+(EVOTUNER_\w+)\s+\d+", ABI_H.read_text())
          + re.findall(r"#define\s+(FLASHCORE_(?:META_\w+|ABI_VERSION))\s", PARAMS_H.read_text()))


def _field_names(text: str) -> list[str]:
    """Field names of struct Params, in declaration order, parsed from the header."""
    body = re.search(r"struct\s+Params\s*\{(.*?)\};", text, re.S)
    assert body, "struct Params not found in params.h"
    code = re.sub(r"//[^\n]*|/\*.*?\*/", "", body.group(1), flags=re.S)
    names: list[str] = []
    for decl in filter(None, (d.strip() for d in code.split(";"))):
        # "const void* q" / "int64_t q_batch_stride, q_head_stride, q_row_stride"
        m = re.match(r"(?:const\s+)?\w+\s*\*?\s*(.*)", decl, re.S)
        assert m, decl
        names += [n.strip().lstrip("*").strip() for n in m.group(1).split(",")]
    return names


def _compiler() -> list[str]:
    gxx = shutil.which("g++") or shutil.which("c++")
    if gxx:
        return [gxx, "-std=c++17", "-x", "c++"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        return [nvcc, "-std=c++17", "-x", "c++"]
    pytest.fail("neither g++ nor nvcc is on PATH: the ABI test needs a host C++ compiler")


@pytest.fixture(scope="module")
def host_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, int]]:
    names = _field_names(PARAMS_H.read_text())
    lines = [
        "#include <cstddef>",
        "#include <cstdio>",
        '#include "flashcore/params.h"',
        "int main() {",
        '  std::printf("sizeof %zu %zu\\n", sizeof(flashcore::Params), alignof(flashcore::Params));',
    ]
    for n in names:
        lines.append(f'  std::printf("{n} %zu %zu\\n", offsetof(flashcore::Params, {n}), '
                     f"sizeof(((flashcore::Params*)0)->{n}));")
    for macro in MACROS:
        lines.append(f'  std::printf("{macro} %d 0\\n", (int)({macro}));')
    lines += ["  return 0;", "}"]
    tmp = tmp_path_factory.mktemp("abi")
    src, exe = tmp / "abi.cpp", tmp / "abi"
    src.write_text("\n".join(lines) + "\n")
    cmd = _compiler() + [str(src), "-I", str(PARAMS_H.parent.parent), "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    out: dict[str, tuple[int, int]] = {}
    for line in run.stdout.splitlines():
        key, a, b = line.split()
        out[key] = (int(a), int(b))
    return out


def test_every_header_field_is_mirrored_in_order(host_layout: dict[str, tuple[int, int]]) -> None:
    header = _field_names(PARAMS_H.read_text())
    mirrored = [name for name, _ in P.Params._fields_]
    assert mirrored == header


def test_offsets_and_sizes_match_the_compiled_header(host_layout: dict[str, tuple[int, int]]) -> None:
    for name, ctype in P.Params._fields_:
        offset, size = host_layout[name]
        assert getattr(P.Params, name).offset == offset, name
        assert ctypes.sizeof(ctype) == size, name


def test_struct_size_and_alignment(host_layout: dict[str, tuple[int, int]]) -> None:
    size, align = host_layout["sizeof"]
    assert ctypes.sizeof(P.Params) == size
    assert ctypes.alignment(P.Params) == align


def test_common_meta_indices_match_the_shared_header(host_layout: dict[str, tuple[int, int]]) -> None:
    macros = {k: v for k, (v, _) in host_layout.items() if k.startswith("EVOTUNER_META_")}
    assert macros.pop("EVOTUNER_META_COMMON_LEN") == A.COMMON_LEN
    assert {f"EVOTUNER_META_{name.upper()}": i for i, name in enumerate(A.COMMON_FIELDS)} == macros
    assert host_layout["EVOTUNER_ABI_VERSION"][0] == A.ABI_VERSION
    assert host_layout["EVOTUNER_DTYPE_FP16"][0] == A.DTYPE_CODES["fp16"]
    assert host_layout["EVOTUNER_DTYPE_BF16"][0] == A.DTYPE_CODES["bf16"]


def test_flashcore_meta_indices_match_its_header(host_layout: dict[str, tuple[int, int]]) -> None:
    macros = {k: v for k, (v, _) in host_layout.items() if k.startswith("FLASHCORE_META_")}
    fields = A.meta_fields(P.META_FIELDS)
    assert macros.pop("FLASHCORE_META_LEN") == len(fields)
    assert {f"FLASHCORE_META_{name.upper()}": i for i, name in enumerate(fields)} == macros
    assert host_layout["FLASHCORE_ABI_VERSION"][0] == A.ABI_VERSION


def test_shared_header_text_matches_abi_module() -> None:
    # The same check from the header's text, so a macro the compiler never sees (#if'd out) still counts.
    fields, length, version = A.header_layout(ABI_H.read_text())
    assert fields == {name: i for i, name in enumerate(A.COMMON_FIELDS)}
    assert (length, version) == (A.COMMON_LEN, A.ABI_VERSION)


def test_decode_meta_reads_header_order() -> None:
    values = [A.ABI_VERSION, 128, 49152, 64, 1, 1, 2, 128, 64]
    raw = b"".join(int(x).to_bytes(4, "little", signed=True) for x in values)
    meta = A.decode_meta(raw, P.META_FIELDS)
    assert meta == dict(zip(A.meta_fields(P.META_FIELDS), values))
    assert meta["smem_bytes"] == 49152 and meta["is_causal"] == 1 and meta["block_m"] == 128


def test_decode_meta_rejects_a_short_table_and_a_foreign_abi() -> None:
    with pytest.raises(A.MetaError, match="expected 36"):
        A.decode_meta(b"\x01\x00\x00\x00" * 4, P.META_FIELDS)
    with pytest.raises(A.MetaError, match="ABI version 99"):
        A.decode_meta([99, 128, 0, 64, 0, 0, 1, 128, 64], P.META_FIELDS)
    with pytest.raises(A.MetaError, match="dtype code 7"):
        A.decode_meta([A.ABI_VERSION, 128, 0, 64, 0, 7, 1, 128, 64], P.META_FIELDS)
