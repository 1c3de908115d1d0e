"""The query-rows bucket of the exported header: studies of one (D, dtype, causal, Sk bucket)
but different B*H*Sq are separate rows (a decode study no longer takes a prefill row by its
smaller µs), the generated C++ select() picks by query rows and agrees with evotuner.tuned's
Python on the same calls (one rule, evotuner/query_rows.py, rendered into the header), and a
header exported before the bucket is refused in one line."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from evotuner import query_rows, tuned
from evotuner.errors import EvotunerError, ExportError
from evotuner.export import export_header
from evotuner.header import read_header
from evotuner.problem import Problem, Shape
from test_export import P, FakeStore, _build_extension_module, summary, trial

H100 = "NVIDIA H100 80GB HBM3"


def _gxx() -> str:
    gxx = shutil.which("g++") or shutil.which("c++")
    assert gxx, "a host C++ compiler (g++) is needed for this test"
    return gxx


# ------------------------------------------------------------------------------------------ the rule


@pytest.mark.parametrize("rows,bucket", [(0, 0), (1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (32, 5), (33, 6),
                                         (8448, 14), (131072, 17), (131073, 18), (2**40, 40), (2**62 + 1, 63)])
def test_query_rows_bucket(rows: int, bucket: int) -> None:
    assert query_rows.bucket(rows) == bucket
    if rows:
        lo, hi = query_rows.bounds(bucket)
        assert lo <= rows <= hi


def test_rank_takes_the_own_bucket_then_the_nearest_and_the_larger_at_a_tie() -> None:
    assert [query_rows.rank(b, 10) for b in (10, 11, 9, 12, 8)] == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------------------------------ the key


def test_studies_of_one_old_key_but_different_query_rows_are_separate_rows(tmp_path: Path) -> None:
    """(D=64 fp16 non-causal, Sk bucket 2048) three times: B*H*Sq 16384, 1M and 131072. Before
    the query-rows bucket, the smallest problem's µs won the one row and served the others."""
    store = FakeStore(summary("small", [trial(0, 50.0, P(bm=64))], rows=(1, 8, 0)),
                      summary("large", [trial(0, 900.0, P(bm=128, bn=128))], rows=(16, 32, 0)),
                      summary("mid", [trial(0, 120.0, P(bm=128))]))
    result = export_header(store, ["small", "large", "mid"], tmp_path / "h.h")
    assert [(r.study, r.query_rows, r.query_rows_bucket, r.max_seqlen, r.beat) for r in result.rows] == [
        ("small", 16384, 14, 2048, ()), ("mid", 131072, 17, 2048, ()), ("large", 1048576, 20, 2048, ())]
    assert "won its key" not in (tmp_path / "h.h").read_text()


def test_a_decode_study_does_not_replace_a_prefill_row(tmp_path: Path) -> None:
    """A non-causal decode study (Sq=1) of the prefill's Sk bucket, 25x faster by µs: both rows
    stay, and each problem is served its own study's row (the header read back by evotuner.tuned,
    which runs the header's select() rule)."""
    store = FakeStore(summary("prefill", [trial(0, 500.0, P(bm=128, bn=128))], s=4096),
                      summary("decode", [trial(0, 20.0, P(bm=64, bn=32))], s=4096, rows=(1, 32, 1)))
    header = tmp_path / "h.h"
    result = export_header(store, ["prefill", "decode"], header)
    assert [(r.study, r.query_rows_bucket, r.max_seqlen, r.beat) for r in result.rows] == [
        ("decode", 5, 4096, ()), ("prefill", 18, 4096, ())]
    table = tuned.load(header)
    prefill = table.pick(Problem(Shape(4, 16, 4096, 4096, 64)), H100)
    decode = table.pick(Problem(Shape(1, 32, 1, 4000, 64)), H100)
    assert prefill is not None and prefill.row.source == "flashcore row 1" and prefill.row.config["BLOCK_M"] == 128
    assert "its query-rows bucket (131073..262144 query rows" in prefill.why
    assert decode is not None and decode.row.source == "flashcore row 0" and decode.row.config["BLOCK_M"] == 64
    between = table.pick(Problem(Shape(1, 32, 64, 4096, 64)), H100)      # 2048 rows: bucket 11, decode's is nearer
    assert between is not None and between.row.source == "flashcore row 0" and "nearest query-rows bucket" in between.why


# ------------------------------------------------------------------------------------------ the C++ select()

