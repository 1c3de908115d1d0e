"""Sample per-thread CPU (utime+stime, clock ticks) of a process every 2 s, and the host's busy share."""
import os, sys, time
pid = int(sys.argv[1]); hz = os.sysconf("SC_CLK_TCK")
def host():
    v = list(map(int, open("/proc/stat").readline().split()[1:]))
    return sum(v), v[3] + v[4]
prev, (ht, hi) = {}, host()
while os.path.exists(f"/proc/{pid}"):
    time.sleep(2.0)
    now = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                parts = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
                now[tid] = (int(parts[11]) + int(parts[12])) / hz
            except OSError:
                pass
    except OSError:
        break
    t2, i2 = host()
    busy = 1 - (i2 - hi) / max(1, t2 - ht); ht, hi = t2, i2
    delta = sorted(((now[t] - prev.get(t, 0.0), t) for t in now), reverse=True)[:6]
    print(f"{time.time():.1f} host_busy={busy:.2f} " + " ".join(f"{t}:{d:.2f}" for d, t in delta if d > 0.01), flush=True)
    prev = now
