#!/usr/bin/env python3
"""Build the production extension of one kernel family from an exported header.

    python scripts/build_extension.py --header tuned.h --output build/flashcore_ext
    python scripts/build_extension.py --header tuned.h --output build/hopper_ext --family hopper
    # then, on the GPU machine:
    #   import sys, torch; sys.path.insert(0, "build/flashcore_ext"); import flashcore_ext
    #   o = flashcore_ext.attention(q, k, v, causal, scale)   # scale=None: 1/sqrt(D)
    #   (hopper_ext likewise, from the header's hopper section)

What it does, once (minutes: the torch headers dominate):

1. reads the family's rows from the header (``evotuner.header.read_header``) and copies
   the header to ``OUTPUT/include/<config header>`` (``flashcore_config.h`` /
   ``hopper_config.h``, the name the binding includes);
2. writes one ``OUTPUT/src/row_<i>.cu`` per row from the row template in the family's
   ``kernels/<family>/extension/`` (``flashcore_launch_row.cu.in`` for FlashCore's ABI,
   ``hopper_launch_row.cu.in`` for the hopper family: TMA tensor maps): the row's macros come
   from the header's ``<T>_<i>_*`` macros, the kernel and its meta table get per-row names,
   plus an ``extern "C"`` launcher; compiles each with ``nvcc -c`` (parallel, each with a
   timeout) — no torch header here;
3. builds the family's binding (``flashcore_ext.cpp`` / ``hopper_ext.cpp``, beside the row
   template; no CUDA header) with ``torch.utils.cpp_extension.load`` in a child process with a
   timeout, linking the row objects and the static CUDA runtime; the module lands at
   ``OUTPUT/<module>.so``.

What every family's extension shares (``ext_common.cuh``: the row launchers' helpers;
``ext_binding.h``: the bindings') is in ``scripts/extension/``, beside this script.

The binding includes no CUDA headers, so the build also works with the CPU torch wheel
(then only ``select()``/``configs()`` can run; ``attention`` needs a CUDA torch and a GPU).
Exit status 0 on success; 1 with a one-line reason (and remedy) otherwise.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from evotuner.atomicfile import check_target, write_bytes_atomic, write_text_atomic
from evotuner.compiler.cache import EXTENSION_DIR
from evotuner.compiler.instantiate import check_family, gencode
from evotuner.compiler.nvcc import find_nvcc, probe, run
from evotuner.errors import BuildError, EvotunerError
from evotuner.header import HeaderInfo, read_header, row_instantiation
from evotuner.kernels.hopper.params import HOPPER_META
from evotuner.scriptargs import ArgumentParser, output_folder

#: The family-independent pieces every production extension shares (ext_common.cuh: the row
#: launchers' helpers; ext_binding.h: the torch bindings'). A family's own pieces (binding, row
#: template, launcher arguments) live in its folder: ``kernels/<family>/extension/``.
COMMON = Path(__file__).resolve().parent / "extension"


@dataclass(frozen=True)
class ExtensionKind:
    """What differs between the families' production builds: the ABI the row launcher packs.
    Everything is named after ``prefix``: module ``<prefix>_ext`` from the binding
    ``kernels/<prefix>/extension/<prefix>_ext.cpp``, rows from ``<prefix>_launch_row.cu.in`` beside it, the header
    (its ``<prefix>`` section) included as ``<prefix>_config.h``, kernels ``<prefix>_fwd_<i>``,
    meta tables ``<prefix>_meta_<i>``, launchers ``<prefix>_ext_launch_<i>``."""

    prefix: str
    meta_len: str          # the meta table's length (a macro of launch_include, or a number)
    launch_args: str       # the launcher's first parameter type
    launch_include: str    # the header declaring it

    @property
    def module(self) -> str:
        return f"{self.prefix}_ext"

    @property
    def binding(self) -> str:
        return f"{self.prefix}_ext.cpp"

    @property
    def row_template(self) -> str:
        return f"{self.prefix}_launch_row.cu.in"

    @property
    def config_header(self) -> str:
        return f"{self.prefix}_config.h"

    def folder(self, kernels_root: Path | None = None) -> Path:
        """``<kernels root>/<prefix>/extension``: the binding, the row template and what they share;
        the packaged family's folder where ``kernels_root`` has none."""
        if kernels_root is not None and (kernels_root / self.prefix / EXTENSION_DIR).is_dir():
            return kernels_root / self.prefix / EXTENSION_DIR
        return _kernels_root() / self.prefix / EXTENSION_DIR


