"""A hostile user's walk of --lengths and of problem descriptions, without a GPU: what it found
and what was fixed -- each a one-line error with a true remedy (never an unexpected ValueError),
nothing silently accepted that cannot run, nothing silently misread, nothing written."""

from __future__ import annotations

import pytest

from evotuner.errors import ShapeError
from evotuner.lengths import packed_problem, parse_lengths
from evotuner.problem import Problem, Shape
from cli_helpers import assert_one_line_error, run, scaffold_env

SHAPE = "H=4,HKV=2,D=64"


@pytest.fixture(autouse=True)
def env(monkeypatch, build_cache_dir, tmp_path):
    scaffold_env(monkeypatch, build_cache_dir, tmp_path)


def _search(capsys, tmp_path, *argv):
    db = tmp_path / "studies.db"
    code, out, err = run(capsys, "search", "--study", "s", *argv, "--trials", 1, "--storage", f"sqlite:///{db}")
    return code, out, err, db


@pytest.mark.parametrize("spec, fragments", [
    # '²'.isdigit() is true, int('²') a ValueError: it surfaced as "unexpected ValueError"
    ("5,²", ["--lengths", "'²' is not a sequence length", "whole numbers"]),
    # past the 4300 digits int() reads: a ValueError too
    ("1" * 5000, ["--lengths", "a length has 5000 digits", "use at most 2147483647"]),
    ("random:" + "9" * 5000 + ":1..2", ["N has 5000 digits", "use at most 65535"]),
    ("random:4:1.." + "9" * 5000, ["HI has 5000 digits", "use at most 2147483647"]),
    ("random:4:1..2:seed=" + "9" * 5000, ["the seed has 5000 digits", "use at most 4294967295"]),
    # a draw whose range passes what the kernels hold was accepted whenever the draw fell short
    ("random:1:1..2147483648", ["HI=2147483648 does not fit the kernels' 32-bit offsets", "at most 2147483647"]),
    # seeds beyond --seed's range were taken (the same draw may not be asked for two ways)
    ("random:4:1..2:seed=4294967296", ["seed=4294967296 is out of range", "0 to 4294967295"]),
    # '@' alone read the current folder: "@.: cannot read it (Is a directory)"
    ("@", ["--lengths '@': no file named after @", "@FILE"]),
])
def test_bad_lengths_end_in_one_line_and_write_nothing(capsys, tmp_path, spec, fragments):
    code, out, err, db = _search(capsys, tmp_path, "--shape", SHAPE, "--lengths", spec)
    assert_one_line_error(code, out, err, *fragments)
    assert len(err) < 400 and not db.exists()


