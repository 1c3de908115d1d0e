"""The query-rows bucket: one rule for the exported header's key and its ``select()``, the
served tuned tables (:mod:`evotuner.tuned`) and the production extensions.

A problem's query rows are B*H*Sq: the batch times the query heads times the query length
(a call that packs grouped query heads into one tile does not change the product). Bucket
``b`` holds ``2^(b-1) < rows <= 2^b``; bucket 0 holds at most one row. A decode step of 32
query heads (B=1, H=32, Sq=1: 32 rows) is bucket 5, a prefill of B=4, H=16, S=2048 (131072
rows) bucket 17: their configs never compete for one header row.

:func:`rank` orders a header's buckets for a call: the call's own bucket first, then by how
many doublings a bucket lies from it, the larger bucket first at the same distance (a config
tuned on more query rows only under-fills the GPU on fewer; one tuned on fewer, a split-KV
decode config, spends its splits where a large problem has tiles enough).

Both functions are in the subset :mod:`evotuner.compiler.cxx` translates, and
:mod:`evotuner.export_render` writes them into every section of an exported header as
``constexpr query_rows_bucket`` and ``query_rows_rank``: the header's ``select()`` computes
what Python computes (tests/test_export.py runs both on the same calls).
"""

from __future__ import annotations

#: 2^32, 2^16, 2^8, 2^4, 2^2: the steps of :func:`bucket`'s binary search.
_P32, _P16, _P8, _P4, _P2 = 4294967296, 65536, 256, 16, 4


def bucket(rows):
    """The query-rows bucket of rows = B*H*Sq: ceil(log2(rows)), 0 for at most one row, so
    bucket b holds 2^(b-1) < rows <= 2^b. (The bit length of rows - 1, by binary search: the
    rule is rendered as C++, which has no loop here.)"""
    n0 = rows - 1 if rows > 1 else 0
    b32 = 32 if n0 >= _P32 else 0
    n1 = n0 // _P32 if n0 >= _P32 else n0
    b16 = 16 if n1 >= _P16 else 0
    n2 = n1 // _P16 if n1 >= _P16 else n1
    b8 = 8 if n2 >= _P8 else 0
    n3 = n2 // _P8 if n2 >= _P8 else n2
    b4 = 4 if n3 >= _P4 else 0
    n4 = n3 // _P4 if n3 >= _P4 else n3
    b2 = 2 if n4 >= _P2 else 0
    n5 = n4 // _P2 if n4 >= _P2 else n4
    b1 = 1 if n5 >= 2 else 0
    n6 = n5 // 2 if n5 >= 2 else n5
    return b32 + b16 + b8 + b4 + b2 + b1 + n6


def rank(row_bucket, call_bucket):
    """How near a row's query-rows bucket is to a call's, for select() (lower is nearer): 0 for
    the call's own bucket, then by doublings, the larger bucket first at the same distance
    (d buckets above: 2d - 1; d below: 2d)."""
    d = row_bucket - call_bucket
    return 2 * d - 1 if d > 0 else -2 * d


#: The rules, in the order the C++ renders them.
RULES = (bucket, rank)


def bounds(b: int) -> tuple[int, int]:
    """The query rows bucket ``b`` holds: (first, last), inclusive."""
    return (1, 1) if b <= 0 else (2 ** (b - 1) + 1, 2**b)
