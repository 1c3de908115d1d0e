"""The hopper kernel's launch description: how a call becomes four TMA tensor maps and a grid.

One source for every launcher. The runtime (params.py, family.py) calls these functions;
``extension/launch_rules.h`` is their C++ rendering (written by gen_launch.py through
evotuner/compiler/cxx.py, kept equal by tests/test_hopper_launch.py), which the production
extension's rows (extension/hopper_launch_row.cu.in) and the dev harness
(scripts/hopper_dev/launcher.cu) include. Change a rule here, then run
``python3 kernels/hopper/gen_launch.py``.

The kernel's side of the contract is params.h: a tensor X of the call is seen as
[B, H, S, D] with element strides (sb, sh, ss, sd); its map is rank 5 over
{64 elements, S rows, D/64 panels, H, B}, 128-byte swizzled, so a box of ``rows`` x
``panels`` lands in shared memory as the kernel's tiles expect. D=96 (a "narrow" last
panel): the map is {96 elements, S rows, 1, H, B} with a box of 64 x ``rows`` x 1, and the
kernel loads (stores) each 64-column panel with its own TMA at x = 64*panel: the second
panel's columns 96..127 lie past the map's extent, so they load as zeros and are not stored.

The functions are written in the subset evotuner/compiler/cxx.py translates (integer
arithmetic on non-negative values, one return form per function).
"""

from __future__ import annotations

#: Bytes per element (fp16 and bf16).
ELEMENT_BYTES = 2
#: The tensor maps' rank: {64 elements, rows, 64-element panels, heads, batch}.
TMA_RANK = 5
#: A map's byte strides must stay below this (cuTensorMapEncodeTiled).
MAX_STRIDE_BYTES = 1 << 40

#: The maps' modes, named as cuda.h names them (CU_TENSOR_MAP_<KIND>_<NAME>).
TMA_MODES = {"INTERLEAVE": "NONE", "SWIZZLE": "128B", "L2_PROMOTION": "L2_256B", "FLOAT_OOB_FILL": "NONE"}
#: cuda.h's values of those enumerators and of the data types (the Python launcher passes the
#: numbers; tests/test_hopper_launch.py compiles cuda.h to check them).
CUDA_ENUMS = {"INTERLEAVE_NONE": 0, "SWIZZLE_128B": 3, "L2_PROMOTION_L2_256B": 3, "FLOAT_OOB_FILL_NONE": 0,
              "DATA_TYPE_FLOAT16": 6, "DATA_TYPE_BFLOAT16": 9}
#: The maps' data type per dtype.
TMA_DATA_TYPE = {"fp16": "DATA_TYPE_FLOAT16", "bf16": "DATA_TYPE_BFLOAT16"}

#: The four maps, in hopper::Params order (tm_q, tm_k, tm_v, tm_o).
MAP_Q, MAP_K, MAP_V, MAP_O = 0, 1, 2, 3
MAP_NAMES = ("q", "k", "v", "o")

#: The head dim that is not a multiple of 64 the kernel takes (its tiles padded to 128 columns).
NARROW_HEAD_DIM = 96

#: What :func:`tma_fault` finds wrong with a view (0: nothing).
FAULT_NONE, FAULT_HEAD_DIM, FAULT_D_STRIDE, FAULT_BASE, FAULT_BATCH_STRIDE, FAULT_HEAD_STRIDE, FAULT_ROW_STRIDE = range(7)
#: Each fault's subject, as messages name it (index = fault code).
FAULT_SUBJECTS = ("", "head dim", "D stride", "base pointer", "batch stride", "head stride", "row (S) stride")


def legal_stride(stride):
    """Whether an element stride is one a tensor map can hold: positive, a multiple of 16 bytes,
    below 2^40 bytes."""
    return stride > 0 and stride * ELEMENT_BYTES % 16 == 0 and stride * ELEMENT_BYTES < MAX_STRIDE_BYTES