def test_a_recorded_batch_with_a_superscript_or_a_byte_order_mark(capsys, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("5\n²\n", encoding="utf-8")
    code, out, err, db = _search(capsys, tmp_path, "--shape", SHAPE, "--lengths", f"@{bad}")
    assert_one_line_error(code, out, err, f"@{bad}", "'²' is not a sequence length")
    assert not db.exists()
    # a file saved with a byte order mark (Windows editors) holds the lengths it shows
    bom = tmp_path / "bom.txt"
    bom.write_bytes(b"\xef\xbb\xbf128,4096\r\n77\r\n")
    assert parse_lengths(f"@{bom}") == (128, 4096, 77)


def test_unicode_decimal_digits_read_as_their_numbers_and_nothing_else_does():
    assert parse_lengths("١٢٣,５") == (123, 5)          # what int() reads (as --shape does)
    for spec in ("²", "½", "Ⅻ", "1²"):
        with pytest.raises(ShapeError, match="is not a sequence length"):
            parse_lengths(spec)


def test_a_packed_head_dim_only_the_dense_kernels_have_is_refused_with_the_packed_ones(capsys, tmp_path):
    # D=32 (FlashCore only): the family pick refused it offering "use one of 32, 64, 96, 128, 256"
    code, out, err, db = _search(capsys, tmp_path, "--shape", "H=4,D=32", "--lengths", "5,6")
    assert_one_line_error(code, out, err, "D=32 has no kernel for packed variable-length batches",
                          "use one of 64, 96, 128, 192, 256")
    assert "32, 64" not in err and not db.exists()
    with pytest.raises(ShapeError, match="D=32 has no kernel for packed"):
        packed_problem("H=4,D=32", "5", None, dtype="fp16", causal=False)


@pytest.mark.parametrize("shape, fragments", [
    ("H=1e3,D=64", ["H='1e3' is not an integer", "whole number"]),          # had no remedy
    ("H=" + "3" * 5000 + ",D=64", ["H has 5000 digits", "use at most 2147483647"]),   # "is not an integer"
    ("H=" + "3" * 400 + ",D=64", ["H=a number of about 400 digits does not fit", "at most 2147483647"]),
])
def test_shape_numbers_that_cannot_be_read_say_why_in_a_short_line(capsys, tmp_path, shape, fragments):
    code, out, err, db = _search(capsys, tmp_path, "--shape", shape, "--lengths", "5")
    assert code == 2 and "Traceback" not in out + err
    line = err.strip()
    assert "\n" not in line and len(line) < 300, line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    assert not db.exists()


def test_huge_numbers_given_to_the_library_are_refused_not_crashed_on():
    with pytest.raises(ShapeError, match="about 5001 digits does not fit"):
        Problem.packed([10**5000], heads=4, head_dim=64)
    with pytest.raises(ShapeError, match="about 5001 digits is not an integer >= 0"):
        Problem.packed([-10**5000], heads=4, head_dim=64)
    with pytest.raises(ShapeError, match="does not fit"):
        Shape(10**5000, 1, 1, 1, 64)


STORED = {"batch": 2, "heads": 4, "seqlen_q": 5, "seqlen_k": 5, "head_dim": 64, "dtype": "fp16", "causal": False}


@pytest.mark.parametrize("change, match", [
    ({"causal": "false"}, "causal='false' is not true or false"),    # was read as causal
    ({"causal": 0}, "causal=0 is not true or false"),
    ({"varlen": "no"}, "varlen='no' is not true or false"),           # was read as packed
    ({"batch": 2.5}, "batch must be a positive integer, got 2.5"),   # was read as 2
    ({"heads": "4"}, "heads must be a positive integer, got '4'"),
    ({"batch": None}, "batch must be a positive integer, got None"),  # was a TypeError
    ({"batch": float("nan")}, "got nan"),                             # was a ValueError
])
def test_a_stored_problem_of_the_wrong_types_is_refused_not_misread(change, match):
    with pytest.raises(ShapeError, match=match):
        Problem.from_dict({**STORED, **change})


def test_a_stored_problem_missing_keys_names_them():
    with pytest.raises(ShapeError, match="problem: head_dim, causal missing"):
        Problem.from_dict({k: v for k, v in STORED.items() if k not in ("head_dim", "causal")})
    packed = Problem.packed([5, 0, 7], [3, 9, 0], heads=4, head_dim=64, heads_kv=2, causal=True)
    assert Problem.from_dict(packed.as_dict()) == packed
    dense = Problem(Shape(2, 4, 5, 5, 64), "bf16", True)
    assert Problem.from_dict(dense.as_dict()) == dense


def test_a_packed_grid_past_the_kernels_32_bit_tile_count_is_refused():
    """The grid spans the longest sequence for every sequence and head: 4096 sequences, one of
    1M rows, 32 heads is 2^31 tiles of 64 rows for about 8.6 GB of Q, which a GPU holds."""
    from evotuner.errors import ShapeError
    from evotuner.problem import Problem, Shape

    lengths = [1] * 4095 + [1 << 20]
    with pytest.raises(ShapeError, match="past the kernel's 32-bit count"):
        Problem.packed(lengths, heads=32, head_dim=128)
    with pytest.raises(ShapeError, match="past the kernel's 32-bit count"):   # as flash_attention_varlen makes it
        Problem(Shape(4096, 32, 1 << 20, 1 << 20, 128), varlen=True)
    assert Problem.packed(lengths, heads=16, head_dim=128).shape.batch == 4096    # 2^30 tiles: fine


def test_a_study_of_other_lengths_that_read_the_same_says_where_they_differ(tmp_path):
    from evotuner.errors import StudyMismatchError
    from evotuner.problem import Problem
    from evotuner.space import load_space
    from evotuner.storage import StudyStore

    made = Problem.packed([1, 2, 3, 4, 5], heads=4, head_dim=64, heads_kv=2)
    asked = Problem.packed([5, 4, 3, 2, 1], heads=4, head_dim=64, heads_kv=2)
    assert str(made) == str(asked)                   # the summaries cannot tell them apart
    space = load_space(family="hopper")
    with StudyStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        store.create_study("v", made, space, "random", 0, source_hash="x", nvcc_version="13.0")
        with pytest.raises(StudyMismatchError, match="query lengths differ at sequence 0: 1 in the study, 5 here"):
            store.load_study("v", problem=asked, space=space)


def test_resume_of_a_packed_study_takes_the_sizes_its_search_was_given(tmp_path):
    """`resume --shape H=4,HKV=2,D=64` (what the packed study was searched with) was refused as
    missing B; sizes given are checked against the study's, and a mismatch names its problem."""
    from evotuner import session
    from evotuner.errors import StudyMismatchError
    from evotuner.problem import Problem, parse_shape_values
    from evotuner.space import load_space
    from evotuner.storage import StudyStore

    made = Problem.packed([3, 9, 4], heads=4, head_dim=64, heads_kv=2)
    with StudyStore(f"sqlite:///{tmp_path / 's.db'}") as store:
        store.create_study("v", made, load_space(family="hopper"), "random", 0, source_hash="x", nvcc_version="13.0")
        assert session.resume_study(store, "v", shape=parse_shape_values("H=4,HKV=2,D=64")).problem == made
        with pytest.raises(StudyMismatchError, match=r"tunes .*3 sequences.*, not --shape H=8,D=64") as e:
            session.resume_study(store, "v", shape=parse_shape_values("H=8,D=64"))
        assert "--shape H=8,D=64`" in e.value.remedy


@pytest.mark.parametrize("value", [None, 12.5, 7])
def test_parse_whole_refuses_what_is_not_text_in_one_line(value):
    """A value that is not text (a JSON cell, None) is refused in the one-line form, as before
    the digit count was added (that version sliced it and raised a TypeError)."""
    from evotuner.errors import EvotunerError
    from evotuner.numbers import parse_whole

    with pytest.raises(EvotunerError, match="is not an integer"):
        parse_whole(value, "x")
