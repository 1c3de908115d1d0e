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
