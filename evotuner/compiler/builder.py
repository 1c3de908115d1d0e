"""The build stage: one config + the problem's static part -> one cubin, cached.

``Builder`` owns a thread pool (each job only waits on an nvcc subprocess, so
threads suffice) and the content-addressed cache. A compile error, a timeout,
or a cubin without a valid meta table are values (``BuildResult(ok=False)``);
the only raise is :class:`~evotuner.errors.BuildError` when nvcc itself cannot
be found or run, at construction.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import resources
from pathlib import Path

from evotuner.abi import ABI_HEADER, DTYPE_CODES
from evotuner.compiler import nvcc as toolchain_mod
from evotuner.compiler.cache import BuildCache, CacheEntry, build_key, hash_sources, source_files
from evotuner.compiler.cubin import CubinError, read_family_meta
from evotuner.compiler.instantiate import check_family, compile_flags, render_source
from evotuner.version import evotuner_version
from evotuner.compiler.result import Artifact, BuildResult
from evotuner.config import KernelConfig
from evotuner.errors import BuildError, SpaceError
from evotuner.family import DEFAULT_FAMILY, KernelFamily, get_family
from evotuner.problem import Problem

#: How much compiler output a failed build keeps in ``BuildResult.error`` (the
#: static_assert / error lines are at the end; the full text is in ``ptxas_log``).
ERROR_TAIL_LINES = 20


def packaged_kernels_root() -> Path:
    """The installed ``evotuner.kernels`` folder (checkout via the editable install, or a wheel)."""
    root = resources.files("evotuner.kernels")
    return root if isinstance(root, Path) else Path(str(root))


class Builder:
    """Compile configs of one kernel family into cached cubins.

    ``kernel_family`` is a :class:`~evotuner.family.KernelFamily` or the name of a
    registered one. ``jobs`` nvcc processes run at once (default ``os.cpu_count()``);
    each is killed after ``timeout_s``. ``kernels_root`` replaces the family's
    kernels folder; the shared ABI header (``evotuner_abi.h``) is taken from that
    root when present, else from the packaged one, and both roots are on the
    include path. ``nvcc`` overrides discovery (see :mod:`evotuner.compiler.nvcc`).
    """

    def __init__(
        self,
        kernel_family: KernelFamily | str = DEFAULT_FAMILY,
        *,
        arch: str = "sm_90a",
        cache_dir: str | os.PathLike[str] | None = None,
        jobs: int | None = None,
        timeout_s: float = 180.0,
        kernels_root: str | os.PathLike[str] | None = None,
        nvcc: str | os.PathLike[str] | None = None,
        extra_flags: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.family = kernel_family if isinstance(kernel_family, KernelFamily) else get_family(kernel_family)
        check_family(self.family.name)
        self.arch = arch
        self.timeout_s = float(timeout_s)
        if self.timeout_s <= 0:
            raise BuildError(f"build timeout must be positive, got {timeout_s!r} s", "e.g. timeout_s=180")
        self.jobs = int(jobs) if jobs else (os.cpu_count() or 1)
        self.flags = compile_flags(arch, tuple(extra_flags))
        packaged = packaged_kernels_root()
        root = kernels_root if kernels_root is not None else self.family.kernels_root()
        self.kernels_root = Path(root).resolve()
        self.include_dirs = [self.kernels_root] + ([packaged] if packaged != self.kernels_root else [])
        local_abi = self.kernels_root / ABI_HEADER
        self.abi_h = local_abi if local_abi.is_file() else packaged / ABI_HEADER
        name = self.family.name
        if not (self.kernels_root / name / "instantiate.cuh").is_file():
            families = sorted(p.parent.name for p in self.kernels_root.glob("*/instantiate.cuh"))
            raise SpaceError(
                f"kernel family {name!r}: no {name}/instantiate.cuh under {self.kernels_root}",
                f"use one of: {', '.join(families) or '(none found)'}",
            )
        self.toolchain = toolchain_mod.probe(toolchain_mod.find_nvcc(nvcc))
        self.cache = BuildCache(Path(cache_dir) if cache_dir is not None else None)
        self.cache.prune_tmp()
        self._pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="evotuner-build")
        self._lock = threading.Lock()
        self._pending: dict[str, Future[BuildResult]] = {}
        self._running: set = set()    # nvcc processes now compiling (killed by close())
        # The sources are hashed once: a kernel edited mid-study must not change the keys
        # of the builds the study recorded with this source hash.
        self._source_hash = hash_sources(source_files(self.kernels_root, name, self.abi_h))

    # -- identity -------------------------------------------------------------------------

    def source_hash(self) -> str:
        """sha256 of the family's kernel sources and the ABI header (recorded by studies and exports)."""
        return self._source_hash

    def nvcc_version(self) -> str:
        """nvcc's release, e.g. ``"13.0, V13.0.88"`` (the full text is ``toolchain.version``)."""
        return self.toolchain.release

    def source(self, config: KernelConfig, problem: Problem) -> str:
        """The generated ``gen.cu`` for this config (raises SpaceError for a bad parameter name)."""
        return render_source(config, problem, self.family)

    def cache_key(self, config: KernelConfig, problem: Problem) -> str:
        """The content key of this build; depends on the problem's head dim, dtype and causal only."""
        return build_key(
            source_hash=self.source_hash(),
            generated=self.source(config, problem),
            flags=self.flags,
            nvcc_version=self.toolchain.version,
            arch=self.arch,
        )

    # -- building -------------------------------------------------------------------------

    def build(self, config: KernelConfig, problem: Problem) -> BuildResult:
        """Build (or fetch from the cache) one config; blocks until done."""
        return self.submit(config, problem).result()

    def submit(self, config: KernelConfig, problem: Problem) -> Future[BuildResult]:
        """Queue one build on the pool; a build of the same key already in flight is shared."""
        key = self.cache_key(config, problem)
        with self._lock:
            pending = self._pending.get(key)
            if pending is not None:
                return pending
            future = self._pool.submit(self._run, config, problem, key)
            self._pending[key] = future
        return future

    @property
    def in_flight(self) -> int:
        """Builds queued or compiling now."""
        with self._lock:
            return len(self._pending)

    def _run(self, config: KernelConfig, problem: Problem, key: str) -> BuildResult:
        # Leave the in-flight table before the future resolves, so a caller woken by
        # the result already sees ``in_flight`` without this build.
        try:
            return self._build(config, problem, key)
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def _build(self, config: KernelConfig, problem: Problem, key: str) -> BuildResult:
        start = time.monotonic()
        entry = self.cache.lookup(key)
        if entry is not None:
            return self._result(config, key, entry, cached=True, seconds=time.monotonic() - start,
                                family=self.family)
        workdir = self.cache.new_workdir(key)
        try:
            (workdir / "gen.cu").write_text(self.source(config, problem))
            argv = [str(self.toolchain.nvcc), *self.flags]
            for inc in self.include_dirs:
                argv += ["-I", str(inc)]
            argv += ["-o", "kernel.cubin", "gen.cu"]
            outcome = toolchain_mod.run(argv, cwd=workdir, timeout_s=self.timeout_s, live=self._running)
            log = outcome.output
            cubin = workdir / "kernel.cubin"
            no_cubin = outcome.returncode == 0 and not cubin.is_file()
            if outcome.timed_out or (outcome.returncode is not None and outcome.returncode < 0) or no_cubin:
                # Not the config's fault (or not known to be): never cached.
                shutil.rmtree(workdir, ignore_errors=True)
                if outcome.timed_out:
                    error = f"nvcc timed out after {self.timeout_s:g} s"
                elif no_cubin:      # the compiler's fault, not the config's: a BuildError, with its remedy
                    raise BuildError(f"{self.toolchain.nvcc} exited with status 0 but wrote no kernel.cubin "
                                     "(is it nvcc, or a wrapper that drops -o?)", toolchain_mod.NOT_NVCC_REMEDY)
                else:
                    error = f"nvcc was killed by signal {-(outcome.returncode or 0)}"
                return BuildResult(config, key, False, None, log, time.monotonic() - start, False, error)
            record: dict[str, object] = {
                "config": config.as_dict(),
                "problem": problem.static_key(),
                "family": self.family.name,
                "arch": self.arch,
                "flags": list(self.flags),
                "nvcc": self.toolchain.release,
                "evotuner": evotuner_version(),
                "compile_seconds": round(outcome.seconds, 3),
            }
            if outcome.returncode != 0:
                record.update(ok=False, error=_tail(log) or f"nvcc exited with status {outcome.returncode}")
            else:
                data = cubin.read_bytes()
                try:
                    meta = read_family_meta(data, self.family)
                    _check_meta(meta, config, problem, self.family)
                except CubinError as exc:
                    record.update(ok=False, error=str(exc))
                    cubin.unlink()
                else:
                    record.update(ok=True, error=None, sha256=hashlib.sha256(data).hexdigest(), meta=meta)
            entry = self.cache.publish(key, workdir, record, log)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        return self._result(config, key, entry, cached=False, seconds=time.monotonic() - start,
                            family=self.family)

    @staticmethod
    def _result(config: KernelConfig, key: str, entry: CacheEntry, *, cached: bool, seconds: float,
                family: KernelFamily) -> BuildResult:
        record = entry.record
        if not entry.ok:
            return BuildResult(config, key, False, None, entry.ptxas_log, seconds, cached, str(record.get("error")))
        meta = {str(k): int(v) for k, v in dict(record["meta"]).items()}  # type: ignore[arg-type]
        artifact = Artifact(cubin=entry.cubin, key=key, sha256=str(record["sha256"]), meta=meta,
                            entry=family.entry, family=family.name)
        return BuildResult(config, key, True, artifact, entry.ptxas_log, seconds, cached, None)

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel queued builds and kill running ones (a Ctrl-C must not wait out nvcc)."""
        toolchain_mod.kill(self._running)
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._pending.clear()

    def __enter__(self) -> "Builder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tail(log: str, lines: int = ERROR_TAIL_LINES) -> str:
    kept = [line for line in log.strip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def _check_meta(meta: dict[str, int], config: KernelConfig, problem: Problem, family: KernelFamily) -> None:
    """The meta table must describe what was asked for (else the family ignored a macro).

    ``threads`` and ``smem_bytes`` are the kernel's to derive (a warp-specialised
    kernel may add a producer warpgroup), so they are not checked here.
    """
    static = problem.static_key()
    expected = {
        "head_dim": int(static["head_dim"]),
        "is_causal": int(bool(static["causal"])),
        "dtype": DTYPE_CODES[str(static["dtype"])],
    }
    if "varlen" in meta or static.get("varlen"):
        expected["varlen"] = int(bool(static.get("varlen")))
    params = config.as_dict()
    expected.update({field: params[name] for name, field in family.echoed.items() if name in params})
    wrong = [f"{k}={meta[k]} (expected {v})" for k, v in expected.items() if meta.get(k) != v]
    if wrong:
        raise CubinError(
            f"cubin: {family.meta_symbol} disagrees with the config: {', '.join(wrong)}",
            f"the family's instantiate.cuh must map every {family.macro_prefix}_* macro onto its traits",
        )
