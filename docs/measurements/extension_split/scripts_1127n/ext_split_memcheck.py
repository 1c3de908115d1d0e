"""Build hopper_ext from test_export's studies (with the split-KV row) into argv[1]; then
run the split row at small ragged shapes (meant under compute-sanitizer with
PYTORCH_NO_CUDA_MEMORY_CACHING=1, so each scratch is its own allocation)."""
import sys
from pathlib import Path
sys.path.insert(0, "tests")
out = Path(sys.argv[1])
if sys.argv[2] == "build":
    import test_export as te
    bx = te._build_extension_module()
    out.mkdir(parents=True, exist_ok=True)
    te.export_header(te.hopper_studies(pack=True, split=True), te.HOPPER_SPLIT_STUDIES, out / "tuned.h")
    built = bx.build(out / "tuned.h", out / "ext", family="hopper")
    print("built", built.module)
else:
    import torch
    sys.path.insert(0, str(out / "ext")); import hopper_ext as f
    F = torch.nn.functional
    for B, H, HKV, Sq, Sk in ((1, 8, 2, 1, 2100), (2, 4, 4, 37, 2300), (1, 8, 1, 3, 2500), (1, 2, 2, 100, 2049)):
        assert f.select(128, "bf16", False, Sk) == 4
        q = torch.randn(B, H, Sq, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, HKV, Sk, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for _ in range(2):
            o = f.attention(q, k, v, False, 0.1)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.1, enable_gqa=True)
        err = (o.float() - ref).abs().max().item()
        print(B, H, HKV, Sq, Sk, "err", err)
        assert err < 2e-2
    print("OK")
