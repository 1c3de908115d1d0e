# P1: cluster launch kept, multicast and cross-CTA release removed (each CTA loads its own K/V)
import re, pathlib
p = pathlib.Path("kernels/hopper/producer.cuh"); s = p.read_text()
old = """            if (pnl % T::kCluster == rank)
                tma_load_5d_multicast(dst + pnl * T::kBlockN * 128, map, bar, 0, row, pnl, head, batch,
                                      static_cast<uint16_t>((1u << T::kCluster) - 1));"""
assert old in s
s = s.replace(old, """            (void)rank; tma_load_5d(dst + pnl * T::kBlockN * 128, map, bar, 0, row, pnl, head, batch);""")
p.write_text(s)
p = pathlib.Path("kernels/hopper/consumer.cuh"); s = p.read_text()
old = "for (int r = 0; r < T::kCluster; ++r) mbar_arrive_cluster(mapa_shared(bar, static_cast<uint32_t>(r)));"
assert old in s
s = s.replace(old, "mbar_arrive(bar);")
p.write_text(s)
p = pathlib.Path("kernels/hopper/kernel.cuh"); s = p.read_text()
for w in ("k_empty", "v_empty"):
    old = f"mbar_init(sm.{w}(s), T::kWGs * T::kCluster);"
    assert old in s
    s = s.replace(old, f"mbar_init(sm.{w}(s), T::kWGs);")
p.write_text(s)
print("patched P1")
