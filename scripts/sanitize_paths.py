#!/usr/bin/env python3
"""One small ragged call of each runtime path added for models' attention, for
compute-sanitizer to watch (memcheck, racecheck, synccheck, initcheck):

    compute-sanitizer --tool memcheck --error-exitcode 9 python scripts/sanitize_paths.py

GQA (group 4) and MQA on both families, hopper at D=192 and 256 (their recommended configs,
causal and not, Sq != Sk with ragged tails), each call checked against the fp32 reference
so a silent wrong result fails too. Exit status 0 when every output is right.
"""

from __future__ import annotations

import math
import sys

import torch

import evotuner
from evotuner.runtime import check as C

#: (family, B, H, HKV, Sq, Sk, D, causal)
CASES = (
    ("hopper", 1, 8, 2, 77, 131, 64, True), ("hopper", 2, 4, 1, 65, 33, 128, False),
    ("flashcore", 1, 8, 2, 77, 131, 64, True), ("flashcore", 1, 4, 1, 33, 65, 128, False),
    ("hopper", 1, 2, 2, 97, 150, 192, True), ("hopper", 1, 2, 1, 70, 70, 192, False),
    ("hopper", 1, 2, 2, 97, 150, 256, True), ("hopper", 1, 2, 1, 70, 70, 256, False),
)


def main() -> int:
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 1
    bad = 0
    for family, B, H, Hkv, Sq, Sk, D, causal in CASES:
        q = torch.randn(B, H, Sq, D, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", dtype=torch.float16) for _ in range(2))
        out, lse = evotuner.flash_attention(q, k, v, causal=causal, family=family, return_lse=True)
        torch.cuda.synchronize()
        ref, ref_lse = C.reference(q, k, v, causal, 1 / math.sqrt(D))
        tol = C.tolerance(C.torch_low_precision(q, k, v, causal, 1 / math.sqrt(D)), ref)
        ok, err, reason, _ = C.compare(out, ref, tol)
        ok = ok and bool(torch.allclose(lse, ref_lse, atol=1e-3))
        bad += not ok
        print(f"{family:9s} B={B} H={H} HKV={Hkv} Sq={Sq} Sk={Sk} D={D} causal={int(causal)}: "
              f"{'ok' if ok else 'WRONG ' + reason}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
