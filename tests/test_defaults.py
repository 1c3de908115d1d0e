"""The kernel's recommended configs (evotuner.defaults): the most specific table wins,
and a table that only overrides inherited keys still counts when it has sub-tables."""

from evotuner.defaults import default_config, parse_defaults, recommended
from evotuner.problem import Problem, Shape

NESTED = """
[d128]
BLOCK_M = 128
BLOCK_N = 64
NUM_WARPS = 4
STAGES = 2
MIN_BLOCKS = 1
[d128.causal]
BLOCK_N = 128
[d128.causal.bf16]
STAGES = 3
"""


def test_overrides_with_sub_tables_are_kept():
    e = parse_defaults(NESTED)
    assert str(default_config(128, "fp16", False, entries=e)) == "BLOCK_M=128,BLOCK_N=64,MIN_BLOCKS=1,NUM_WARPS=4,STAGES=2"
    assert str(default_config(128, "fp16", True, entries=e)) == "BLOCK_M=128,BLOCK_N=128,MIN_BLOCKS=1,NUM_WARPS=4,STAGES=2"
    assert str(default_config(128, "bf16", True, entries=e)) == "BLOCK_M=128,BLOCK_N=128,MIN_BLOCKS=1,NUM_WARPS=4,STAGES=3"


def test_recommended_is_the_packaged_default_for_the_problem():
    problem = Problem(Shape(1, 1, 64, 64, 64), "bf16", causal=True)
    assert recommended(problem) == (default_config(64, "bf16", True),)


SHORT = NESTED + """
[d128.short]
causal = false
max_query_rows = 16384
BLOCK_M = 64
"""


def test_a_max_query_rows_entry_applies_only_up_to_its_rows():
    import pytest

    from evotuner.defaults import pick_config
    from evotuner.errors import EvotunerError

    e = parse_defaults(SHORT)
    small = pick_config(e, 128, "fp16", False, query_rows=16384)     # B*H*Sq at the limit
    assert small["BLOCK_M"] == 64 and small["BLOCK_N"] == 64          # the rest inherited from [d128]
    assert pick_config(e, 128, "fp16", False, query_rows=16385)["BLOCK_M"] == 128
    assert pick_config(e, 128, "fp16", False)["BLOCK_M"] == 128       # rows unknown: never the short entry
    assert pick_config(e, 128, "fp16", True, query_rows=64)["BLOCK_N"] == 128   # causal: its own table
    with pytest.raises(EvotunerError, match="max_query_rows"):
        parse_defaults(SHORT.replace("16384", "0"))


def test_of_two_row_limits_the_tighter_one_wins_whatever_the_file_order():
    from evotuner.defaults import pick_config

    mid = """
[d128.mid]
causal = false
max_query_rows = 65536
BLOCK_M = 32
"""
    for text in (SHORT + mid, NESTED + mid + SHORT[len(NESTED):]):
        e = parse_defaults(text)
        assert [pick_config(e, 128, "fp16", False, query_rows=r)["BLOCK_M"] for r in (100, 16384, 16385, 65536,
                                                                                      65537)] == [64, 64, 32, 32, 128]


def test_the_hopper_family_picks_one_warpgroup_at_the_latency_shape():
    """Measured (kernels/hopper/defaults.toml): at 1,8,512,64 one consumer warpgroup is
    1.18x cuDNN where the big-tile config is 0.92x; large shapes keep the big tiles."""
    from evotuner.family.registry import get_family

    hopper = get_family("hopper")

    def tiles(b: int, h: int, s: int, causal: bool = False) -> tuple[int, int]:
        cfg = hopper.recommended_configs(Problem(Shape(b, h, s, s, 64), "fp16", causal))[0]
        return cfg["CONSUMER_WGS"], cfg.as_dict().get("CTAS_PER_SM", 1)

    # [d64.short] up to 8448 rows, [d64.mid] (one warpgroup, two CTAs per SM) up to 33792, then [d64]
    assert [tiles(1, 8, 512), tiles(1, 8, 1024), tiles(1, 16, 1024), tiles(2, 16, 1024), tiles(1, 8, 4096),
            tiles(4, 16, 1024), tiles(16, 16, 2048)] == [(1, 1), (1, 1), (1, 2), (1, 2), (1, 2), (3, 1), (3, 1)]
    # causal: [d64.causal.mid] up to 33792 rows, then [d64.causal]
    assert [tiles(1, 8, 512, True), tiles(2, 16, 1024, True), tiles(4, 16, 1024, True)] == [(1, 2), (1, 2), (3, 1)]


def test_default_config_without_a_shape_is_the_size_independent_entry():
    assert default_config(64, "fp16", False, family="hopper")["CONSUMER_WGS"] == 3
