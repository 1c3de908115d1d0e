"""Kernel timing with CUDA events, shared by the bench script and the GPU worker.

Each repetition is timed by its own pair of events on the current stream. Before
each repetition the L2 is flushed by writing a buffer twice the L2's size (the
write is outside the events), so every repetition reads its inputs from HBM as
a real layer would; alternatively (or as well) the caller gives several
callables, one per input set, which are cycled. Returns the median and the
20th/80th percentiles in microseconds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from evotuner.errors import EvotunerError
from evotuner.measure.racing import quantile


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float
    repetitions: int                  # repetitions timed (fewer than planned when stopped early)
    samples_us: tuple[float, ...]
    planned_repetitions: int = 0      # what the budget (or ``reps``) asked for
    stopped_early: bool = False       # ``stop`` ended the timing at a look
    pair_samples_us: tuple[float, ...] = ()   # ``pair``'s repetitions, timed alternately with the first ones

    def as_dict(self) -> dict[str, float | int]:
        return {"median_us": self.median_us, "p20_us": self.p20_us, "p80_us": self.p80_us,
                "repetitions": self.repetitions}


_flush_buffers: dict[int, torch.Tensor] = {}

#: GPU cycles of busy-wait queued before each timed repetition (~100 µs at H100 clocks),
#: so that the host's launch cost (Python + ctypes packing, tens of µs) is hidden behind
#: work already queued and the events time the kernel, not the host. Measured on the
#: H100 (tests/gpu/test_attention.py, a 40 µs kernel): without it the unflushed median
#: read 63 µs against 40 µs flushed, the host's launch latency leaking into the events.
HOST_LEAD_CYCLES = 200_000


#: Seed of the coin flips that order each pair of a paired race (the same sequence every
#: call). A fixed pattern is not neutral: on the H100 (2026-11-27, session n) two equal ~18 µs
#: kernels timed as I C, C I, I C, ... read the config 2.3-2.9% slower whichever kernel was the
#: config (the one in the middle of each I C C I), and with coin flips 0.998-1.005 both ways
#: (docs/measurements/racing/pairbias2_h100_1127n.log); ~440 µs kernels read the same ratio in
#: every order.
PAIR_ORDER_SEED = 0x9A1D


def _queue_lead() -> None:
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(HOST_LEAD_CYCLES)


def l2_flush_buffer(device: int | None = None) -> torch.Tensor:
    """A cached int8 buffer of 2x the device's L2 size (at least 64 MiB)."""
    dev = torch.cuda.current_device() if device is None else device
    buf = _flush_buffers.get(dev)
    if buf is None:
        l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 0)
        buf = _flush_buffers[dev] = torch.empty(max(2 * l2, 64 << 20), dtype=torch.int8, device=f"cuda:{dev}")
    return buf


