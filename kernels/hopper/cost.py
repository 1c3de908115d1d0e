"""A first-principles cost model of the hopper kernel: predicted µs of a config at a problem.

Why: the family's space is large (41,472 configs, 5-8 thousand statically feasible) and a
search that starts cold spends most of its evaluations learning what the kernel's
structure already says -- bigger tiles amortize the K/V traffic, a spill is fatal,
overlap hides the softmax behind the GEMMs. :class:`evotuner.guided.GuidedSampler` uses
this model as the prior mean of its surrogate and measures only what the model cannot
tell apart (KernelFamily.estimate_us is the contract).

What it counts, per SM (one CTA per SM: the launch bounds give a CTA the whole register
file; CTAS_PER_SM=2 halves it, see the last item), in clocks:

* one main-loop iteration of one CTA: the tensor-core time of its live consumer
  warpgroups' two GEMMs (4 * 64 * BLOCK_N * D flops each), their softmax (one MUFU ex2 and
  a few FP32 ops per score), the K/V bytes from L2 (2 * BLOCK_N * D elements), and a fixed
  handshake latency (wgmma wait + mbarrier round trips) no overlap hides. The GEMMs and the
  softmax overlap as far as the structure lets them (:func:`_overlap`); with two or more
  ring stages the loads overlap both, with one they are exposed with an L2 round trip;
* a tile: its iterations (causal tiles end at the diagonal) plus its prologue (Q load, first
  K) and epilogue (O store), which a persistent CTA overlaps with its next tile;
* the kernel: the tiles' makespan over the SMs in the order the kernel hands them out
  (kernel.cuh ``tile_info``: SCHED 0 the hardware's dispatch, 1 static striding, 2 and 3 a
  dynamic counter; causal tiles longest first);
* a packed variable-length batch (``Problem.lengths_q``): each sequence's own tiles (its
  rows, its key blocks, causal within it), every sequence's and head's tiles scheduled
  over the SMs as one list (the grid spans the longest sequence; a tile past its
  sequence's end costs nothing);
* split-KV (SPLITS > 1): a tile's key blocks shared by SPLITS CTAs, each adding its fp32
  partial's store, the last one the combine; the chip's HBM bandwidth floors the kernel
  (every K/V byte read once), which decides decoding;
* the last wave split (SCHED=3, non-causal dense): launch.py's plan; the split tiles' parts
  (each a split-KV share with its partial and combine, as above) handed out after the whole
  tiles to the first CTA free;
* two CTAs per SM (CTAS_PER_SM=2): twice the slots for the makespan, each CTA's iteration
  the longer of both CTAs' throughput-bound time and its own latency-bound time, so the
  fixed per-iteration latency and the tile edges of one CTA run under the other's work;
* CTA pairs (CLUSTER=2): every iteration CLUSTER_SLOWDOWN times longer (measured: the
  halved L2 reads bought nothing the pair's lockstep did not cost back), and an odd last m
  block's partner busy for a whole tile;
* registers: a consumer thread holds O (D/2 fp32), S (BLOCK_N/2 fp32), with OVERLAP the
  previous P (BLOCK_N/4 packed halves) beside the next S, plus about 28 for addresses,
  row statistics and loop state. More than REG_CONS spills, which the gate rejects: the
  estimate is then ``math.inf``.

The throughputs are the H100 SXM's datasheet figures (``../shared/docs/hopper-kernel-notes.md``):
989 TF dense fp16 = 132 SMs x 4096 flop/clk x 1.83 GHz; MUFU 16 ex2/clk/SM (3.9 T/s, FA3
paper). The L2 bandwidth, the latencies and the softmax's FP32 op count are estimates, chosen
once by hand (not fitted): the model orders configs, the search measures them. How well it
orders them is measured on the recorded sweeps (docs/samplers.md): the model was written
against the first four; four more were recorded after it (the causal dispatch rule below was
changed after the fourth of those), and two after that change.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from functools import lru_cache
from typing import Mapping

import numpy as np

from evotuner.kernels.hopper import launch
from evotuner.problem import Problem, Shape

#: H100 SXM: streaming multiprocessors and the clock the figures below are per-clock of.
SMS = 132
CLOCK_GHZ = 1.83
#: Dense fp16/bf16 tensor-core flops per clock per SM (989 TF / 132 / 1.83 GHz).
MMA_FLOP_PER_CLK = 4096.0
#: MUFU ex2 per clock per SM (4 per SM sub-partition; FA3: ~3.9 T special ops/s).
MUFU_PER_CLK = 16.0
#: FP32 lanes per clock per SM, and FP32 ops per score besides its ex2 (scale FMA, max,
#: subtract, sum, convert, select): an estimate from the kernel's softmax.
FP32_PER_CLK = 128.0
SOFTMAX_FP32_OPS = 6.0
#: L2 -> SM bytes per clock per SM (~9.7 TB/s over 132 SMs at 1.83 GHz): an estimate.
L2_BYTES_PER_CLK = 40.0
#: A TMA load's round trip through L2, in clocks: an estimate.
L2_LATENCY = 800.0
#: Per main-loop iteration: wgmma commit/wait and the full/empty mbarrier handshakes,
#: which no overlap hides: an estimate.
ITERATION_LATENCY = 300.0
#: Per tile: a non-persistent CTA's launch and setup (TMA descriptor prefetch, barrier
#: init, setmaxnreg), and a persistent CTA's hand-over to its next tile: estimates.
LAUNCH_OVERHEAD = 1000.0
HANDOVER = 200.0
#: CLUSTER=2: how much longer each main-loop iteration takes than unpaired: the median of the
#: pair's time over the unpaired kernel's at 13 non-causal shape/scheduler pairs on the H100
#: (0.99-1.14x; D 64, 128, 256; SCHED 0 and 1; 2026-11-27, docs/measurements/cluster/README.md).
CLUSTER_SLOWDOWN = 1.1
#: Registers a consumer thread needs besides its accumulators (addresses, row max and sum,
#: loop state): the one figure read off the gate's spill reports (the recorded sweeps'
#: spill boundaries at D=64 and D=128 bracket it to 25..32).
REGISTER_OVERHEAD = 28
#: HBM -> L2 bytes per clock, the whole chip (3.35 TB/s at 1.83 GHz): the floor of a
#: problem whose K/V are read once (decoding), which the per-SM L2 figure cannot see.
HBM_BYTES_PER_CLK = 1830.0
#: O partials the combining warp loads at once (split.cuh kChunk): one L2 round trip each.
COMBINE_LOADS = 8
#: Tiles above which the makespan is computed in closed form instead of tile by tile.
EXACT_TILES = 20000
#: Tiles (sequences x heads x the longest's m blocks) above which a packed batch's static
#: (SCHED 1) makespan is computed in closed form too, never as an array (65535 sequences of up
#: to 8192 rows at 32 heads would be 10^9 tiles, 8 GB of float64).
PACKED_EXACT_TILES = 1 << 20


def consumer_registers(head_dim: int, block_n: int, overlap: int) -> float:
    """Registers a consumer thread needs: O and S in fp32, P beside the next S with OVERLAP."""
    return REGISTER_OVERHEAD + head_dim / 2 + block_n / 2 + overlap * block_n / 4


def _overlap(consumer_wgs: int, overlap: int, pingpong: int) -> float:
    """Share of the shorter of GEMM and softmax time hidden under the longer one.

    One warpgroup without OVERLAP runs them back to back; OVERLAP lets S(n+1) run under
    softmax(n); two warpgroups interleave on their own; PINGPONG schedules them to.
    """
    if pingpong:
        return 0.9
    if consumer_wgs >= 2:
        return 0.7 if overlap else 0.5
    return 0.5 if overlap else 0.0


def _softmax_per_score(c: Mapping[str, int], head_dim: int, block_n: int) -> float:
    """Clocks per score of one SM's softmax: its ex2 on MUFU (EXP_EMU=k moves one in k to an
    FMA polynomial of ~8 ops) and its FP32 ops; an eager rescale (RESCALE_LOG2=0) multiplies
    every element of O (D per row) every iteration, D / BLOCK_N ops per score."""
    emu = c.get("EXP_EMU", 0)
    mufu = 1.0 - (1.0 / emu if emu else 0.0)
    fp32 = SOFTMAX_FP32_OPS + (8.0 / emu if emu else 0.0)
    if not c.get("RESCALE_LOG2", 0):
        fp32 += head_dim / block_n
    return mufu / MUFU_PER_CLK + fp32 / FP32_PER_CLK


def _tile_clocks(c: Mapping[str, int], head_dim: int, rows: int, iterations: int, persistent: bool,
                 ctas: int = 1) -> float:
    """Clocks of one tile on its CTA; with ``ctas`` CTAs sharing the SM each iteration takes
    the SM's throughput-bound time of all of them or its own latency-bound time, whichever is
    longer (the other CTA's work fills this one's barrier waits). CLUSTER=2 stretches every
    iteration by the measured CLUSTER_SLOWDOWN."""
    n, wgs = c["BLOCK_N"], c["CONSUMER_WGS"]
    live = min(wgs, -(-rows // 64))                  # skip_tile: warpgroups past Sq compute nothing
    mma = live * 4 * 64 * n * head_dim / MMA_FLOP_PER_CLK
    softmax = live * 64 * n * _softmax_per_score(c, head_dim, n)
    hidden = _overlap(wgs, c["OVERLAP"], c["PINGPONG"])
    compute = max(mma, softmax) + (1 - hidden) * min(mma, softmax)
    load = 4 * n * head_dim / L2_BYTES_PER_CLK            # K and V tiles, 2-byte elements
    step = max(compute, load) if c["STAGES"] >= 2 else compute + load + L2_LATENCY
    q_bytes = 64 * wgs * head_dim * 2
    prologue = L2_LATENCY + q_bytes / L2_BYTES_PER_CLK
    epilogue = q_bytes / L2_BYTES_PER_CLK + HANDOVER
    edges = max(prologue, epilogue) + HANDOVER if persistent else prologue + epilogue + LAUNCH_OVERHEAD
    paired = CLUSTER_SLOWDOWN if c.get("CLUSTER", 1) > 1 else 1.0
    return iterations * max(ctas * step, step + ITERATION_LATENCY) * paired + edges


@lru_cache(maxsize=4096)
def _makespan(per_m: tuple[float, ...], heads: int, causal: bool, sms: int, static: bool) -> float:
    """Clocks until the last SM finishes every head's tiles (``per_m``: one head's, by m
    block) handed out in order: striding by the grid (``static``) or each to the SM that
    frees first (a dynamic counter, the hardware's block dispatch). Cached: configs that
    differ only where the tile times do not (the register split) share one computation.

    Causal tiles go longest m block first. The persistent schedulers hand out every head's
    longest block, then the next; SCHED 0's grid runs m fastest within a head, but the
    recorded causal sweeps show no tail from that order (SCHED 0 at 0.96-1.03x SCHED 2, where
    list scheduling in grid order predicts 1.06-1.12x): the hardware's dispatch is modelled
    as longest first too."""
    tiles = np.asarray(per_m)
    durations = np.repeat(tiles[::-1], heads) if causal else np.tile(tiles, heads)
    return _schedule(durations, sms, static)


def _tile_shapes(seqlen_q: int, seqlen_k: int, block_m: int, n: int, causal: bool,
                 cluster: int) -> tuple[tuple[int, int], ...]:
    """(query rows, key blocks) of one head's tiles of one sequence, by m block."""
    out = []
    for m in range(-(-seqlen_q // block_m)):
        rows = min(block_m, seqlen_q - m * block_m)
        blocks = -(-seqlen_k // n)
        if causal:                        # top-left: row i sees keys 0..i
            blocks = min(blocks, (m * block_m + rows - 1) // n + 1)
        out.append((rows, blocks))
    if len(out) % cluster:   # CLUSTER=2, odd m blocks: the last one's partner passes every block
        out.append(out[-1])
    return tuple(out)


@lru_cache(maxsize=64)
def _batch_tile_shapes(lengths_q: tuple[int, ...], lengths_k: tuple[int, ...], block_m: int, n: int, causal: bool,
                       cluster: int) -> tuple[dict[int, tuple[int, int, int]], int]:
    """One head's tiles of a packed batch grouped by their live warpgroups (ceil(rows / 64)):
    each group's (tiles, key blocks in all, most key blocks of one), and the longest sequence's
    tile count: what the closed-form makespan needs, worked out once per tile geometry and not
    per config (the guided sampler costs every config of the space, and a batch of thousands of
    sequences took minutes). Each distinct length is walked once."""
    groups: dict[int, list[int]] = {}
    width = 0
    for (q, k), times in Counter(zip(lengths_q, lengths_k)).items():
        shapes = _tile_shapes(q, k, block_m, n, causal, cluster)
        width = max(width, len(shapes))
        for rows, blocks in shapes:
            group = groups.setdefault(-(-rows // 64), [0, 0, 0])
            group[0] += times
            group[1] += times * blocks
            group[2] = max(group[2], blocks)
    return {live: (count, blocks, most) for live, (count, blocks, most) in groups.items()}, width


@lru_cache(maxsize=1024)
def _packed_makespan(per_seq: tuple[tuple[float, ...], ...], heads: int, causal: bool, sms: int,
                     static: bool) -> float:
    """:func:`_makespan` of a packed variable-length batch: ``per_seq`` holds each sequence's
    tiles by m block, padded with empty tiles (0 clocks: a CTA that finds its sequence over
    returns at once) to the longest sequence's count, as the kernel's grid spans the longest
    (tile_scheduler.cuh): m fastest, then head, then sequence. Causal: every tile handed out
    longest first, as :func:`_makespan` models the dense dispatch."""
    width = max(len(t) for t in per_seq)
    grid = np.zeros((len(per_seq), width))
    for b, tiles in enumerate(per_seq):
        grid[b, :len(tiles)] = tiles
    durations = np.repeat(grid, heads, axis=0).ravel()
    if causal:
        durations = np.sort(durations)[::-1]
    return _schedule(durations, sms, static)


def _schedule(durations: np.ndarray, sms: int, static: bool) -> float:
    """Clocks until the last of ``sms`` SMs finishes ``durations`` (tiles in hand-out order):
    static striding, or list scheduling (each tile to the SM that frees first)."""
    if len(durations) <= sms:
        return float(durations.max())
    if static:
        padded = np.zeros(-(-len(durations) // sms) * sms)
        padded[:len(durations)] = durations
        return float(padded.reshape(-1, sms).sum(axis=0).max())
    if len(durations) > EXACT_TILES:
        return float(durations.sum() / sms + durations.max())
    loads = [0.0] * sms
    for d in durations.tolist():
        heapq.heapreplace(loads, loads[0] + d)
    return max(loads)


def estimate_us(config: Mapping[str, int], problem: Problem, *, sms: int = SMS, clock_ghz: float = CLOCK_GHZ) -> float:
    """Predicted kernel time of ``config`` at ``problem`` in µs; ``math.inf`` where the
    consumer's registers are predicted to spill (the gate rejects a spill). A packed
    variable-length problem with lengths: each sequence's own tiles (its rows, its key
    blocks, causal per sequence), every sequence's and head's tiles scheduled over the SMs."""
    if config.get("PACK_GQA", 0) and packs_heads(problem):
        problem = packed_problem(problem)   # one head of G*Sq rows per K/V head (family.py _pack_heads)
    s = problem.shape
    d, n, wgs = s.head_dim, config["BLOCK_N"], config["CONSUMER_WGS"]
    if consumer_registers(d, n, config["OVERLAP"]) > config["REG_CONS"]:
        return math.inf
    block_m = 64 * wgs
    persistent = config["SCHED"] >= 1
    splits = int(config.get("SPLITS", 1))   # split-KV: each tile's key blocks shared by this many CTAs
    ctas = int(config.get("CTAS_PER_SM", 1))   # CTAs resident per SM: the makespan runs over sms x ctas slots
    cluster = int(config.get("CLUSTER", 1))    # CTAs per cluster: pairs of m blocks sharing K/V loads
    clocks_of: dict[tuple[int, int], float] = {}     # (rows, kv blocks) -> tile clocks: one per distinct tile

    def clocks_at(shape: tuple[int, int]) -> float:
        if shape not in clocks_of:
            clocks_of[shape] = _tile(config, d, *shape, persistent, splits, ctas)
        return clocks_of[shape]

    def tiles(seqlen_q: int, seqlen_k: int) -> tuple[float, ...]:
        """One head's tiles of one sequence, by m block."""
        return tuple(map(clocks_at, _tile_shapes(seqlen_q, seqlen_k, block_m, n, problem.causal, cluster)))

    static = config["SCHED"] == 1
    if problem.lengths_q:
        heads, slots = s.heads * splits, sms * ctas
        groups, width = _batch_tile_shapes(problem.lengths_q, problem.lengths_k, block_m, n, problem.causal, cluster)
        if s.batch * width * heads > (PACKED_EXACT_TILES if static else EXACT_TILES):   # _schedule's closed form
            # a tile's clocks are linear in its key blocks (_tile_clocks, no split-KV here), at a
            # slope and an intercept set by its live warpgroups: sum and max from each group's totals
            total, longest = 0.0, 0.0
            for live, (count, blocks, most) in groups.items():
                edges = clocks_at((64 * live, 0))
                slope = clocks_at((64 * live, 1)) - edges
                total += count * edges + blocks * slope
                longest = max(longest, edges + most * slope)
            clocks = heads * total / slots + longest
        else:
            clocks = _packed_makespan(tuple(tiles(q, k) for q, k in problem.sequences()), heads, problem.causal,
                                      slots, static)
        kv_rows = sum(problem.lengths_k)
    elif config["SCHED"] == 3 and not problem.causal:   # the last wave split (non-causal dense)
        per_m = tiles(s.seqlen_q, s.seqlen_k)
        rows = tuple(min(block_m, s.seqlen_q - m * block_m) for m in range(len(per_m)))
        clocks = _tail_split_makespan(config, d, per_m, rows, s.batch * s.heads, -(-s.seqlen_k // n), sms * ctas)
        kv_rows = s.batch * s.seqlen_k
    else:
        clocks = _makespan(tiles(s.seqlen_q, s.seqlen_k), s.batch * s.heads * splits, problem.causal, sms * ctas,
                           static)
        kv_rows = s.batch * s.seqlen_k
    kv_bytes = 2 * kv_rows * s.heads_kv * d * 2     # K and V, read from HBM once at best
    return max(clocks, kv_bytes / HBM_BYTES_PER_CLK) / (clock_ghz * 1e3)


def _tail_split_makespan(config: Mapping[str, int], d: int, per_m: tuple[float, ...], rows: tuple[int, ...],
                         heads: int, blocks: int, slots: int) -> float:
    """SCHED 3's makespan: one head's tiles (``per_m``, their ``rows``) for each of ``heads``
    heads, handed out to the first CTA free; launch.py's plan cuts the last round's tiles into
    parts, each a split-KV share of the ``blocks`` key blocks with its partial and combine."""
    ctas = int(config.get("CTAS_PER_SM", 1))
    durations = np.tile(np.asarray(per_m), heads)
    grid = max(1, min(slots, len(durations)))
    plan = launch.tail_plan(len(durations), grid, blocks, launch.tail_slots(len(durations), ctas))
    if plan["parts"] > 1:
        part = [_tile(config, d, rows[i % len(rows)], blocks, True, plan["parts"], ctas)
                for i in range(plan["first"], len(durations))]
        durations = np.concatenate([durations[:plan["first"]], np.repeat(part, plan["parts"])])
    return _schedule(durations, grid, False)


def _tile(config: Mapping[str, int], d: int, rows: int, blocks: int, persistent: bool, splits: int,
          ctas: int = 1) -> float:
    """Clocks of one tile of ``rows`` query rows over ``blocks`` key blocks (``ctas`` CTAs per SM)."""
    if splits <= 1:
        return _tile_clocks(config, d, rows, blocks, persistent, ctas)
    # the longest share, its fp32 partial out, and the last CTA's combine: each warp walks its
    # rows; per row one round trip for the LSE partials, then the O partials COMBINE_LOADS
    # splits at a time (split.cuh): a latency chain, not a bandwidth term
    wgs = config["CONSUMER_WGS"]
    partial = rows * d * 4 / L2_BYTES_PER_CLK
    rows_per_warp = -(-rows // (4 * wgs))
    combine = (L2_LATENCY * (1 + rows_per_warp * (1 + -(-splits // COMBINE_LOADS))) + splits * partial
               + rows * d * 2 / L2_BYTES_PER_CLK)
    return _tile_clocks(config, d, rows, -(-blocks // splits), persistent, ctas) + partial + combine


def packs_heads(problem: Problem) -> bool:
    """Whether PACK_GQA=1 changes ``problem``'s launch: grouped heads, non-causal, dense."""
    return problem.shape.heads_kv < problem.shape.heads and not problem.causal and not problem.varlen


def packed_problem(problem: Problem) -> Problem:
    """``problem`` as PACK_GQA=1 launches it: one head of G*Sq rows per K/V head."""
    s = problem.shape
    group = s.heads // s.heads_kv
    return Problem(Shape(s.batch, s.heads_kv, group * s.seqlen_q, s.seqlen_k, s.head_dim, s.heads_kv),
                   problem.dtype, problem.causal)