#: FlashCore's ABI (flashcore::Params); families that keep it (the test family "toy") build this way.
FLASHCORE = ExtensionKind("flashcore", "FLASHCORE_META_LEN", "flashcore::Params", "flashcore/params.h")
#: The hopper family: TMA tensor maps encoded by the launcher from pointers and strides.
#: (hopper/params.h names HOPPER_META_LEN but includes cuda.h, which the binding must not.)
HOPPER = ExtensionKind("hopper", str(len(HOPPER_META)), "HopperExtArgs", "hopper_ext_args.h")
KINDS = {"hopper": HOPPER}


def extension_kind(family: str) -> ExtensionKind:
    return KINDS.get(family, FLASHCORE)


#: One row's real kernel compiles in seconds; 10 minutes is only a guard against a hung nvcc.
ROW_TIMEOUT_S = 600.0
#: The torch binding compiles torch/extension.h (about a minute on 2 cores); 30 minutes is a guard.
TORCH_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class BuiltExtension:
    module: Path                  # OUTPUT/<module>.so
    rows: int
    arch: str
    seconds: float


def _kernels_root() -> Path:
    return Path(str(files("evotuner.kernels")))


def cuda_library_dirs(nvcc: Path, scratch: Path) -> list[Path]:
    """The CUDA library folders nvcc links with (``-L`` of ``nvcc -dryrun``'s LIBRARIES), stubs excluded."""
    probe_src = scratch / "probe_libraries.cu"
    probe_src.write_text("int main() { return 0; }\n")
    out = run([str(nvcc), "-dryrun", str(probe_src), "-o", str(scratch / "probe_libraries")], cwd=scratch,
              timeout_s=60)
    dirs: list[Path] = []
    for line in out.output.splitlines():
        if "LIBRARIES=" in line:
            dirs += [Path(d) for d in re.findall(r'-L"?([^"\s]+)"?', line) if not d.rstrip("/").endswith("stubs")]
    dirs = [d.resolve() for d in dirs if (d / "libcudart_static.a").is_file()]
    if not dirs:
        raise BuildError(f"{nvcc} -dryrun names no folder with libcudart_static.a",
                         "install the CUDA toolkit's runtime libraries (cudart) next to nvcc")
    return dirs


def generate_sources(info: HeaderInfo, header: Path, out: Path, family: str, kind: ExtensionKind,
                     ext_dir: Path) -> list[Path]:
    """Write include/<config header>, src/row_<i>.cu and src/<prefix>_rows.h from the row template
    in ``ext_dir``; return the row sources."""
    include, src = out / "include", out / "src"
    include.mkdir(parents=True, exist_ok=True)
    src.mkdir(parents=True, exist_ok=True)
    _write_if_changed(include / kind.config_header, header.read_text(encoding="utf-8"))
    template = (ext_dir / kind.row_template).read_text()
    x = kind.prefix
    sources = []
    for i, names in enumerate(info.rows):
        inst = row_instantiation(kind.config_header, i, names, family,
                                 kernel_name=f"{x}_fwd_{i}", meta_name=f"{x}_meta_{i}")
        text = template.replace("@INSTANTIATION@", inst).replace("@INDEX@", str(i))
        path = src / f"row_{i}.cu"
        _write_if_changed(path, text)
        sources.append(path)
    signature = f"(const {kind.launch_args}*, void* stream, int device, char* err, int err_len)"
    decls = "\n".join(f'extern "C" int {x}_ext_launch_{i}{signature};' for i in range(len(info.rows)))
    table = ",\n    ".join(f"{x}_ext_launch_{i}" for i in range(len(info.rows)))
    shadows = "\n".join(f"__attribute__((weak)) int32_t {x}_meta_{i}[{kind.meta_len}];"
                        for i in range(len(info.rows)))
    _write_if_changed(src / f"{x}_rows.h", (
        f"// generated by scripts/build_extension.py: one launcher per row of {kind.config_header}\n"
        f"#pragma once\n#include <cstdint>\n#include \"{kind.launch_include}\"\n"
        + f"{decls}\n"
        "// nvcc gives `extern \"C\" __constant__ int32_t meta[] = {...}` (instantiate.cuh) no host shadow\n"
        f"// variable, yet the row objects' registration code references one (nm: U {x}_meta_<i>).\n"
        "// These weak, never-read definitions satisfy the link; the launchers read the table with\n"
        "// cuModuleGetGlobal. A kernel source that defines the shadow itself overrides them.\n"
        f"extern \"C\" {{\n{shadows}\n}}\n"
        f"static constexpr int (*kLaunchers[]){signature} = {{\n    {table},\n}};\n"))
    return sources