#: D=64 fp16 non-causal rows of query-rows buckets 5, 12, 17 (Sk buckets 2048 and 8192) and one
#: causal row: (study, B, H, Sq, Sk).
_STUDIES = [("decode", 1, 32, 1, 4096), ("mid", 1, 32, 128, 1024), ("prefill", 4, 16, 2048, 2048),
            ("prefill_long", 1, 16, 8192, 8192), ("causal", 4, 16, 2048, 2048)]

_SELECT_PROGRAM = r"""
#include "h.h"
#include <cstdio>
#include <cstdlib>
using namespace flashcore::tuned;
// constexpr: checked at compile time too (rows: 0 mid, 1 prefill, 2 decode, 3 prefill_long, 4 causal)
static_assert(select(64, 0, false, 2048, 4 * 16 * 2048) == &kConfigs[1], "a prefill: the prefill row");
static_assert(select(64, 0, false, 2048, 32) == &kConfigs[2], "a decode step: the decode row");
static_assert(select(64, 0, false, 100000, 32) == &kConfigs[2], "a decode step past every Sk: still decode's");
static_assert(select(64, 0, false, 8000, 4 * 16 * 2048) == &kConfigs[3], "bucket 17's 8192 row");
static_assert(select(64, 0, false, 100, 4096) == &kConfigs[0], "4096 query rows: the mid row");
static_assert(select(64, 0, false, 100, 1LL << 40) == &kConfigs[1], "far above: the largest bucket");
static_assert(select(64, 0, true, 100, 1) == &kConfigs[4], "causal: its only row");
static_assert(select(64, 1, false, 100, 1) == nullptr, "no bf16 row");
static_assert(query_rows_bucket(131072) == 17 && query_rows_bucket(131073) == 18, "the rule");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static_assert(select(64, 0, false, 2048) == &kConfigs[1], "no query rows: the largest bucket");
#pragma GCC diagnostic pop
int main(int argc, char** argv) {
    // "b N": query_rows_bucket(N); "s QUERY_ROWS SEQLEN CAUSAL": index_of(select(64, fp16, ...))
    for (int i = 1; i + 1 < argc; ) {
        if (argv[i][0] == 'b') {
            std::printf("%lld\n", static_cast<long long>(query_rows_bucket(std::atoll(argv[i + 1]))));
            i += 2;
        } else {
            std::printf("%d\n", index_of(select(64, 0, std::atoi(argv[i + 3]) != 0, std::atoi(argv[i + 2]),
                                                std::atoll(argv[i + 1]))));
            i += 4;
        }
    }
    return 0;
}
"""


def _select_header(tmp_path: Path) -> Path:
    store = FakeStore(*[summary(name, [trial(0, 10.0 + k, P(bm=16 * (k + 1)))], s=sk, rows=(b, h, sq),
                                causal=name == "causal") for k, (name, b, h, sq, sk) in enumerate(_STUDIES)])
    header = tmp_path / "h.h"
    result = export_header(store, [s[0] for s in _STUDIES], header)
    assert [(r.study, r.query_rows_bucket, r.max_seqlen) for r in result.rows] == [
        ("mid", 12, 1024), ("prefill", 17, 2048), ("decode", 5, 4096), ("prefill_long", 17, 8192),
        ("causal", 17, 2048)]
    return header


