#!/usr/bin/env python3
"""One small ragged call of each runtime path added for models' attention, for
compute-sanitizer to watch (memcheck, racecheck, synccheck, initcheck):

    compute-sanitizer --tool memcheck --error-exitcode 9 python scripts/sanitize_paths.py

GQA (group 4) and MQA on both families, hopper at D=192 and 256 (their recommended configs,
causal and not, Sq != Sk with ragged tails), and packed variable-length batches
(``flash_attention_varlen``: empty sequences, one without keys, every scheduler, and offsets
a caller got wrong (past the packed tensors, backwards, before row 0, past max_seqlen), which
must touch nothing outside them; ``--only varlen`` runs these alone), and split-KV with
GQA query-head packing (SPLITS not dividing the key blocks, more splits than blocks, causal
with split, packed heads with and without split), each call checked against the fp32
reference so a silent wrong result fails too. Exit status 0 when every output is right.
``--only split`` runs the split-KV cases alone, ``--only ctas`` those with two CTAs per SM
(CTAS_PER_SM=2, every scheduler), ``--only cluster`` the CTA pairs sharing K/V loads
(CLUSTER=2), ``--only qregs`` those with Q in registers (Q_IN_REGS=1), ``--only tail`` the last
wave split (SCHED=3); ``--head-dim 96`` every group's cases at that head dim.
"""

from __future__ import annotations

import math
import sys

import torch

import evotuner
from evotuner.runtime import check as C
from evotuner.scriptargs import ArgumentParser

#: (family, B, H, HKV, Sq, Sk, D, causal)
CASES = (
    ("hopper", 1, 8, 2, 77, 131, 64, True), ("hopper", 2, 4, 1, 65, 33, 128, False),
    ("flashcore", 1, 8, 2, 77, 131, 64, True), ("flashcore", 1, 4, 1, 33, 65, 128, False),
    ("hopper", 1, 2, 2, 97, 150, 192, True), ("hopper", 1, 2, 1, 70, 70, 192, False),
    ("hopper", 1, 2, 2, 97, 150, 256, True), ("hopper", 1, 2, 1, 70, 70, 256, False),
    # D=96 (tiles padded to 128 columns, one TMA per panel): the recommended config, GQA, MQA
    ("hopper", 1, 8, 2, 77, 131, 96, True), ("hopper", 2, 4, 1, 65, 33, 96, False),
)


#: (D, causal, q lengths, k lengths, config or None): packed batches.
VARLEN = (
    (128, True, [0, 1, 77, 200, 3], [0, 5, 77, 150, 0], None),
    (64, False, [33, 0, 129], [64, 9, 129], None),
    (128, False, [70, 1, 130], [70, 200, 1], "BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,"
                                             "PINGPONG=1,RESCALE_LOG2=8,EXP_EMU=0,SCHED=2"),
    (64, True, [70, 1, 130], [70, 200, 1], "BLOCK_N=128,CONSUMER_WGS=3,STAGES=2,REG_PROD=32,REG_CONS=160,OVERLAP=1,"
                                           "PINGPONG=1,RESCALE_LOG2=0,EXP_EMU=0,SCHED=1"),
    (96, True, [0, 1, 77, 200, 3], [0, 5, 77, 150, 0], None),
    (96, False, [70, 1, 130], [70, 200, 1], None),
)


def _varlen(D: int, causal: bool, lq: list[int], lk: list[int], config: str | None) -> bool:
    cq = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    ck = torch.tensor([0, *torch.tensor(lk).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lq), 4, D, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(sum(lk), 2, D, device="cuda", dtype=torch.float16) for _ in range(2))
    out, lse = evotuner.flash_attention_varlen(q, k, v, cq, ck, max(lq), max(lk), causal=causal, config=config,
                                               return_lse=True)
    torch.cuda.synchronize()
    ok = True
    for b in range(len(lq)):
        if lq[b] == 0:
            continue
        rows = slice(int(cq[b]), int(cq[b + 1]))
        o_b = out[rows].transpose(0, 1).unsqueeze(0)
        if lk[b] == 0:
            ok = ok and bool((o_b == 0).all())
            continue
        qb = q[rows].transpose(0, 1).unsqueeze(0)
        kb, vb = (t[int(ck[b]):int(ck[b + 1])].transpose(0, 1).unsqueeze(0) for t in (k, v))
        ref, _ = C.reference(qb, kb, vb, causal, 1 / math.sqrt(D))
        tol = C.tolerance(C.torch_low_precision(qb, kb, vb, causal, 1 / math.sqrt(D)), ref)
        ok = ok and C.compare(o_b, ref, tol)[0]
    # offsets a caller got wrong (they are not read back: no sync): past the packed tensors' end,
    # running backwards (a negative length), starting before row 0, or lengths past max_seqlen_*.
    # Wrong rows, but nothing read or written outside the tensors (memcheck) and no fault.
    for wrong_q, wrong_k, max_q, max_k in bad_offsets(cq, ck, max(lq), max(lk)):
        evotuner.flash_attention_varlen(q, k, v, wrong_q, wrong_k, max_q, max_k, causal=causal, config=config)
    torch.cuda.synchronize()
    return ok