def _write_if_changed(path: Path, text: str) -> None:
    """Write a generated file under evotuner's output rule (never through a link a reused --output
    folder holds, never a folder or a device); an unchanged file keeps its time (nvcc's rebuild)."""
    try:
        check_target(path, option="--output folder")
    except EvotunerError as exc:
        raise BuildError(exc.message, exc.remedy) from None
    if not path.is_file() or path.read_text() != text:
        write_text_atomic(path, text, option="--output folder")


def compile_rows(nvcc: Path, arch: str, sources: list[Path], out: Path, includes: list[Path], jobs: int,
                 timeout_s: float) -> list[Path]:
    """``nvcc -c`` every row source (in parallel), ``includes`` on the include path after the
    output's own; raise BuildError naming the first row that failed."""
    objdir = out / "obj"
    objdir.mkdir(exist_ok=True)

    def one(source: Path) -> tuple[Path, Path, object]:
        obj = objdir / (source.stem + ".o")
        argv = [str(nvcc), "-c", "-std=c++17", "-O3", gencode(arch), "-Xcompiler", "-fPIC",
                "-I", str(out / "include"), *[f"-I{p}" for p in includes], str(source), "-o", str(obj)]
        return source, obj, run(argv, cwd=out, timeout_s=timeout_s)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, sources))
    for source, _, outcome in results:
        if outcome.timed_out:  # type: ignore[attr-defined]
            raise BuildError(f"nvcc timed out after {timeout_s:g} s on {source.name}", "raise --row-timeout")
        if outcome.returncode != 0:  # type: ignore[attr-defined]
            lines = [ln.strip() for ln in outcome.output.splitlines() if ln.strip()]  # type: ignore[attr-defined]
            first = next((ln for ln in lines if "error" in ln), lines[-1] if lines else "no output")
            if "Unsupported gpu architecture" in first:
                raise BuildError(f"nvcc failed on {source.name}: {first}", _ARCH_REMEDY.format(arch=arch))
            raise BuildError(f"nvcc failed on {source.name}: {first}",
                             "the header holds a config this kernel source rejects; re-export from a study "
                             "built with the same kernel")
    return [obj for _, obj, _ in results]


_ARCH_REMEDY = ("the header's arch {arch} is not one this nvcc supports (nvcc --list-gpu-arch): re-export the "
                "header for a supported arch, e.g. sm_90a, or pass a newer --nvcc")


def check_arch(nvcc: Path, arch: str) -> None:
    """Refuse, before anything is written, a header arch this nvcc does not know (``nvcc
    --list-gpu-arch``; an nvcc that cannot list them is left to the row compile)."""
    m = re.fullmatch(r"sm_(\d+)([a-z]?)", arch)
    if m is None:
        gencode(arch)          # its BuildError names an arch that is no SM target
        return
    try:
        listed = run([str(nvcc), "--list-gpu-arch"], cwd=None, timeout_s=60)
    except EvotunerError:
        return
    known = set(re.findall(r"compute_(\d+)", listed.output)) if listed.returncode == 0 else set()
    if known and m.group(1) not in known:
        raise BuildError(f"the header's arch {arch}: {nvcc} does not support it (it knows compute_"
                         f"{min(known, key=int)} to compute_{max(known, key=int)})", _ARCH_REMEDY.format(arch=arch))


