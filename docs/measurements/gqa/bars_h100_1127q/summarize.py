"""The issue-24 bars over many bench processes: per shape, the median of the processes' graph and
eager ratios (each already the median of its 5 rounds), their range and how many processes
reached 1.10x. Usage: python3 summarize.py runs/*.json"""

import json
import statistics
import sys

BAR = 1.10
acc: dict[tuple, dict[str, list[float]]] = {}
for path in sys.argv[1:]:
    for r in json.load(open(path))["rows"]:
        b, h, s, d = r["shape"]
        key = (f"{b},{h}/{r['heads_kv']},{s},{d}" if r["heads_kv"] != h else f"{b},{h},{s},{d}") + \
              (" causal" if r["causal"] else "")
        row = acc.setdefault(key, {"graph": [], "eager": []})
        row["graph"].append(r["evotuner_graph_x"])
        row["eager"].append(r["evotuner_eager_x"])
n = len(sys.argv) - 1
print(f"{n} processes; x = SDPA / ours; median [min-max], processes >= {BAR}")
print(f"{'shape':<28}{'graph x':>28}{'eager x':>28}  short of {BAR} (graph / eager)")
for key, row in acc.items():
    cells, short = [], []
    for kind in ("graph", "eager"):
        xs = sorted(row[kind])
        med = statistics.median(xs)
        cells.append(f"{med:.3f} [{xs[0]:.3f}-{xs[-1]:.3f}] {sum(x >= BAR for x in xs):>2}/{len(xs)}")
        short.append("met" if med >= BAR else f"{BAR - med:.3f}")
    print(f"{key:<28}{cells[0]:>28}{cells[1]:>28}  {' / '.join(short)}")
