"""The content-addressed build cache.

Key = sha256 over the kernel sources (every file under the family folder and
the shared ABI header ``evotuner_abi.h``, by relative path and content; the
family's Python files are not kernel sources), the generated source,
the compile flags, the full ``nvcc --version`` text and the arch. Include
directories are *not* in the key (their contents are), so a checkout and a
wheel of the same sources share entries.

Layout: ``<root>/builds/<key[:2]>/<key>/{kernel.cubin, ptxas.log, gen.cu, build.json}``.
An entry is built in ``<root>/tmp/`` (same filesystem) and published with one
``os.rename``: readers see a whole entry or none; a crash leaves only a temp
dir; when two processes race on a key the second rename fails and the loser
adopts the winner's entry. Failed compiles are entries too (``ok: false`` and
the error text), so a known-bad config is never compiled twice; timeouts are
not published.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from evotuner.errors import BuildError

CACHE_FORMAT = 1
#: A family's subfolder holding its production-extension pieces (binding, row template:
#: scripts/build_extension.py). A config's build never includes them, so they are no part
#: of its source hash.
EXTENSION_DIR = "extension"
_IGNORED_DIRS = {"__pycache__", ".git", EXTENSION_DIR}


def default_cache_root() -> Path:
    """``$EVOTUNER_CACHE_DIR``, else ``$XDG_CACHE_HOME/evotuner``, else ``~/.cache/evotuner``; where
    there is no usable home (HOME empty, missing, not an absolute path to a folder), a private
    per-user folder in the system's temp dir (:func:`fallback_cache_root`), never ``/.cache``
    or a new ``/nonexistent/home``."""
    env = os.environ.get("EVOTUNER_CACHE_DIR")
    if env:
        try:
            return Path(env).expanduser().absolute()
        except RuntimeError:            # ~nouser, or ~ without a home
            raise BuildError(f"build cache $EVOTUNER_CACHE_DIR={env}: {env.split('/')[0]} names no user's home",
                             "point $EVOTUNER_CACHE_DIR at a folder by its full path, or unset it") from None
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():  # the XDG spec: a relative value is ignored
        return Path(xdg) / "evotuner"
    home = os.environ.get("HOME")
    if home and Path(home).is_absolute() and Path(home).is_dir():
        return Path(home) / ".cache" / "evotuner"
    return fallback_cache_root()


def fallback_cache_root() -> Path:
    """``<tmp>/evotuner-cache-<uid>``: made mode 0700 and used only when it is a folder of this
    user's (not a link) that nobody else may write; otherwise BuildError with the remedy."""
    root = Path(tempfile.gettempdir()) / f"evotuner-cache-{os.getuid()}"
    remedy = "set $EVOTUNER_CACHE_DIR (or HOME) to a writable folder"
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(root)
    except OSError as exc:
        raise BuildError(f"build cache: HOME is not a usable folder and {root} cannot be made ({exc.strerror})",
                         remedy) from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise BuildError(f"build cache: HOME is not a usable folder and {root} is not a private folder of this user",
                         remedy)
    return root


def check_cache_root(root: Path, *, from_env: bool = False) -> None:
    """Refuse, with a remedy, a cache root that is a file, lies under a file, or cannot be
    written (nor created: the nearest existing folder above it must be writable)."""
    what = f"build cache {root}" + (" ($EVOTUNER_CACHE_DIR)" if from_env else "")
    remedy = "point $EVOTUNER_CACHE_DIR at a writable folder, or unset it"
    for path in (root, *root.parents):
        try:
            if not path.exists():
                continue
        except OSError as exc:
            raise BuildError(f"{what}: cannot reach {path} ({exc.strerror})", remedy) from None
        if not path.is_dir():
            where = "is a file" if path == root else f"lies under {path}, which is a file"
            raise BuildError(f"{what} {where}, not a directory", remedy)
        if not os.access(path, os.W_OK | os.X_OK):
            raise BuildError(f"{what} is not writable" if path == root
                             else f"{what} cannot be created: {path} is not writable", remedy)
        if path != root:
            try:
                root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise BuildError(f"{what} cannot be created ({exc.strerror})", remedy) from None
        return