def _remove_created(out: Path, existed: bool, before: set[str]) -> None:
    """After a failed build: remove what this run created under ``out`` (all of it when it made
    ``out``), nothing that was there before."""
    if not existed:
        shutil.rmtree(out, ignore_errors=True)
        return
    for name in ("include", "src", "obj", "torch_build", "build_info.json", *(f"{k.module}.so" for k in
                                                                               (FLASHCORE, HOPPER))):
        if name in before:
            continue
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_file():
            path.unlink(missing_ok=True)


_TORCH_STEP = r"""
import json, sys
from torch.utils import cpp_extension
a = json.loads(sys.argv[1])
cpp_extension.load(name=a["name"], sources=a["sources"], extra_include_paths=a["includes"],
                   extra_cflags=["-O3"], extra_ldflags=a["ldflags"], build_directory=a["build_dir"],
                   with_cuda=False, verbose=a["verbose"], is_python_module=True)
"""


def build_binding(objects: list[Path], out: Path, includes: list[Path], cuda_libs: list[Path], verbose: bool,
                  timeout_s: float, kind: ExtensionKind = FLASHCORE, ext_dir: Path | None = None) -> Path:
    """Build the torch binding (``ext_dir``'s, default the packaged family's) with
    cpp_extension.load in a child process (so it has a timeout)."""
    ext_dir = ext_dir if ext_dir is not None else kind.folder()
    build_dir = out / "torch_build"
    build_dir.mkdir(exist_ok=True)
    ldflags = [str(o) for o in objects]
    for d in cuda_libs:
        ldflags += [f"-L{d}"]
    ldflags += ["-lcudart_static", "-ldl", "-lrt", "-lpthread"]
    args = {
        "name": kind.module, "sources": [str(ext_dir / kind.binding)],
        "includes": [str(out / "include"), str(out / "src"), str(COMMON), str(ext_dir), *map(str, includes)],
        "ldflags": ldflags, "build_dir": str(build_dir), "verbose": verbose,
    }
    env = dict(os.environ, MAX_JOBS=os.environ.get("MAX_JOBS", str(os.cpu_count() or 1)))
    try:
        proc = subprocess.run([sys.executable, "-c", _TORCH_STEP, json.dumps(args)], cwd=out, env=env,
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BuildError(f"the torch binding build timed out after {timeout_s:g} s", "raise --torch-timeout") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stdout + proc.stderr).strip().splitlines() if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower()] or lines
        raise BuildError(f"the torch binding did not build: {' | '.join(errors[-4:])}",
                         "rerun with --verbose; torch and a host C++ compiler (g++) must be installed")
    built = build_dir / f"{kind.module}.so"
    if not built.is_file():
        raise BuildError(f"the torch build finished but {built} is missing", "rerun with --verbose")
    module = out / f"{kind.module}.so"
    try:
        write_bytes_atomic(module, built.read_bytes(), option="--output folder")   # never through a link
    except EvotunerError as exc:
        raise BuildError(exc.message, exc.remedy) from None
    return module