def bad_offsets(cq: torch.Tensor, ck: torch.Tensor, max_q: int, max_k: int):
    """(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) a caller might pass by mistake."""
    over = cq.clone()
    over[-1] += 64                                           # past the end of q and o
    back = cq.clone()
    back[1] = back[-1] + 7                                   # sequence 0 too long, sequence 1 negative
    before = ck.clone()
    before[0] = -40                                          # keys from before row 0
    yield over, ck, max_q + 64, max_k
    yield back, ck, max(max_q, int(back[-1]) + 7), max_k
    yield cq, before, max_q, max_k + 40
    yield cq, ck, max(1, max_q // 2), max(1, max_k // 2)    # max_seqlen_* understated


_ONE_WG = "BLOCK_N=128,CONSUMER_WGS=1,STAGES=2,REG_PROD=24,REG_CONS=256,OVERLAP=1,PINGPONG=0,SCHED=0,RESCALE_LOG2=0," \
          "EXP_EMU=0"
_TWO_WG = "BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,SCHED=0,RESCALE_LOG2=0," \
          "EXP_EMU=0"
#: (B, H, HKV, Sq, Sk, D, causal, config): split-KV and query-head packing.
SPLIT = (
    (1, 4, 4, 3, 1000, 128, False, _ONE_WG + ",SPLITS=3"),             # 8 key blocks over 3 splits
    (1, 2, 2, 1, 300, 64, False, _ONE_WG + ",SPLITS=8"),               # 3 blocks, 8 splits: 5 empty
    (1, 2, 1, 150, 150, 128, True, _TWO_WG + ",SPLITS=4"),             # causal with split
    (2, 8, 2, 5, 700, 128, False, _ONE_WG + ",SPLITS=1,PACK_GQA=1"),   # packed heads
    (1, 8, 1, 16, 900, 128, False, _ONE_WG + ",SPLITS=4,PACK_GQA=1"),  # packed heads (2 tiles) with split
    (1, 2, 2, 1, 300, 96, False, _ONE_WG + ",SPLITS=8"),               # D=96: the combine's 3 columns per lane
)
_TWO_CTAS = "CONSUMER_WGS=1,REG_PROD=24,REG_CONS=232,OVERLAP=1,PINGPONG=0,RESCALE_LOG2=8,EXP_EMU=0,CTAS_PER_SM=2"
#: (B, H, HKV, Sq, Sk, D, causal, config): two CTAs per SM, every scheduler (the persistent
#: grids hold 2 x #SMs CTAs), ragged and causal, GQA.
CTAS = (
    (3, 5, 5, 97, 513, 128, True, _TWO_CTAS + ",BLOCK_N=64,STAGES=2,SCHED=0"),
    (2, 33, 33, 300, 300, 128, False, _TWO_CTAS + ",BLOCK_N=64,STAGES=2,SCHED=1"),    # 330 tiles > 264 CTAs
    (2, 40, 8, 513, 200, 64, True, _TWO_CTAS + ",BLOCK_N=128,STAGES=2,SCHED=2"),
)
_PAIR = "CONSUMER_WGS=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,RESCALE_LOG2=8,EXP_EMU=0,CLUSTER=2"
#: (B, H, HKV, Sq, Sk, D, causal, config): CTA pairs sharing K/V loads (CLUSTER=2, non-causal):
#: an odd number of query blocks (the last pair's second CTA has no rows), GQA, SCHED 0 and 1
#: with more pairs than the persistent grid's, D 64 (one panel), 128 and 256.
CLUSTER = (
    (3, 5, 5, 97, 513, 128, False, _PAIR + ",CTAS_PER_SM=1,BLOCK_N=128,STAGES=2,SCHED=0"),
    (2, 40, 8, 300, 200, 128, False, _PAIR + ",CTAS_PER_SM=1,BLOCK_N=128,STAGES=2,SCHED=1"),   # 120 pairs > 66
    (1, 8, 2, 513, 131, 64, False, _PAIR + ",CTAS_PER_SM=1,BLOCK_N=128,STAGES=2,SCHED=1"),
    (1, 2, 1, 300, 150, 256, False, _PAIR + ",BLOCK_N=64,STAGES=1,SCHED=1"),
)
_QREGS = "BLOCK_N=128,CONSUMER_WGS=2,STAGES=2,REG_PROD=24,REG_CONS=240,OVERLAP=1,PINGPONG=1,RESCALE_LOG2=8,EXP_EMU=0"
#: (B, H, HKV, Sq, Sk, D, causal, config): Q in registers (Q_IN_REGS=1): the cross-tile pipeline
#: with ragged tiles, causal persistent, D=96's padded panels with packed grouped heads, one row.
QREGS = (
    (3, 5, 5, 97, 513, 128, False, _QREGS + ",SCHED=2,TILE_OVERLAP=1,Q_IN_REGS=1"),
    (2, 8, 2, 300, 200, 64, True, _QREGS + ",SCHED=1,Q_IN_REGS=1"),
    (1, 8, 2, 77, 131, 96, False, _QREGS + ",SCHED=0,PACK_GQA=1,Q_IN_REGS=1"),
    (1, 4, 4, 1, 17, 128, False, _QREGS + ",SCHED=1,TILE_OVERLAP=1,Q_IN_REGS=1"),
)
_TAIL = "STAGES=2,REG_PROD=24,OVERLAP=1,RESCALE_LOG2=8,EXP_EMU=0,SCHED=3"
#: (B, H, HKV, Sq, Sk, D, causal, config): the last wave split (SCHED=3), small and ragged; on
#: 132 SMs the plans cut 1 tile in 4, 12 in 3 (ragged Sq and Sk), 12 in 5 (packed heads, three
#: warpgroups) and 8 in 8 (D=64).
TAIL = (
    (1, 133, 133, 60, 1100, 128, False, _TAIL + ",BLOCK_N=128,CONSUMER_WGS=1,REG_CONS=256,PINGPONG=0"),
    (2, 9, 3, 1000, 777, 128, False, _TAIL + ",BLOCK_N=128,CONSUMER_WGS=2,REG_CONS=240,PINGPONG=1"),
    (3, 9, 3, 1000, 777, 128, False, _TAIL + ",BLOCK_N=80,CONSUMER_WGS=3,REG_CONS=160,PINGPONG=1,PACK_GQA=1"),
    (1, 140, 140, 64, 2000, 64, False, _TAIL + ",BLOCK_N=128,CONSUMER_WGS=1,REG_CONS=256,PINGPONG=0"),
)
GROUPS = {"split": SPLIT, "ctas": CTAS, "cluster": CLUSTER, "qregs": QREGS, "tail": TAIL}


def _dense(family: str | None, B: int, H: int, Hkv: int, Sq: int, Sk: int, D: int, causal: bool,
           config: str | None) -> tuple[bool, str]:
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.float16) for _ in range(2))
    out, lse = evotuner.flash_attention(q, k, v, causal=causal, family=family, config=config, return_lse=True)
    torch.cuda.synchronize()
    ref, ref_lse = C.reference(q, k, v, causal, 1 / math.sqrt(D))
    tol = C.tolerance(C.torch_low_precision(q, k, v, causal, 1 / math.sqrt(D)), ref)
    ok, err, reason, _ = C.compare(out, ref, tol)
    ok = ok and bool(torch.allclose(lse, ref_lse, atol=1e-3))
    return ok, reason


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("all", "varlen", *GROUPS), default="all")
    ap.add_argument("--case", action="append", default=[], metavar="B,H,HKV,SQ,SK,D,CAUSAL,CONFIG",
                    help="run only this hopper case (CONFIG: 'NAME=value,...', or '-' for the recommended one); "
                         "repeatable")
    ap.add_argument("--head-dim", type=int, default=None, metavar="D",
                    help="run only the cases (of every group) at this head dim, e.g. 96")
    args = ap.parse_args(argv)
    keep = (lambda d: True) if args.head_dim is None else (lambda d: d == args.head_dim)
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 1
    bad = 0
    if args.case:
        for spec in args.case:
            try:
                *dims, causal, config = spec.split(",", 7)
                B, H, Hkv, Sq, Sk, D = (int(x) for x in dims)
            except ValueError:
                print(f"error: --case {spec!r}: expected B,H,HKV,SQ,SK,D,CAUSAL,CONFIG", file=sys.stderr)
                return 2
            ok, reason = _dense("hopper", B, H, Hkv, Sq, Sk, D, causal not in ("0", "False", "false"),
                                None if config == "-" else config)
            bad += not ok
            print(f"case {spec}: {'ok' if ok else 'WRONG ' + reason}")
        return 1 if bad else 0
    for group, cases in GROUPS.items():
        if args.only not in ("all", group):
            continue
        for B, H, Hkv, Sq, Sk, D, causal, config in cases:
            if not keep(D):
                continue
            ok, reason = _dense("hopper", B, H, Hkv, Sq, Sk, D, causal, config)
            bad += not ok
            print(f"{group:9s} B={B} H={H} HKV={Hkv} Sq={Sq} Sk={Sk} D={D} causal={int(causal)} "
                  f"{config.rsplit('EXP_EMU=0,', 1)[-1]}: {'ok' if ok else 'WRONG ' + reason}")
    if args.only not in ("all", "varlen"):
        return 1 if bad else 0
    for family, B, H, Hkv, Sq, Sk, D, causal in CASES:
        if not keep(D) or args.only == "varlen":
            continue
        ok, reason = _dense(family, B, H, Hkv, Sq, Sk, D, causal, None)
        bad += not ok
        print(f"{family:9s} B={B} H={H} HKV={Hkv} Sq={Sq} Sk={Sk} D={D} causal={int(causal)}: "
              f"{'ok' if ok else 'WRONG ' + reason}")
    for D, causal, lq, lk, config in VARLEN:
        if not keep(D):
            continue
        ok = _varlen(D, causal, lq, lk, config)
        bad += not ok
        print(f"varlen    D={D} causal={int(causal)} q lengths {lq} k lengths {lk} {config or 'recommended'}: "
              f"{'ok' if ok else 'WRONG'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