def source_files(kernels_root: Path, family: str, abi_h: Path) -> list[tuple[str, Path]]:
    """(name, path) of every kernel source a family build depends on, sorted by name (its
    Python side and its :data:`EXTENSION_DIR` are not)."""
    family_dir = kernels_root / family
    files = [
        (p.relative_to(kernels_root).as_posix(), p)
        for p in family_dir.rglob("*")
        if p.is_file() and not (_IGNORED_DIRS & set(p.relative_to(family_dir).parts)) and p.suffix not in (".py", ".pyc")
    ]
    names = {name for name, _ in files}
    if abi_h.name not in names:
        files.append((abi_h.name, abi_h))
    return sorted(files)


def hash_sources(files: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256(b"evotuner-sources\0")
    for name, path in files:
        data = path.read_bytes()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def build_key(*, source_hash: str, generated: str, flags: tuple[str, ...], nvcc_version: str, arch: str) -> str:
    payload = json.dumps(
        {
            "format": CACHE_FORMAT,
            "sources": source_hash,
            "generated": generated,
            "flags": list(flags),
            "nvcc": nvcc_version,
            "arch": arch,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """A published entry, as read back: ``record`` is build.json."""

    path: Path
    record: dict[str, object]
    ptxas_log: str

    @property
    def ok(self) -> bool:
        return bool(self.record.get("ok"))

    @property
    def cubin(self) -> Path:
        return self.path / "kernel.cubin"


class BuildCache:
    """A directory of published build entries (see the module docstring)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_root()
        check_cache_root(self.root, from_env=root is None and bool(os.environ.get("EVOTUNER_CACHE_DIR")))

    def entry_dir(self, key: str) -> Path:
        return self.root / "builds" / key[:2] / key

    def new_workdir(self, key: str) -> Path:
        """A fresh private directory on the cache's filesystem to build ``key`` in."""
        tmp = self.root / "tmp"
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            return Path(tempfile.mkdtemp(prefix=f"{key[:16]}.", dir=tmp))
        except OSError as exc:
            raise BuildError(f"build cache {self.root}: cannot write there ({exc.strerror})",
                             "point $EVOTUNER_CACHE_DIR at a writable folder (or free some disk space)") from None

    def lookup(self, key: str) -> CacheEntry | None:
        """The published entry for ``key``, or None (missing, or unreadable: then it is discarded)."""
        path = self.entry_dir(key)
        try:
            record = json.loads((path / "build.json").read_text())
            log = (path / "ptxas.log").read_text(errors="replace")
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            self.discard(key)
            return None
        if record.get("key") != key or record.get("format") != CACHE_FORMAT:
            self.discard(key)
            return None
        if record.get("ok"):
            try:
                digest = hashlib.sha256((path / "kernel.cubin").read_bytes()).hexdigest()
            except OSError:
                digest = None
            if digest != record.get("sha256"):
                self.discard(key)
                return None
        return CacheEntry(path, record, log)

    def publish(self, key: str, workdir: Path, record: dict[str, object], ptxas_log: str) -> CacheEntry:
        """Write build.json + ptxas.log into ``workdir`` and rename it into place.

        Returns the published entry: ours, or the one another process published first.
        """
        record = {**record, "key": key, "format": CACHE_FORMAT}
        (workdir / "ptxas.log").write_text(ptxas_log)
        (workdir / "build.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        final = self.entry_dir(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(workdir, final)
        except OSError:
            # Another builder published this key first (a non-empty target): adopt theirs.
            # lookup() discards an unreadable entry, after which our rename may go ahead.
            existing = self.lookup(key)
            if existing is not None:
                shutil.rmtree(workdir, ignore_errors=True)
                return existing
            os.rename(workdir, final)
        return CacheEntry(final, record, ptxas_log)

    def prune_tmp(self, older_than_s: float = 24 * 3600) -> int:
        """Remove temp dirs a crashed builder left behind (older than a day by default)."""
        tmp = self.root / "tmp"
        if not tmp.is_dir():
            return 0
        cutoff = time.time() - older_than_s
        removed = 0
        for path in tmp.iterdir():
            try:
                if path.stat().st_mtime < cutoff:
                    shutil.rmtree(path, ignore_errors=True)
                    removed += 1
            except OSError:
                continue
        return removed

    def discard(self, key: str) -> None:
        """Remove an entry (moved aside first, so no reader sees it half-deleted)."""
        path = self.entry_dir(key)
        if not path.exists():
            return
        grave = self.root / "tmp" / f"discard.{key[:16]}.{uuid.uuid4().hex}"
        grave.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(path, grave)
        except OSError:
            return
        shutil.rmtree(grave, ignore_errors=True)
