"""A packed variable-length problem without a GPU: its lengths (validation, the --lengths
spellings, --shape agreeing with them), how it is stored (a dense problem's dict and
static key unchanged), its FLOPs and query rows, how it reads in messages, the space's
refusal of split-KV for it, and the hopper cost model's view of its sequences."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from evotuner.config import KernelConfig
from evotuner.errors import ShapeError
from evotuner.family.registry import get_family
from evotuner.kernels.hopper.cost import estimate_us
from evotuner.lengths import packed_problem, parse_lengths
from evotuner.problem import Problem, Shape, causal_pairs
from evotuner.space import load_space

HOPPER = get_family("hopper")
BAR = "random:16:128..8192:seed=0"     # the speed bar: 16 sequences of 128..8192


def _packed(lengths, lengths_k=None, **kw) -> Problem:
    return Problem.packed(lengths, lengths_k, heads=kw.pop("heads", 4), head_dim=kw.pop("head_dim", 128), **kw)


# -- the problem ---------------------------------------------------------------------------------


def test_a_packed_problem_derives_its_shape_from_its_lengths():
    p = _packed([5, 0, 300, 77], [900, 12, 0, 1], heads=8, heads_kv=2, dtype="bf16", causal=True)
    assert p.varlen and p.shape == Shape(4, 8, 300, 900, 128, 2)
    assert p.lengths_q == (5, 0, 300, 77) and p.lengths_k == (900, 12, 0, 1)
    assert p.sequences() == ((5, 900), (0, 12), (300, 0), (77, 1))
    same = _packed([5, 7])
    assert same.lengths_k == same.lengths_q == (5, 7)     # keys as long as queries when not given
    assert _packed([5, 7], [5, 7]) == same and hash(_packed([5, 7], [5, 7])) == hash(same)
    with pytest.raises(Exception):
        same.lengths_q = (1,)                             # frozen


@pytest.mark.parametrize("lengths, lengths_k, match", [
    ([], None, "no sequences"),
    ([0, 0], None, "every sequence is empty"),
    ([3, -1], None, "not an integer >= 0"),
    ([3, 2.5], None, "not an integer >= 0"),
    ([3, True], None, "not an integer >= 0"),
    ([3, 4], [4], "2 key lengths|1 key lengths for 2"),
    ([3, 4], [0, 0], "no sequence has a key"),
    ([2**31], None, "32-bit"),
    ([2**30, 2**30], None, "rows in all"),
    ([1] * 65536, None, "at most 65535"),
])
def test_bad_lengths_are_refused_with_a_remedy(lengths, lengths_k, match):
    with pytest.raises(ShapeError, match=match) as info:
        _packed(lengths, lengths_k)
    assert info.value.remedy and "\n" not in str(info.value)


def test_lengths_must_agree_with_the_shape_and_need_varlen():
    with pytest.raises(ShapeError, match="does not match the lengths"):
        Problem(Shape(3, 4, 100, 100, 128), varlen=True, lengths_q=(5, 100))
    with pytest.raises(ShapeError, match="packed variable-length"):
        Problem(Shape(2, 4, 100, 100, 128), lengths_q=(5, 100))
    with pytest.raises(ShapeError, match="without query lengths"):
        Problem(Shape(2, 4, 100, 100, 128), varlen=True, lengths_k=(5, 100))
    assert Problem(Shape(2, 4, 100, 100, 128), varlen=True, lengths_q=[5, 100]).lengths_q == (5, 100)


def test_a_dense_problem_is_stored_and_keyed_as_before():
    dense = Problem(Shape(16, 32, 2048, 2048, 128, 8), "bf16", True)
    assert dense.as_dict() == {"batch": 16, "heads": 32, "seqlen_q": 2048, "seqlen_k": 2048, "head_dim": 128,
                               "dtype": "bf16", "causal": True, "heads_kv": 8}
    assert dense.static_key() == {"head_dim": 128, "dtype": "bf16", "causal": True}
    assert Problem.from_dict(dense.as_dict()) == dense
    bare = Problem(Shape(4, 8, 1, 1, 64), varlen=True)      # a build's key: packed, no lengths
    assert "lengths_q" not in bare.as_dict() and Problem.from_dict(bare.as_dict()) == bare


def test_a_packed_problem_round_trips_through_its_stored_dict():
    p = _packed([5, 0, 300], [9, 12, 1], heads=8, heads_kv=4, causal=True)
    stored = json.loads(json.dumps(p.as_dict(), sort_keys=True))
    assert stored["lengths_q"] == [5, 0, 300] and stored["lengths_k"] == [9, 12, 1] and stored["varlen"]
    assert Problem.from_dict(stored) == p
    same = _packed([5, 7])
    assert "lengths_k" not in same.as_dict() and Problem.from_dict(same.as_dict()) == same
    # the lengths are never compiled in: one build serves every packed problem of D, dtype, causal
    assert p.static_key() == Problem(Shape(1, 1, 1, 1, 128), causal=True, varlen=True).static_key()
    with pytest.raises(ShapeError, match="not a list"):
        Problem.from_dict({**same.as_dict(), "lengths_q": "5,7"})
    with pytest.raises(ShapeError, match="not an integer"):
        Problem.from_dict({**same.as_dict(), "lengths_q": [5, "7"]})


def test_flops_and_query_rows_sum_over_the_sequences():
    lq, lk = (5, 0, 300, 77), (900, 12, 0, 1)
    p = _packed(lq, lk, heads=8, heads_kv=2)
    assert p.flops == 4.0 * 8 * 128 * sum(q * k for q, k in zip(lq, lk))
    assert p.query_rows == 8 * sum(lq)
    c = _packed(lq, lk, heads=8, heads_kv=2, causal=True)
    # top-left per sequence: query i sees keys 0..min(i, Sk-1)
    brute = sum(sum(min(i + 1, k) for i in range(q)) for q, k in zip(lq, lk))
    assert c.flops == 4.0 * 8 * 128 * brute
    for q, k in itertools.product(range(0, 9), range(0, 9)):
        assert causal_pairs(q, k) == sum(min(i + 1, k) for i in range(q))
    assert p.tflops(10.0) == pytest.approx(p.flops / 10e-6 / 1e12)


def test_a_packed_problem_reads_shortly_in_messages():
    bar = packed_problem("H=32,HKV=8,D=128", BAR, None, dtype="fp16", causal=True)
    text = str(bar)
    assert text.startswith("H=32,HKV=8,D=128 fp16 causal, 16 sequences, q ")
    assert f"q {min(bar.lengths_q)}..{max(bar.lengths_q)} (total {sum(bar.lengths_q)})" in text
    assert len(text) < 80
    few = _packed([5, 0, 300], [9, 12, 1], heads=2)
    assert str(few) == "H=2,D=128 fp16 non-causal, 3 sequences, q 5,0,300, k 9,12,1"
    assert str(Problem(Shape(2, 4, 8, 8, 64), varlen=True)) == "B=2,H=4,S=8,D=64 fp16 non-causal packed (variable lengths)"


# -- --lengths -----------------------------------------------------------------------------------


def test_the_three_spellings_of_lengths(tmp_path):
    assert parse_lengths("128, 4096,0") == (128, 4096, 0)
    drawn = parse_lengths(BAR)
    assert len(drawn) == 16 and all(128 <= n <= 8192 for n in drawn)
    assert parse_lengths(BAR) == drawn and parse_lengths("random:16:128..8192") == drawn   # seed 0 by default
    assert parse_lengths("random:16:128..8192:seed=1") != drawn
    assert parse_lengths("random:3:7..7") == (7, 7, 7)
    batch = tmp_path / "batch.txt"
    batch.write_text("# a recorded batch\n12 300\n0,5  # the last two\n")
    assert parse_lengths(f"@{batch}") == (12, 300, 0, 5)


@pytest.mark.parametrize("text, match", [
    ("128,x", "'x' is not a sequence length"),
    ("128,-3", "is not a sequence length"),
    ("", "no sequence lengths|is not a sequence length"),
    ("random:16:8192..128", "LO=8192 is above HI=128"),
    ("random:0:1..2", "0 sequences"),
    ("random:16:128-8192", "cannot read the draw"),
    ("@/nonexistent/lengths.txt", "cannot read it"),
])
def test_bad_lengths_options_name_the_option_and_the_fix(text, match):
    with pytest.raises(ShapeError, match=match) as info:
        parse_lengths(text)
    assert str(info.value).startswith("--lengths") and info.value.remedy


def test_shape_options_of_a_packed_problem():
    p = packed_problem("H=32,HKV=8,D=128", "100,4096", "50,8000", dtype="bf16", causal=False)
    assert p.shape == Shape(2, 32, 4096, 8000, 128, 8) and p.dtype == "bf16"
    assert packed_problem("B=2,H=32,HKV=8,SQ=4096,SK=8000,D=128", "100,4096", "50,8000",
                          dtype="bf16", causal=False) == p
    with pytest.raises(ShapeError, match="B=3 contradicts the lengths") as info:
        packed_problem("B=3,H=32,D=128", "100,4096", None, dtype="fp16", causal=False)
    assert "drop B and S" in str(info.value)
    with pytest.raises(ShapeError, match="SQ=100 contradicts"):
        packed_problem("H=32,S=100,D=128", "100,4096", None, dtype="fp16", causal=False)
    with pytest.raises(ShapeError, match="missing dimension H"):
        packed_problem("D=128", "100", None, dtype="fp16", causal=False)
    with pytest.raises(ShapeError, match="--lengths-k: 1 key lengths for 2"):
        packed_problem("H=4,D=128", "100,4096", "7", dtype="fp16", causal=False)


# -- the space and the cost model ----------------------------------------------------------------


def test_a_packed_study_searches_no_split_kv_or_head_packing():
    p = packed_problem("H=32,HKV=8,D=128", BAR, None, dtype="fp16", causal=True)
    space = load_space(HOPPER.space_for(p))
    assert space.path.endswith("hopper.toml") and "SPLITS" not in space.names
    assert all(c["PACK_GQA"] == 0 for c in space.feasible(p))       # constraint pack_gqa: packed batches
    assert HOPPER.recommended_configs(p)[0].as_dict().get("PACK_GQA", 0) == 0
    split = load_space(HOPPER.space_for(Problem(Shape(1, 32, 1, 4096, 128, 8))))
    assert {"SPLITS", "PACK_GQA"} <= set(split.names)
    assert all(c["SPLITS"] == 1 and c["PACK_GQA"] == 0 for c in split.feasible(p))
    some = next(c for c in split.feasible(Problem(Shape(1, 32, 1, 4096, 128, 8))) if c["SPLITS"] > 1)
    why = split.violated(some, p)
    assert why is not None and "not built for packed variable-length batches" in why.message
    assert split.violated(some, Problem(Shape(1, 32, 1, 4096, 128, 8))) is None


def test_only_a_family_with_a_packed_kernel_takes_a_packed_problem():
    p = _packed([5, 300], head_dim=64)
    assert HOPPER.unsupported(p) is None
    why = get_family("flashcore").unsupported(p)
    assert why and "packed variable-length" in why


CONFIG = KernelConfig.parse("BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,"
                            "SCHED=2,RESCALE_LOG2=8,EXP_EMU=0").as_dict()


def test_cost_model_of_equal_lengths_is_the_dense_problems():
    for causal, sched in itertools.product((False, True), (0, 2)):
        c = {**CONFIG, "SCHED": sched}
        dense = Problem(Shape(4, 16, 2048, 2048, 128), causal=causal)
        packed = _packed([2048] * 4, heads=16, causal=causal)
        assert estimate_us(c, packed) == pytest.approx(estimate_us(c, dense), rel=1e-9)


def test_cost_model_counts_each_sequences_own_tiles():
    long = _packed([8192, 128, 128, 128], heads=8)
    padded = Problem(Shape(4, 8, 8192, 8192, 128))              # the dense problem of the longest lengths
    assert estimate_us(CONFIG, long) < 0.5 * estimate_us(CONFIG, padded)
    # empty sequences cost nothing; a sequence twice as long costs more
    assert estimate_us(CONFIG, _packed([4096, 0, 0], heads=8)) == pytest.approx(
        estimate_us(CONFIG, _packed([4096], heads=8)), rel=1e-9)
    assert estimate_us(CONFIG, _packed([4096, 4096], heads=8)) > estimate_us(CONFIG, _packed([4096], heads=8))
    # causal per sequence: about half the non-causal time at long lengths
    causal = estimate_us(CONFIG, _packed([8192] * 8, heads=16, causal=True))
    assert 0.4 < causal / estimate_us(CONFIG, _packed([8192] * 8, heads=16)) < 0.65
    # spills stay predicted failures
    assert estimate_us({**CONFIG, "REG_CONS": 64}, long) == math.inf


def test_cost_model_ranks_the_speed_bar_sensibly():
    """The issue's bar (16 sequences of 128..8192, D=128, causal): every feasible config gets
    a finite or spill estimate, the best ones are big tiles, and the ranking is not the
    padded dense problem's time (the sequences' own tiles are counted)."""
    p = packed_problem("H=32,HKV=8,D=128", BAR, None, dtype="fp16", causal=True)
    space = load_space(HOPPER.space_for(p))
    configs = list(itertools.islice(space.feasible(p), 0, None, 5))
    times = {KernelConfig.of(c.as_dict()): estimate_us(c.as_dict(), p) for c in configs}
    finite = sorted(((t, c) for c, t in times.items() if math.isfinite(t)), key=lambda tc: (tc[0], str(tc[1])))
    assert finite and all(t > 0 for t, _ in finite)
    best = finite[0][1]
    assert best["CONSUMER_WGS"] >= 2 and best["BLOCK_N"] >= 128
    padded = Problem(Shape(16, 32, max(p.lengths_q), max(p.lengths_q), 128, 8), causal=True)
    assert estimate_us(best.as_dict(), p) < estimate_us(best.as_dict(), padded)
