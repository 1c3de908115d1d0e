"""The hopper spaces with CTA pairs offered (CLUSTER values [1, 2]).

The packaged hopper.toml and hopper_wide.toml list CLUSTER = [1] (pairs measured up to 14%
slower on the H100 and never faster by more than 1%, docs/measurements/cluster/README.md), so
a search never proposes them;
the tests that hold the space's ``cluster`` constraint against the kernel's static_asserts
load a copy listing [1, 2], as a user who wants to search pairs would write it.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from evotuner.space import SearchSpace, load_space

_VALUES = re.compile(r"^(\[params\.CLUSTER\]\nvalues = )\[1\]$", re.MULTILINE)


_NARROWED = re.compile(r"^(\[params\.(?:PACK_GQA|TILE_OVERLAP)\]\nvalues = )\[0, 1\]$", re.MULTILINE)


def with_pairs(space_file: Path | str) -> SearchSpace:
    """``space_file`` loaded with CLUSTER's values [1, 2] (it must list exactly [1]) and, to stay
    under the space size limit (evotuner.spacelimits), PACK_GQA's and TILE_OVERLAP's [0] (CTA
    pairs are tested on query tiles, not on packed heads or cross-tile pipelining)."""
    text = Path(space_file).read_text()
    paired, n = _VALUES.subn(r"\g<1>[1, 2]", text)
    if n != 1:
        raise ValueError(f"{space_file}: no [params.CLUSTER] with values = [1]")
    paired = _NARROWED.sub(r"\g<1>[0]", paired)
    with tempfile.TemporaryDirectory(prefix="evotuner-paired-") as tmp:
        path = Path(tmp) / Path(space_file).name
        path.write_text(paired)
        return load_space(path)
