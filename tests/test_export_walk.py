"""A hostile user's walk of ``evotuner export`` and the header path: an --output that holds a
file export did not write, the ``--require-checked`` remedy pasted as it stands, and a header
edited by hand (a count, a value, a kConfigs row, its arch) read back by ``use_tuned`` / the
production build (:func:`evotuner.header.read_header`): refused in one line, never a traceback,
a swollen process, or a row the C++ reads otherwise than the Python."""

from __future__ import annotations

import re
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, run, sweep_copy
from evotuner import tuned
from evotuner.errors import ExportError
from evotuner.export import export_header
from evotuner.header import read_header
from test_export import H, _gxx, summary, three_studies, trial
from test_hardening_walk import cli_env  # noqa: F401 -- the same fixture

REPO = Path(__file__).resolve().parents[1]
SWEEP = REPO / "tests" / "data" / "replay" / "synthetic_d64.csv"
SHAPE = "B=16,H=16,S=2048,D=64"


def _header(tmp_path: Path) -> Path:
    """Two families' sections: flashcore (3 rows) then hopper (2 rows)."""
    store = three_studies()
    store.summaries.update({s.study: s for s in (
        summary("h_a", [trial(0, 500.0, H())], family="hopper"),
        summary("h_b", [trial(0, 300.0, H(stages=3))], s=4096, causal=True, family="hopper"))})
    out = tmp_path / "tuned.h"
    export_header(store, ["d64_s2k", "d64_s512", "d128_causal_bf16", "h_a", "h_b"], out)
    return out


def _refused(header: Path, why: str) -> None:
    """Every reader refuses ``header`` in one line holding ``why``."""
    with pytest.raises(tuned.TunedError) as exc:
        tuned.load(header)
    assert why in exc.value.message and "\n" not in str(exc.value), exc.value
    with pytest.raises(ExportError, match=re.escape(why)):
        read_header(header, "hopper")


# ------------------------------------------------------------------------------------------ --output


@pytest.mark.parametrize("name,text", [("attention.cu", "__global__ void k() {}\n"),
                                       ("mine.h", "#pragma once\nconstexpr int kMine = 1;\n"),
                                       ("blob.h", "\x00\x01\x02binary\n")])
def test_export_does_not_replace_a_file_it_did_not_write(tmp_path: Path, name: str, text: str) -> None:
    """-o naming the user's own source or header (a typo, a tab completion) once replaced it with
    the header: its text was lost. Now refused, writing nothing, with a remedy."""
    out = tmp_path / name
    out.write_text(text)
    with pytest.raises(ExportError) as exc:
        export_header(three_studies(), ["d64_s2k"], out)
    assert "is not a header evotuner export wrote" in exc.value.message and "rm -- " in exc.value.remedy
    assert out.read_text() == text and sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_export_still_replaces_its_own_header_and_a_file_of_comments(tmp_path: Path) -> None:
    out = tmp_path / "tuned.h"
    export_header(three_studies(), ["d64_s2k"], out)
    export_header(three_studies(), ["d64_s512"], out)            # its own header, re-exported
    assert "study d64_s512" in out.read_text()
    for text in ("", "// the previous export\n\n// notes\n"):
        out.write_text(text)
        export_header(three_studies(), ["d64_s2k"], out)
        assert "study d64_s2k" in out.read_text()


# ------------------------------------------------------------------------------------------ --require-checked


@pytest.mark.parametrize("how", ["--storage", "env", "default"])
def test_require_checked_remedy_names_the_database_it_read(capsys, cli_env, monkeypatch, how):  # noqa: F811
    """The remedy was `evotuner check --study S` whatever database export read: pasted, it checked
    the default database (or failed to find the study). It now names the study and, when the
    export was given one (--storage or $EVOTUNER_STORAGE), the database."""
    db = "sqlite:///walk.db" if how != "default" else "sqlite:///evotuner.db"
    csv = sweep_copy(SWEEP, cli_env / "sweep")
    code, out, err = run(capsys, "search", "--study", "my s", "--shape", SHAPE, "--trials", 3, "--replay", csv,
                         "--storage", db)
    assert code == 0, err
    args = ["export", "--study", "my s", "-o", cli_env / "h.h", "--require-checked"]
    if how == "--storage":
        args += ["--storage", db]
    elif how == "env":
        monkeypatch.setenv("EVOTUNER_STORAGE", db)
    code, out, err = run(capsys, *args)
    want = "`evotuner check --study 'my s' --storage sqlite:///walk.db`" if how != "default" else \
        "`evotuner check --study 'my s'`"
    assert_one_line_error(code, out, err, "unchecked", want)
    assert not (cli_env / "h.h").exists()


# ------------------------------------------------------------------------------------------ a header edited by hand


