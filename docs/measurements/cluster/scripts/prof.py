"""One config at one shape through evotuner.flash_attention, three calls (ncu profiles the 2nd):
python3 prof.py CONFIG [B H S D]."""
import sys

import torch

import evotuner

cfg = sys.argv[1]
B, H, S, D = (int(x) for x in sys.argv[2:6]) if len(sys.argv) > 2 else (8, 16, 2048, 128)
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
for _ in range(3):
    evotuner.flash_attention(q, k, v, config=cfg)
torch.cuda.synchronize()
