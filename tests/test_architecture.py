"""Architecture rules, checked on the source:

* no import cycle inside the package (every import counts, function-local ones too,
  so a local import cannot hide a cycle; importing ``a.b.c`` also runs ``a.b``'s
  ``__init__``);
* a kernel family's parameter names appear in no module outside that family's own
  code (kernels/<family>/), its space files and the tests;
* ``storage/`` imports nothing of evotuner but the value types :data:`STORAGE_MAY_IMPORT`;
* only the coordinator (and ``--gpus``) imports the several-workers machinery
  (:data:`SEVERAL_WORKERS`): the loop reaches the other searches through it;
* no module imports another module's private (``_name``) name;
* no module is over :data:`MAX_MODULE_LINES` lines, but those named in :data:`TOO_LONG_YET`;
* every file of a kernel family lives in its folder ``kernels/<family>/`` (one named after
  the family, a template using it, the generator of a file in it);
* every space file in ``search_spaces/`` is named after its family: ``<family>.toml`` or
  ``<family>_<variant>.toml``.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path
from typing import Iterable

REPO = Path(__file__).resolve().parents[1]
#: checkout folder -> import name (pyproject.toml's package-dir)
ROOTS = {"evotuner": "evotuner", "kernels": "evotuner.kernels", "storage": "evotuner.storage",
         "search_spaces": "evotuner.search_spaces"}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for folder, name in ROOTS.items():
        for path in (REPO / folder).rglob("*.py"):
            rel = path.relative_to(REPO / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([name, *parts])] = path
    return out


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, function-local ones included, except under ``if TYPE_CHECKING:``."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skip.update(id(sub) for sub in ast.walk(node))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skip]


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            parts = t.split(".")
            for k in range(1, len(parts) + 1):   # a.b.c runs a, a.b and a.b.c ...
                prefix = ".".join(parts[:k])
                # ... except the importer's own ancestor packages, already being imported
                if prefix in known and prefix != name and not name.startswith(prefix + "."):
                    found.add(prefix)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, set(mods)) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_inside_the_package():
    graph = _graph()
    assert "evotuner.family" in graph and "evotuner.compiler.builder" in graph
    assert _cycles(graph) == []


def test_the_cycle_check_can_fail():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _family_parameters() -> dict[str, set[str]]:
    """{family folder: parameter names} from the families' packaged space files."""
    from evotuner.family import families
    from evotuner.space import load_space

    out: dict[str, set[str]] = {}
    for fam in families():
        if (REPO / "kernels" / fam.name).is_dir():
            out[fam.name] = set(load_space(fam.default_space()).names)
    return out


def test_family_parameter_names_stay_in_the_family():
    params = _family_parameters()
    from evotuner.family import get_family
    reserved = {name: set(get_family(name).reserved()) for name in params}
    assert params.get("flashcore", set()) >= {"BLOCK_M", "BLOCK_N", "NUM_WARPS", "STAGES", "MIN_BLOCKS"}
    offenders: list[str] = []
    for folder in ("evotuner", "storage", "kernels"):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            text = path.read_text(encoding="utf-8")
            # a name two families share (BLOCK_N), or one a family reserves for its own macros
            # (hopper's HOPPER_BLOCK_M), may appear in that family's own folder
            own = set().union(*(names | reserved.get(family, set()) for family, names in params.items()
                                if rel.startswith(f"kernels/{family}/")))
            for family, names in params.items():
                if rel.startswith(f"kernels/{family}/"):
                    continue
                for n in sorted(names - own):
                    for m in re.finditer(rf"\b{re.escape(n)}\b", text):
                        line = text.count("\n", 0, m.start()) + 1
                        offenders.append(f"{rel}:{line}: {n} ({family})")
    assert offenders == [], "\n".join(offenders)


# -- the record stage depends on value types only ------------------------------------------------

#: The evotuner modules storage/ may import: value types and leaf helpers, none of which reaches
#: the space parser, the compiler, the gate, the measure stage or the families.
STORAGE_MAY_IMPORT = frozenset({
    "evotuner",              # the package itself (importing evotuner.x runs its __init__, which is cheap)
    "evotuner.config",       # KernelConfig, config_string
    "evotuner.problem",      # Shape, Problem
    "evotuner.vocabulary",   # trial-attribute names, the interrupted rule
    "evotuner.errors",       # StorageError and the rest
    "evotuner.numbers",      # finite_or_none
    "evotuner.version",      # evotuner_version
})