def build(header: Path, output: Path, *, family: str = "flashcore", kernels_root: Path | None = None,
          includes: tuple[Path, ...] = (), jobs: int | None = None, nvcc: str | None = None,
          row_timeout_s: float = ROW_TIMEOUT_S, torch_timeout_s: float = TORCH_TIMEOUT_S,
          verbose: bool = False) -> BuiltExtension:
    start = time.monotonic()
    header = Path(header).resolve()
    check_family(family)
    for what, seconds in (("--row-timeout", row_timeout_s), ("--torch-timeout", torch_timeout_s)):
        if not (math.isfinite(seconds) and seconds >= 1):
            raise EvotunerError(f"{what} {seconds}: not a number of seconds of at least 1", f"give e.g. {what} 600")
    if jobs is not None and jobs < 1:
        raise EvotunerError(f"--jobs {jobs}: must be at least 1", "give a positive number, or leave it out (CPU count)")
    kind = extension_kind(family)
    root = (kernels_root or _kernels_root()).resolve()
    inc = [*(Path(p).resolve() for p in includes), root]
    if not any((p / family / "instantiate.cuh").is_file() for p in inc):   # an unknown --family too
        raise EvotunerError(f"kernel family {family!r}: no {family}/instantiate.cuh under {', '.join(map(str, inc))}",
                            "pass --family flashcore or hopper, or --kernels-root (the folder holding "
                            "<family>/instantiate.cuh)")
    info = read_header(header, kind.prefix)
    if not str(output).strip():
        raise EvotunerError("--output is empty", "give a folder to build into")
    if Path(output).is_symlink():
        raise EvotunerError(f"--output {output} is a symbolic link, which evotuner never builds through",
                            "give the folder itself")
    out = Path(output).resolve()
    if out.exists() and not out.is_dir():
        raise EvotunerError(f"--output {out} exists and is not a folder", "give a folder to build into")
    nvcc_path = find_nvcc(nvcc)      # before the folder is made: a refused build leaves nothing behind
    toolchain = probe(nvcc_path)
    check_arch(nvcc_path, info.arch)
    existed = out.is_dir()
    before = {p.name for p in out.iterdir()} if existed else set()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EvotunerError(f"--output {out}: cannot create it ({exc.strerror or exc})",
                            "give a folder you can write, whose parents are folders") from None
    try:
        module = _build_into(out, info, header, family, kind, root, inc, nvcc_path, jobs, row_timeout_s,
                             torch_timeout_s, verbose, toolchain.release)
    except BaseException:
        _remove_created(out, existed, before)    # a failed build leaves nothing it made behind
        raise
    return BuiltExtension(module=module, rows=len(info.rows), arch=info.arch, seconds=time.monotonic() - start)


def _build_into(out: Path, info: HeaderInfo, header: Path, family: str, kind: ExtensionKind, root: Path,
                inc: list[Path], nvcc_path: Path, jobs: int | None, row_timeout_s: float, torch_timeout_s: float,
                verbose: bool, release: str) -> Path:
    ext_dir = kind.folder(root)
    sources = generate_sources(info, header, out, family, kind, ext_dir)
    objects = compile_rows(nvcc_path, info.arch, sources, out, [COMMON, ext_dir, *inc], jobs or os.cpu_count() or 1,
                           row_timeout_s)
    module = build_binding(objects, out, inc, cuda_library_dirs(nvcc_path, out / "obj"), verbose, torch_timeout_s,
                           kind, ext_dir)
    _write_if_changed(out / "build_info.json", json.dumps({
        "module": module.name, "header": str(header),
        "header_sha256": hashlib.sha256(header.read_bytes()).hexdigest(),
        "rows": len(info.rows), "arch": info.arch, "family": family, "nvcc": release,
    }, indent=2) + "\n")
    return module


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--header", required=True, type=Path, help="the header written by `evotuner export`")
    ap.add_argument("--output", required=True, type=output_folder("a folder to build into"), help="folder to build into (created)")
    ap.add_argument("--family", default="flashcore",
                    help="kernel family (default flashcore; hopper builds hopper_ext from the header's hopper section)")
    ap.add_argument("--kernels-root", type=Path, default=None,
                    help="folder holding <family>/instantiate.cuh (default: the installed evotuner.kernels)")
    ap.add_argument("--include", type=Path, action="append", default=[], help="extra include folder (repeatable)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default: CPU count)")
    ap.add_argument("--nvcc", default=None, help="nvcc to use (default: EVOTUNER_NVCC, PATH, CUDA_HOME)")
    ap.add_argument("--row-timeout", type=float, default=ROW_TIMEOUT_S, help="seconds per row compile")
    ap.add_argument("--torch-timeout", type=float, default=TORCH_TIMEOUT_S, help="seconds for the torch binding")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    try:
        built = build(a.header, a.output, family=a.family, kernels_root=a.kernels_root, includes=tuple(a.include),
                      jobs=a.jobs, nvcc=a.nvcc, row_timeout_s=a.row_timeout, torch_timeout_s=a.torch_timeout,
                      verbose=a.verbose)
    except EvotunerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:   # a folder that cannot be written, a full disk
        print(f"error: {exc.filename or a.output}: {exc.strerror or exc} (give an --output folder you can write)",
              file=sys.stderr)
        return 1
    print(f"built {built.module} ({built.rows} rows, {built.arch}) in {built.seconds:.0f} s")
    print(f"use: import sys, torch; sys.path.insert(0, {str(built.module.parent)!r}); import {built.module.stem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