def test_a_row_count_edited_huge_is_refused_without_a_list_of_that_many_rows(tmp_path: Path) -> None:
    """HOPPER_TUNED_COUNT 3000000 made two lists of 3M rows before anything was checked (10**9:
    the process was killed for memory); 5000 digits raised a bare ValueError from int()."""
    header = _header(tmp_path)
    text = header.read_text()
    header.write_text(text.replace("#define HOPPER_TUNED_COUNT 2", "#define HOPPER_TUNED_COUNT 3000000"))
    tracemalloc.start()
    try:
        _refused(header, "row 2 lacks macros HOPPER_TUNED_2_HEAD_DIM")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20, peak
    header.write_text(text.replace("#define HOPPER_TUNED_COUNT 2", "#define HOPPER_TUNED_COUNT " + "1" * 5000))
    _refused(header, "HOPPER_TUNED_COUNT is 11111111111111111111...11111111 (5000 characters), not a row count")


def _edited(tmp_path: Path, edit: str, repl: str) -> Path:
    """The test header with the first match of ``edit`` replaced (which must change it)."""
    header = _header(tmp_path)
    text = header.read_text()
    edited = re.sub(edit, repl, text, count=1)
    assert edited != text
    header.write_text(edited)
    return header


@pytest.mark.parametrize("edit,repl,why", [
    # C++ reads 010 as octal 8; Python's int() read 10: the row served was not the row built
    (r"(#define HOPPER_TUNED_1_STAGES +)\d+", r"\g<1>010", "HOPPER_TUNED_1_STAGES is 010, an integer with a leading 0"),
    (r"(#define HOPPER_TUNED_1_STAGES +)\d+", "\\g<1>\u0663", "HOPPER_TUNED_1_STAGES is '\u0663', not an integer"),
    (r"(#define HOPPER_TUNED_1_STAGES +)\d+", r"\g<1>" + "9" * 5000, "(5000 characters), past every value"),
    (r"#define HOPPER_TUNED_1_STAGES", "#define HOPPER_TUNED_" + "1" * 5000 + "_STAGES", "not a row number"),
    (r"#define HOPPER_TUNED_1_STAGES", "#define HOPPER_TUNED_01_STAGES", "HOPPER_TUNED_01_STAGES: not a row number"),
    # a count that is no number once dropped the section unseen (the other family's rows served alone),
    # or read as "no hopper section" with the remedy "pass --family flashcore"
    (r"(#define HOPPER_TUNED_COUNT) 2", r"\1 -1", "HOPPER_TUNED_COUNT is -1, not a row count"),
    (r"(#define HOPPER_TUNED_COUNT) 2", r"\1 2 // two", "HOPPER_TUNED_COUNT is '2 // two', not a row count"),
    (r"(#define HOPPER_TUNED_COUNT 2)", r"\1\n#define HOPPER_TUNED_COUNT 1",
     "HOPPER_TUNED_COUNT is 2, defined 2 times"),
    (r'(#define HOPPER_TUNED_ARCH) "sm_90a"', r'\1 "sm_xx"', "HOPPER_TUNED_ARCH is '\"sm_xx\"', not an SM target"),
    (r'#define HOPPER_TUNED_ARCH "sm_90a"\n', "", "HOPPER_TUNED_COUNT but no HOPPER_TUNED_ARCH"),
])
def test_a_macro_edited_out_of_what_export_writes_is_refused(tmp_path: Path, edit: str, repl: str, why: str) -> None:
    header = _edited(tmp_path, edit, repl)
    _refused(header, why)


@pytest.mark.parametrize("edit,repl,why", [
    # a value changed in the macros only: the Python served STAGES=4, the C++ does not compile
    (r"(#define HOPPER_TUNED_1_STAGES +)3", r"\g<1>4", "hopper::tuned::kConfigs[1] is {64,0,1,18,4096,128,3,3,"),
    # a value changed in kConfigs only: the Python served the macros' row, the C++ does not compile
    (r"(\{64, 0, true, 18, 4096, 128, 3, )3", r"\g<1>4", "hopper::tuned::kConfigs[1] is {64,0,1,18,4096,128,3,4,"),
    # a kConfigs row removed (the macros kept)
    (r"    \{64, 0, true, 18, 4096, .*\n", "", "hopper::tuned::kConfigs has 1 rows, HOPPER_TUNED_COUNT is 2"),
])
def test_kconfigs_and_macros_edited_apart_are_refused_as_the_compiler_refuses_them(
        tmp_path: Path, edit: str, repl: str, why: str) -> None:
    header = _edited(tmp_path, edit, repl)
    _refused(header, why)
    (tmp_path / "use.cpp").write_text(f'#include "{header.name}"\n')
    r = subprocess.run([_gxx(), "-std=c++17", "-fsyntax-only", str(tmp_path / "use.cpp")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "hopper_tuned: " in r.stderr, r.stderr


def test_an_unedited_two_family_header_still_reads(tmp_path: Path) -> None:
    """And each section is served as one family's: the tests' ``toy`` family shares FlashCore's
    FLASHCORE_TUNED prefix, and the flashcore rows were once served a second time as toy rows."""
    header = _header(tmp_path)
    assert [r.family for r in tuned.load(header).rows] == ["flashcore"] * 3 + ["hopper"] * 2
    assert read_header(header, "hopper").arch == "sm_90a"
    crlf = tmp_path / "crlf.h"
    crlf.write_bytes(header.read_bytes().replace(b"\n", b"\r\n"))
    assert len(tuned.load(crlf)) == 5