def _storage_offenders(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{mod} imports {dep}" for mod, deps in graph.items() if mod.startswith("evotuner.storage")
                  for dep in deps
                  if not dep.startswith("evotuner.storage") and dep not in STORAGE_MAY_IMPORT)


def test_storage_imports_only_value_types():
    graph = _graph()
    assert "evotuner.storage.store" in graph
    assert _storage_offenders(graph) == []
    # ... nor do the value types it imports reach further than one another
    reach = {dep for mod in STORAGE_MAY_IMPORT - {"evotuner"} for dep in graph[mod]}
    assert reach <= STORAGE_MAY_IMPORT, sorted(reach - STORAGE_MAY_IMPORT)


def test_the_storage_check_can_fail():
    graph = {"evotuner.storage.store": {"evotuner.config", "evotuner.space", "evotuner.storage.schema"}}
    assert _storage_offenders(graph) == ["evotuner.storage.store imports evotuner.space"]


# -- the pipeline reaches the other searches through the coordinator only ------------------------

#: The several-workers machinery (membership, claims, liveness) ...
SEVERAL_WORKERS = frozenset({"evotuner.workers", "evotuner.storage.claims", "evotuner.storage.liveness"})
#: ... and who may import it besides storage/: the coordinator (the loop's one way to the other
#: searches of its study) and --gpus, which makes one StudyWorker per GPU.
MAY_COORDINATE = frozenset({"evotuner.coordinator", "evotuner.workers", "evotuner.multigpu"})


def _coordination_offenders(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{mod} imports {dep}" for mod, deps in graph.items()
                  if not mod.startswith("evotuner.storage") and mod not in MAY_COORDINATE
                  for dep in deps & SEVERAL_WORKERS)


def test_only_the_coordinator_reaches_the_other_searches():
    graph = _graph()
    assert "evotuner.coordinator" in graph and "evotuner.loop" in graph
    assert _coordination_offenders(graph) == []


def test_the_coordination_check_can_fail():
    graph = {"evotuner.loop": {"evotuner.coordinator", "evotuner.workers"},
             "evotuner.coordinator": {"evotuner.workers", "evotuner.storage.claims"}}
    assert _coordination_offenders(graph) == ["evotuner.loop imports evotuner.workers"]


# -- no module reaches into another's private names ----------------------------------------------


def _private_imports(path: Path) -> list[str]:
    """``from x import _y`` (a single-underscore name of another module), function-local too."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            out += [f"{path.name}:{node.lineno}: from {node.module} import {a.name}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def test_no_import_of_another_modules_private_name():
    offenders = [f"{path.relative_to(REPO).parent}/{line}" for path in _modules().values()
                 for line in _private_imports(path)]
    assert offenders == [], "\n".join(offenders)


def test_the_private_import_check_can_fail(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from evotuner.storage.store import _is_finished\nfrom x import __version__, ok\n")
    assert _private_imports(bad) == ["bad.py:1: from evotuner.storage.store import _is_finished"]


# -- modules stay small ----------------------------------------------------------------------------

MAX_MODULE_LINES = 500
#: Modules not split yet (each one a debt, named here so it cannot grow unseen); lines counted.
TOO_LONG_YET: set[str] = set()


def _too_long(paths: list[Path], allowed: set[str]) -> list[str]:
    out = []
    for path in paths:
        rel = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_MODULE_LINES and rel not in allowed:
            out.append(f"{rel}: {n} lines (split it by concern; at most {MAX_MODULE_LINES})")
    return out


def test_no_module_over_the_line_limit():
    paths = sorted(_modules().values())
    assert _too_long(paths, TOO_LONG_YET) == []
    # an allowance whose module was split (or is gone) is dropped
    stale = sorted(rel for rel in TOO_LONG_YET
                   if not (REPO / rel).is_file() or not _too_long([REPO / rel], set()))
    assert stale == [], f"drop from TOO_LONG_YET: {stale}"


def test_the_line_limit_can_fail(tmp_path):
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (MAX_MODULE_LINES + 1), encoding="utf-8")
    assert _too_long([long], set()) == [f"long.py: {MAX_MODULE_LINES + 1} lines (split it by concern; at most "
                                        f"{MAX_MODULE_LINES})"]
    assert _too_long([long], {"long.py"}) == []


# -- every file of a family lives in its folder ----------------------------------------------------

#: Top-level folders whose files may be named after a family without being one of its files:
#: tests and their data, the measurement records, and the space files (their own rule below).
NOT_FAMILY_FILES = ("tests", "docs", "search_spaces")
#: A generated file names its generator: ``// GENERATED by kernels/hopper/gen_wgmma.py; ...``.
GENERATED_BY = re.compile(r"\bgenerated by\s+([\w./-]+\.\w+)", re.I)


def _checkout_files() -> list[str]:
    """The checkout's files (tracked, and untracked ones git does not ignore), relative, posix."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                             capture_output=True, check=True, timeout=60).stdout.decode()
        return sorted({f for f in out.split("\0") if f and (REPO / f).is_file()})
    except (OSError, subprocess.SubprocessError):   # not a git checkout: every file but hidden and built ones
        skip = {"__pycache__", "build", "dist", "bin", "gen"}
        return sorted(p.relative_to(REPO).as_posix() for p in REPO.rglob("*") if p.is_file()
                      and not any(part.startswith(".") or part in skip or part.endswith(".egg-info")
                                  for part in p.relative_to(REPO).parts))


