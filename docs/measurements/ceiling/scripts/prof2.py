"""ours (recommended) or SDPA at one shape, three calls: python3 prof2.py ours|sdpa B H S D C HKV"""
import sys
import torch
import torch.nn.functional as F
import evotuner
who = sys.argv[1]
B, H, S, D, C, HKV = (int(x) for x in sys.argv[2:8])
q = torch.randn(B, H, S, D, device="cuda", dtype=torch.float16)
k, v = (torch.randn(B, HKV, S, D, device="cuda", dtype=torch.float16) for _ in range(2))
for _ in range(3):
    if who == "ours":
        evotuner.flash_attention(q, k, v, causal=bool(C))
    else:
        F.scaled_dot_product_attention(q, k, v, is_causal=bool(C), enable_gqa=HKV != H)
torch.cuda.synchronize()
if who == "ours":
    _, ch = evotuner.flash_attention(q, k, v, causal=bool(C), return_choice=True)
    print("CHOICE", ch.family, ch.config, ch.why)