def test_the_generated_select_picks_by_query_rows_as_the_python_does(tmp_path: Path) -> None:
    header = _select_header(tmp_path)
    (tmp_path / "main.cpp").write_text(_SELECT_PROGRAM)
    build = subprocess.run([_gxx(), "-std=c++17", "-Wall", "-Wextra", "-Werror", "-I", str(tmp_path),
                            str(tmp_path / "main.cpp"), "-o", str(tmp_path / "main")],
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    rng = random.Random(0)
    numbers = [0, 1, 2, 3, *(2**k + d for k in range(2, 63) for d in (-1, 0, 1)),
               *(rng.randrange(1, 2**63) for _ in range(200))]
    calls = [(qr, sk, c) for qr in (1, 2, 31, 32, 33, 64, 2048, 2049, 4096, 8192, 16384, 65536, 65537, 131072,
                                    131073, 10**6, 2**31 - 1)
             for sk in (1, 1000, 1024, 1025, 2048, 4096, 8192, 8193, 10**6) for c in (0, 1)]
    argv = [x for n in numbers for x in ("b", str(n))] + [x for qr, sk, c in calls for x in ("s", str(qr), str(sk), str(c))]
    ran = subprocess.run([str(tmp_path / "main"), *argv], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    out = [int(x) for x in ran.stdout.split()]
    assert out[:len(numbers)] == [query_rows.bucket(n) for n in numbers]
    assert out[:len(numbers)] == [max(0, n - 1).bit_length() for n in numbers]
    table = tuned.load(header)
    want = []
    for qr, sk, c in calls:      # B=1, H=1, Sq=qr: B*H*Sq = qr
        pick = table.pick(Problem(Shape(1, 1, qr, sk, 64), "fp16", bool(c)), H100)
        want.append(-1 if pick is None else int(re.fullmatch(r"flashcore row (\d+)", pick.row.source).group(1)))
    assert out[len(numbers):] == want
    assert want[calls.index((32, 2048, 0))] == 2 and want[calls.index((131072, 2048, 0))] == 1


def test_select_without_query_rows_is_deprecated(tmp_path: Path) -> None:
    """The four-argument select() (no query rows) still compiles, with a warning that says what to pass."""
    header = _select_header(tmp_path)
    (tmp_path / "old.cpp").write_text('#include "h.h"\nint main() { return flashcore::tuned::index_of('
                                      "flashcore::tuned::select(64, 0, false, 2048)) == 1 ? 0 : 1; }\n")
    built = subprocess.run([_gxx(), "-std=c++17", "-I", str(tmp_path), str(tmp_path / "old.cpp"), "-o",
                            str(tmp_path / "old")], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0 and "pass query_rows = B*H*Sq" in built.stderr, built.stderr
    assert subprocess.run([str(tmp_path / "old")], timeout=30).returncode == 0


# ------------------------------------------------------------------------------------------ old headers


#: A header exported by the previous format (evotuner export at e228ab9, test_export's three
#: FlashCore studies): rows keyed by the seqlen bucket alone, a four-argument select().
OLD_HEADER = Path(__file__).resolve().parent / "data" / "header_before_query_rows.h"


def test_a_header_exported_before_the_query_rows_bucket_is_refused_in_one_line(tmp_path: Path) -> None:
    old = tmp_path / "old.h"
    old.write_text(OLD_HEADER.read_text())
    assert "QUERY_ROWS" not in old.read_text() and "FLASHCORE_TUNED_0_MAX_SEQLEN" in old.read_text()
    with pytest.raises(ExportError) as exc:
        read_header(old)
    for error in (exc.value, pytest.raises(tuned.TunedError, tuned.load, old).value):
        text = str(error)
        assert "\n" not in text and str(old) in text and "re-export it" in text and "query-rows bucket" in text, text
    with pytest.raises(EvotunerError, match="re-export it"):     # the production build reads it the same way
        _build_extension_module().build(old, tmp_path / "ext")
    assert read_header(_select_header(tmp_path)).rows[0][3] == "QUERY_ROWS_BUCKET"   # a new one reads


# ------------------------------------------------------------------------------------------ edited headers


@pytest.mark.parametrize("edit,why", [
    (r"(FLASHCORE_TUNED_1_QUERY_ROWS_BUCKET\s+)17", "QUERY_ROWS_BUCKET is -3, not one of 0..63"),
    (r"(FLASHCORE_TUNED_1_QUERY_ROWS_BUCKET\s+)17", "QUERY_ROWS_BUCKET is 70, not one of 0..63"),
    (r"(FLASHCORE_TUNED_1_MAX_SEQLEN\s+)2048", "MAX_SEQLEN is 3000, not one of 512, 1024"),
    (r"(FLASHCORE_TUNED_1_DTYPE\s+)0", "DTYPE is 9, not one of 0, 1"),
    (r"(FLASHCORE_TUNED_1_IS_CAUSAL\s+)0", "IS_CAUSAL is 2, not one of 0..1"),
    (r"(FLASHCORE_TUNED_1_BLOCK_M\s+)\d+", "BLOCK_M is 99999999999, not one of 0..2147483647"),
    (r"(FLASHCORE_TUNED_1_QUERY_ROWS_BUCKET\s+17)", "FLASHCORE_TUNED_1_QUERY_ROWS_BUCKET is defined twice"),
    (r"#define FLASHCORE_TUNED_4_STAGES.*\n#define FLASHCORE_TUNED_4_MIN_BLOCKS.*\n()",
     "row 4 lacks FLASHCORE_TUNED_4_MIN_BLOCKS, FLASHCORE_TUNED_4_STAGES (row 0 has them)"),
])
def test_a_header_section_edited_by_hand_is_refused_in_one_line(tmp_path: Path, edit: str, why: str) -> None:
    """A row's value export never writes (a query-rows bucket no B*H*Sq has, a seqlen bucket that is not
    an edge, a dtype code, a config value past int32), a macro defined twice or a row missing kernel
    parameters (a header cut short) is refused by every reader, not served as a row no call matches."""
    header = _select_header(tmp_path)
    text = header.read_text()
    value = re.search(r"is (-?\d+),", why)
    if "twice" in why:
        edited = re.sub(edit, r"\1\n#define FLASHCORE_TUNED_1_QUERY_ROWS_BUCKET 5", text, count=1)
    elif value:
        edited = re.sub(edit, lambda m: m.group(1) + value.group(1), text, count=1)
    else:      # the last row's last two parameters cut off
        edited = text[:re.search(edit, text).start()]
    assert edited != text
    header.write_text(edited)
    with pytest.raises(ExportError) as exc:
        read_header(header)
    assert why in str(exc.value) and str(header) in str(exc.value) and "\n" not in str(exc.value), exc.value
    with pytest.raises(tuned.TunedError, match=re.escape(why)):
        tuned.load(header)
    with pytest.raises(EvotunerError, match=re.escape(why)):      # refused before anything is built
        _build_extension_module().build(header, tmp_path / "ext", nvcc="/nonexistent/nvcc")


@pytest.mark.parametrize("edit,repl,why", [
    (r"(FLASHCORE_TUNED_0_BLOCK_N\s+)\d+", r"\1abc", "FLASHCORE_TUNED_0_BLOCK_N is 'abc', not an integer"),
    (r"(FLASHCORE_TUNED_3_STAGES)\s+\d+", r"\1", "FLASHCORE_TUNED_3_STAGES is '', not an integer"),
    (r"FLASHCORE_TUNED_(\d+)_NUM_WARPS", r"FLASHCORE_TUNED_\1_CONSUMER_WGS",
     "FLASHCORE_TUNED_0_CONSUMER_WGS: not a flashcore kernel parameter"),
    (r"#define FLASHCORE_TUNED_\d+_MIN_BLOCKS.*\n", "", "no FLASHCORE_TUNED_0_MIN_BLOCKS: the flashcore kernel needs it"),
])
def test_a_row_edited_out_of_the_family_s_parameters_is_refused(tmp_path: Path, edit: str, repl: str, why: str) -> None:
    """A value that is not an integer (once skipped unseen, the row served without it), another
    family's parameter, or one the kernel needs taken out of every row: refused by every reader, not
    served as a config the family cannot build."""
    header = _select_header(tmp_path)
    text = header.read_text()
    edited = re.sub(edit, repl, text)
    assert edited != text
    header.write_text(edited)
    with pytest.raises(ExportError) as exc:
        read_header(header)
    assert why in str(exc.value) and "\n" not in str(exc.value), exc.value
    with pytest.raises(tuned.TunedError, match=re.escape(why)):
        tuned.load(header)


def test_build_extension_leaves_no_folder_when_refused_and_never_writes_through_a_link(tmp_path: Path) -> None:
    """A build refused for its nvcc creates no --output folder; a reused --output folder whose
    include/<config header> or src/row_<i>.cu is a link to a file elsewhere is refused in one line,
    and the link's target keeps its text (the build wrote through such links before)."""
    ext = _build_extension_module()
    header = _select_header(tmp_path)
    with pytest.raises(EvotunerError, match="nvcc"):
        ext.build(header, tmp_path / "out", nvcc=str(tmp_path / "no-nvcc"))
    assert not (tmp_path / "out").exists()
    victim = tmp_path / "victim.txt"
    for linked in ("include/flashcore_config.h", "src/row_0.cu"):
        victim.write_text("keep\n")
        out = tmp_path / f"reused_{linked.split('/')[0]}"
        (out / "include").mkdir(parents=True)
        (out / "src").mkdir()
        (out / linked).symlink_to(victim)
        with pytest.raises(EvotunerError, match="symbolic link") as exc:
            ext.generate_sources(read_header(header), header, out, "flashcore", ext.FLASHCORE, ext.FLASHCORE.folder())
        assert "\n" not in str(exc.value) and victim.read_text() == "keep\n"
