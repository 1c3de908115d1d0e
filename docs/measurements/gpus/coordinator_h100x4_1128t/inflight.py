import sqlite3, sys, datetime as dt, statistics as S
for db in sys.argv[1:]:
    c = sqlite3.connect(db)
    rows = c.execute("select number, datetime_start, datetime_complete from trials order by number").fetchall()
    f = lambda s: dt.datetime.fromisoformat(s).timestamp() if s else 1e18
    iv = [(f(a), f(b)) for _, a, b in rows]
    inflight = [sum(1 for s, e in iv if s < t0 < e) for t0, _ in iv]
    gaps = [b[0] - a[0] for a, b in zip(iv, iv[1:])]
    print(db, "in flight at ask: median", S.median(inflight), "max", max(inflight), "| ask gap median %.3f" % S.median(gaps))
