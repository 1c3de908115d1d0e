"""i13 capture: build the cubins the sanitizer/ncu runs need (outside any tool)."""
import json, sys
from pathlib import Path
from evotuner.compiler import Builder
from evotuner.defaults import recommended
from evotuner.problem import Problem, Shape
from evotuner.space import load_space

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
repo = Path(__file__).resolve().parents[2]
arts = {}
default = load_space(None)
faults = load_space(repo / "tests/data/spaces/faults.toml")
jobs = []
with Builder(default.kernel, arch=default.arch, cache_dir=out / "cache") as b:
    for causal in (False, True):
        p = Problem(Shape(16, 16, 2048, 2048, 64), "fp16", causal)
        cfg = recommended(p)[0]
        jobs.append((f"clean_{'c' if causal else 'nc'}", cfg, p, b.submit(cfg, p)))
with Builder(faults.kernel, arch=faults.arch, cache_dir=out / "cache") as b:
    p = Problem(Shape(16, 16, 2048, 2048, 64), "fp16", False)
    for c in faults.configs():
        if c["FAULT"] == 1:
            jobs.append(("fault1", c, p, b.submit(c, p)))
for name, cfg, p, fut in jobs:
    r = fut.result()
    assert r.ok, (name, r.error)
    a = r.artifact
    arts[name] = {"cubin": str(a.cubin), "entry": a.entry, "key": a.key, "meta": dict(a.meta),
                  "config": str(cfg), "problem": p.as_dict()}
(out / "artifacts.json").write_text(json.dumps(arts, indent=1))
print(json.dumps({k: v["config"] for k, v in arts.items()}))