def time_cuda(fn: Callable[[], object] | Sequence[Callable[[], object]], *, warmup: int | None = None,
              reps: int | None = None, budget_s: float | None = None, flush_l2: bool = True,
              device: int | None = None, min_reps: int = 10, max_reps: int = 2000,
              looks: Sequence[int] = (), stop: Callable[..., bool] | None = None,
              lead: bool = True, pair: Callable[[], object] | None = None, pair_reps: int = 0) -> Timing:
    """Time ``fn`` (or cycle through a sequence of callables, one per input set).

    Warm-up runs ``warmup`` calls (default 10; module load and first-touch
    costs stay out); then the repetitions, each between two CUDA events on the
    current stream, with the L2 flushed before each when ``flush_l2``. The
    repetition count is ``reps`` when given; else it is fitted to ``budget_s``
    seconds of GPU time (estimated from three timed calls after the warm-up),
    clamped to [min_reps, max_reps]; with neither, 50. Errors raised by the
    callables propagate; an asynchronous fault surfaces at a synchronize
    (torch raises it as RuntimeError).

    Racing: with ``stop``, the repetitions are queued in chunks ending at each of
    ``looks`` below the planned count; after each chunk the stream is synchronized and
    ``stop(samples so far, in time order)`` decides whether to end the timing there
    (``Timing.stopped_early``). Each repetition keeps its own L2 flush and host lead, so
    a look costs one synchronize and no timed repetition changes.

    Paired racing: with ``pair`` (the incumbent's call), the repetitions of every chunk
    ending at or below ``pair_reps`` alternate with repetitions of ``pair`` (which one goes
    first is a coin flip per pair, :data:`PAIR_ORDER_SEED`), each with its own flush, lead
    and events, so both are timed at the same clocks; ``stop`` is then called as
    ``stop(samples, pair_samples)``, and the repetitions past ``pair_reps`` run alone. Only
    chunks a look follows are paired (a budget of fewer repetitions than the first look pairs
    none). ``pair`` is warmed up beside ``fn``. ``Timing.pair_samples_us`` holds ``pair``'s; the median and percentiles are the
    config's own, over its repetitions timed alone where those are at least half of them
    (``samples_us`` keeps all).

    ``lead=False`` queues the host lead only before the first repetition of each chunk
    (the queue is empty after a synchronize), for experiments: on the H100 it made a 1 ms
    config's timing 13% shorter in wall time but its median 3-5% slower, the GPU's clocks
    running lower without the idle gaps (scripts/timing_traces.py,
    docs/measurements/racing/traces_h100_1126f.json); the worker keeps the default.
    """
    fns = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    if not fns or not all(callable(f) for f in fns):
        raise TypeError("time_cuda: fn must be a callable or a non-empty sequence of callables")
    warmup = 10 if warmup is None else int(warmup)
    if (reps is not None and reps < 1) or warmup < 0 or (budget_s is not None and budget_s <= 0):
        raise EvotunerError(f"time_cuda: reps={reps}, warmup={warmup}, budget_s={budget_s}",
                            "reps must be >= 1, warmup >= 0 and budget_s > 0")
    dev = torch.cuda.current_device() if device is None else device
    flush = l2_flush_buffer(dev) if flush_l2 else None
    with torch.cuda.device(dev):
        for i in range(warmup):
            fns[i % len(fns)]()
            if pair is not None:      # its first calls may load its kernel too
                pair()
        torch.cuda.synchronize(dev)
        if reps is None:
            if budget_s is None:
                reps = 50
            else:
                probe = 3
                t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0.record()
                for i in range(probe):
                    if flush is not None:
                        flush.zero_()
                    fns[i % len(fns)]()
                t1.record()
                torch.cuda.synchronize(dev)
                per_call_s = max(t0.elapsed_time(t1) / 1000.0 / probe, 1e-7)
                reps = max(min_reps, min(max_reps, int(budget_s / per_call_s)))
        ends_at = sorted({int(n) for n in looks if 0 < int(n) < reps}) if stop is not None else []
        ends_at.append(reps)
        samples: list[float] = []
        pair_samples: list[float] = []
        order = random.Random(PAIR_ORDER_SEED)   # which of a pair goes first: a coin flip per pair
        stopped = False
        done = 0
        for end in ends_at:
            paired = pair is not None and end <= pair_reps and end < reps   # only chunks a look follows
            own: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
            theirs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
            for j in range(end - done):
                lead_now = lead or j == 0
                pair_first = paired and order.random() < 0.5
                if pair_first:
                    theirs.append(_timed(pair, flush, lead_now))
                    lead_now = lead
                own.append(_timed(fns[(done + j) % len(fns)], flush, lead_now))
                if paired and not pair_first:
                    theirs.append(_timed(pair, flush, lead))
            torch.cuda.synchronize(dev)
            samples.extend(s.elapsed_time(e) * 1000.0 for s, e in own)
            pair_samples.extend(s.elapsed_time(e) * 1000.0 for s, e in theirs)
            done = end
            if end < reps and stop is not None and (stop(samples, pair_samples) if pair is not None else stop(samples)):
                stopped = True
                break
    # A config timed on alone after the paired chunks: its figures from those repetitions,
    # timed as every unpaired config's are (alternating kernels may run at other clocks).
    alone = samples[len(pair_samples):]
    ordered = sorted(alone if pair_samples and len(alone) >= max(min_reps, len(samples) // 2) else samples)
    return Timing(median_us=quantile(ordered, 0.5), p20_us=quantile(ordered, 0.2), p80_us=quantile(ordered, 0.8),
                  repetitions=len(samples), samples_us=tuple(samples), planned_repetitions=reps,
                  stopped_early=stopped, pair_samples_us=tuple(pair_samples))


def _timed(call: Callable[[], object], flush: torch.Tensor | None, lead: bool) -> tuple[torch.cuda.Event, torch.cuda.Event]:
    """Queue one timed repetition of ``call`` (the L2 flushed and the host lead queued
    before it, outside its events); its (start, end) events."""
    if flush is not None:
        flush.zero_()
    if lead:
        _queue_lead()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    return start, end


def time_graph(fn: Callable[[], object], reps: int) -> float:
    """Median µs of one call of ``fn`` captured in a CUDA graph and replayed under
    :func:`time_cuda` (L2 flushed before each replay): the kernel alone, no host time.
    ``fn`` runs once on a side stream first (warm-up, as graph capture asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_cuda(graph.replay, reps=reps).median_us


def time_eager(fn: Callable[[], object], calls: int) -> float:
    """µs per call of ``calls`` back-to-back calls of ``fn`` between two CUDA events, as a
    user calls it (host time shows wherever it exceeds the kernel's)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / calls