def tma_fault(base, B, H, D, sb, sh, ss, sd):
    """The first rule a [B, H, S, D] view at byte address ``base`` with element strides
    (sb, sh, ss, sd) breaks (a FAULT_* code), 0 when TMA can read or write it. A batch or head
    extent of 1 never uses its stride (tma_view puts the row stride there)."""
    if D % 64 != 0 and D != NARROW_HEAD_DIM:
        return FAULT_HEAD_DIM
    if sd != 1:
        return FAULT_D_STRIDE
    if base % 16 != 0:
        return FAULT_BASE
    if B > 1 and not legal_stride(sb):
        return FAULT_BATCH_STRIDE
    if H > 1 and not legal_stride(sh):
        return FAULT_HEAD_STRIDE
    if not legal_stride(ss):
        return FAULT_ROW_STRIDE
    return FAULT_NONE


def tma_view(B, H, S, D, sb, sh, ss, rows, panels):
    """cuTensorMapEncodeTiled's arguments for a [B, H, S, D] view (element strides sb, sh, ss;
    D contiguous) and a box of ``rows`` x ``panels``: dims innermost first, byte strides of
    dims 1-4 (an extent-1 dim still needs a legal stride: the row stride), box, element strides.
    D a multiple of 64: {64, S, D/64, H, B}; D=96: {96, S, 1, H, B} (one panel per box)."""
    narrow = D % 64 != 0
    return {
        "dims": (D if narrow else 64, S, 1 if narrow else D // 64, H, B),
        "byte_strides": (ss * ELEMENT_BYTES, (ss if narrow else 64) * ELEMENT_BYTES,
                         (sh if H > 1 else ss) * ELEMENT_BYTES, (sb if B > 1 else ss) * ELEMENT_BYTES),
        "box": (64, rows, panels, 1, 1),
        "element_strides": (1, 1, 1, 1, 1),
    }


def map_box(which, block_m, block_n, o_box_rows, D, cluster):
    """The box of map ``which`` (MAP_*) from the kernel's meta table: Q a BLOCK_M x D tile,
    K and V BLOCK_N x D, O the epilogue's O_BOX_ROWS x one panel; at D=96 every box is one
    64-column panel (the kernel issues one TMA per panel), and so are K's and V's with CLUSTER
    > 1 (each CTA of a cluster multicasts its share of the panels)."""
    return {
        "rows": block_m if which == MAP_Q else (o_box_rows if which == MAP_O else block_n),
        "panels": 1 if which == MAP_O or D % 64 != 0 or (cluster > 1 and which != MAP_Q) else D // 64,
    }


def launch_grid(sched, seqlen_q, block_m, splits, heads, batch, sms, ctas_per_sm, cluster):
    """The grid: one CTA per (query tile x split, head, batch) for SCHED 0; for the persistent
    schedulers (SCHED 1, 2 and 3) as many CTAs as the SMs hold (``ctas_per_sm`` each, the
    kernel's CTAS_PER_SM), at most one per tile, at least one. With CLUSTER > 1 a tile is a
    run of ``cluster`` query blocks and x counts whole clusters: SCHED 0 the query blocks
    rounded up to a multiple of it, SCHED 1 ``cluster`` CTAs per tile, as many as the SMs hold."""
    units = (seqlen_q + block_m * cluster - 1) // (block_m * cluster)
    persistent = sched != 0
    return {
        "x": (cluster * max(1, min(sms * ctas_per_sm // cluster, units * heads * batch)) if persistent
              else units * cluster * splits),
        "y": 1 if persistent else heads,
        "z": 1 if persistent else batch,
    }


def packed_row_stride(S, sh, ss):
    """GQA query-head packing (PACK_GQA=1): the row stride of a [B, H, S, D] view (Q or O) seen
    as [B, H/G, G*S, D], query head h = kv*G + g with its row s at packed row g*S + s (batch
    stride kept, head stride G*sh); 0 where no single stride reaches every packed row (one
    head's rows not followed by the next head's, as in [B, S, H, D] with S > 1)."""
    if S == 1:
        return sh
    if sh == S * ss:
        return ss
    return 0


def round256(n):
    """``n`` bytes rounded up to a multiple of 256 (each scratch region's alignment)."""
    return (n + 255) // 256 * 256


def split_scratch(splits, batch, heads, seqlen_q, block_m, head_dim):
    """A split-KV launch's scratch (params.h; split.cuh lays it out): int32 counters, one per
    tile, then fp32 LSE partials [B, H, SPLITS, Sq], then fp32 O partials [B, H, SPLITS, Sq, D],
    each region 256-byte aligned. The counters (the first ``counter_bytes``) must read 0 at
    the first launch; the kernel puts them back to 0, the partials need no clearing."""
    bh = batch * heads
    counter_bytes = round256(bh * ((seqlen_q + block_m - 1) // block_m) * 4)
    return {
        "counter_bytes": counter_bytes,
        "bytes": counter_bytes + round256(bh * splits * seqlen_q * 4) + bh * splits * seqlen_q * head_dim * 4,
    }


#: SCHED 3: the most parts a split tile of the last wave is cut into (traits.cuh kTailParts).
TAIL_PARTS = 8
#: SCHED 3: the most SMs a Hopper GPU has (H100 SXM, H200: 132); the scratch holds a partial slot
#: per CTA of a grid this size, and a plan on a larger grid cuts no more parts than that.
TAIL_MAX_SMS = 132


def tail_slots(tiles, ctas_per_sm):
    """SCHED 3: the partial slots a launch's scratch holds: one per CTA of the largest grid
    (:data:`TAIL_MAX_SMS` x CTAS_PER_SM), at most one per tile (a grid has no more CTAs)."""
    return min(tiles, TAIL_MAX_SMS * ctas_per_sm)


def tail_scratch(tiles, ctas_per_sm, block_m, head_dim):
    """SCHED 3's scratch (params.h; split.cuh lays it out for the plan's r split tiles and
    r * parts <= slots parts): int32 counters, two per split tile and consumer warp (BLOCK_M / 16
    warps), then fp32 LSE partials [slots, BLOCK_M], then fp32 O partials [slots, BLOCK_M, D],
    each region 256-byte aligned. The counters (the first ``counter_bytes``) must read 0 at the
    first launch; the kernel puts them back to 0."""
    slots = tail_slots(tiles, ctas_per_sm)
    counter_bytes = round256(slots * 8 * (block_m // 16))
    return {
        "counter_bytes": counter_bytes,
        "bytes": counter_bytes + round256(slots * block_m * 4) + slots * block_m * head_dim * 4,
    }


def tail_plan(tiles, grid, key_blocks, slots):
    """SCHED 3, the last wave split: ``tiles`` whole tiles on ``grid`` CTAs leave r = tiles mod
    grid tiles for a last round in which the other CTAs idle. Each of those r tiles (the last in
    hand-out order, from ``first``) is cut into ``parts`` parts of its key blocks: as many as the
    idle CTAs take (grid / r), at most :data:`TAIL_PARTS`, each part at least two key blocks and
    every part a partial slot of the ``slots`` the scratch holds. ``parts`` 1 (``first`` =
    ``tiles``): nothing is split (no ragged round, or one at least half full)."""
    r = tiles % grid
    parts = min(min(TAIL_PARTS, grid // r), min(key_blocks // 2, slots // r)) if r > 0 and tiles > grid else 1
    return {
        "first": tiles - r if parts >= 2 else tiles,
        "parts": parts if parts >= 2 else 1,
    }


#: What gen_launch.py renders, in order (a rule may call those before it).
RULES = (legal_stride, tma_fault, tma_view, map_box, launch_grid, packed_row_stride, round256, split_scratch,
         tail_slots, tail_scratch, tail_plan)