def _kernel_families() -> list[str]:
    """The registered families with a folder under kernels/."""
    from evotuner.family import families

    return sorted(f.name for f in families() if (REPO / "kernels" / f.name).is_dir())


def _family_file_offenders(root: Path, files: Iterable[str], families: Iterable[str],
                           allowed: Iterable[str] = ()) -> list[str]:
    """Family files outside ``kernels/<family>/`` (``files``: paths relative to ``root``), but
    under :data:`NOT_FAMILY_FILES` or an ``allowed`` folder:

    * a file, or a folder above it, named after a family (``<family>_*``, ``<family>.*``);
    * a template (``*.in``) that uses a family's namespace (``<family>::``) or headers
      (``"<family>/...``);
    * a file in a family's folder whose ``generated by`` line names a generator elsewhere
      (a template's names the generator of its output, and is not read)."""
    families = sorted(families)
    out: list[str] = []
    for rel in sorted(files):
        parts = rel.split("/")
        name = parts[-1].lower()
        home = next((f for f in families if rel.startswith(f"kernels/{f}/")), None)
        if parts[0] not in NOT_FAMILY_FILES and not any(rel.startswith(folder) for folder in allowed):
            for fam in families:
                named = [p for p in parts if p.lower().startswith((f"{fam}_", f"{fam}."))]
                if fam != home and named:
                    what = "named" if named[-1] == parts[-1] else f"in {named[-1]}/, named"
                    out.append(f"{rel}: {what} after the {fam} family, outside kernels/{fam}/")
            if name.endswith(".in"):
                text = (root / rel).read_text(encoding="utf-8", errors="replace")
                for fam in families:
                    if fam != home and re.search(rf"\b{fam}::|[\"<]{fam}/", text):
                        out.append(f"{rel}: a template of the {fam} family, outside kernels/{fam}/")
        if home is not None and not name.endswith(".in"):
            text = (root / rel).read_text(encoding="utf-8", errors="replace")
            for generator in sorted(set(GENERATED_BY.findall(text))):
                if not generator.startswith(f"kernels/{home}/"):
                    out.append(f"{rel}: generated by {generator}, outside kernels/{home}/")
    return out


#: Folders of family files not moved into their family's folder yet (each a debt, named here so
#: no other grows unseen).
OUTSIDE_YET = {
    # the hopper kernel's standalone dev harness (its own launcher, variants, run logs and an
    # archive of kernel versions): moved into kernels/hopper/ it would ship in the package and
    # join the family's source hash (kernels/hopper/README.md and its NOTES.md cite its paths)
    "scripts/hopper_dev/",
}


def test_every_family_file_lives_in_its_folder():
    families = _kernel_families()
    assert families == ["flashcore", "hopper"]
    files = _checkout_files()
    assert "kernels/hopper/wgmma.cuh" in files and "scripts/build_extension.py" in files
    assert _family_file_offenders(REPO, files, families, OUTSIDE_YET) == []
    # an allowance whose folder moved (or is gone) is dropped
    stale = sorted(folder for folder in OUTSIDE_YET if not any(f.startswith(folder) for f in files))
    assert stale == [], f"drop from OUTSIDE_YET: {stale}"


def test_the_family_file_check_can_fail(tmp_path):
    files = {
        # offenders
        "scripts/extension/hopper_launch_row.cu.in": "// hopper::Params\n",
        "scripts/hopper_dev/gen_wgmma.py": "",
        "scripts/extension/row.cu.in": '#include "flashcore/params.h"\n',
        "scripts/flashcore_dev/run.sh": "",
        "evotuner/flashcore.py": "",
        "kernels/flashcore/hopper_bits.h": "",
        "kernels/hopper/wgmma.cuh": "// GENERATED by scripts/hopper_dev/gen_wgmma.py; do not edit by hand.\n",
        # family files in their folders, and files named after a family that are not its own
        "kernels/hopper/extension/hopper_ext.cpp": "",
        "kernels/hopper/extension/hopper_launch_row.cu.in": "// hopper::Params; generated by scripts/x.py\n",
        "kernels/hopper/gen.cuh": "// GENERATED by kernels/hopper/gen.py\n",
        "kernels/hopper/gen.py": '"// GENERATED by kernels/hopper/gen.py"\n',
        "scripts/extension/ext_common.cuh": "// hopper::Params\n",
        "scripts/hopperish.py": "", "scripts/old/hopper_notes.md": "",
        "tests/test_hopper_family.py": "", "tests/data/hopper_small.toml": "",
        "docs/measurements/hopper_tuning/hopper_run.log": "", "search_spaces/hopper.toml": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert _family_file_offenders(tmp_path, files, ["flashcore", "hopper"], ["scripts/old/"]) == [
        "evotuner/flashcore.py: named after the flashcore family, outside kernels/flashcore/",
        "kernels/flashcore/hopper_bits.h: named after the hopper family, outside kernels/hopper/",
        "kernels/hopper/wgmma.cuh: generated by scripts/hopper_dev/gen_wgmma.py, outside kernels/hopper/",
        "scripts/extension/hopper_launch_row.cu.in: named after the hopper family, outside kernels/hopper/",
        "scripts/extension/hopper_launch_row.cu.in: a template of the hopper family, outside kernels/hopper/",
        "scripts/extension/row.cu.in: a template of the flashcore family, outside kernels/flashcore/",
        "scripts/flashcore_dev/run.sh: in flashcore_dev/, named after the flashcore family, outside kernels/flashcore/",
        "scripts/hopper_dev/gen_wgmma.py: in hopper_dev/, named after the hopper family, outside kernels/hopper/",
    ]
    # a file under an allowed folder is not an offender (a file it generates elsewhere still is)
    allowed = _family_file_offenders(tmp_path, files, ["flashcore", "hopper"], ["scripts/hopper_dev/"])
    assert not [line for line in allowed if line.startswith("scripts/hopper_dev/")]
    assert "kernels/hopper/wgmma.cuh: generated by scripts/hopper_dev/gen_wgmma.py, outside kernels/hopper/" in allowed


# -- space files are named after their family ------------------------------------------------------


def _space_name_offenders(folder: Path) -> list[str]:
    """Space files in ``folder`` not named after their family (``[space] kernel``, a sub-grid's
    from its base): ``<family>.toml`` or ``<family>_<variant>.toml``."""
    from evotuner.space import load_space

    out = []
    for path in sorted(folder.glob("*.toml")):
        family = load_space(path).kernel
        if path.stem != family and not path.stem.startswith(f"{family}_"):
            out.append(f"{path.name}: a {family} space, not named {family}.toml or {family}_<variant>.toml")
    return out


def test_every_space_file_is_named_after_its_family():
    folder = REPO / "search_spaces"
    assert {p.name for p in folder.glob("*.toml")} >= {"flashcore.toml", "hopper.toml", "hopper_grid.toml"}
    assert _space_name_offenders(folder) == []


def test_the_space_name_check_can_fail(tmp_path):
    spaces = REPO / "search_spaces"
    flashcore, hopper = (spaces / "flashcore.toml").read_text(), (spaces / "hopper.toml").read_text()
    grid = (spaces / "hopper_grid.toml").read_text()
    for name, text in {"flashcore.toml": flashcore, "default.toml": flashcore, "flashcore_small.toml": flashcore,
                       "hopperish.toml": hopper, "hopper_flashcore.toml": flashcore, "hopper.toml": hopper,
                       "hopper_grid.toml": grid, "grid.toml": grid}.items():
        (tmp_path / name).write_text(text)
    assert _space_name_offenders(tmp_path) == [
        "default.toml: a flashcore space, not named flashcore.toml or flashcore_<variant>.toml",
        "grid.toml: a hopper space, not named hopper.toml or hopper_<variant>.toml",
        "hopper_flashcore.toml: a flashcore space, not named flashcore.toml or flashcore_<variant>.toml",
        "hopperish.toml: a hopper space, not named hopper.toml or hopper_<variant>.toml",
    ]
