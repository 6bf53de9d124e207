"""The table of benches/field/run.sh: medians per system, and the ratios rowbus / peer.

  summary.py RESULTS MESSAGES PUBLISHES ROUNDS
"""

import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
messages, publishes, rounds = sys.argv[2:5]

def med(db, who, key):
    runs = [r[key] for r in rows if r["db"] == db and r["who"] == who and r[key] is not None]
    return (statistics.median(runs), runs) if runs else (None, [])

print(f"Medians of {rounds} interleaved rounds: drain of {messages} jobs, publish of {publishes} single "
      f"publishes from 8 publishers, latency publish-to-handler in one process")
print(f"{'database':<11} {'system':<34} {'drain/s':>9} {'publish/s':>9} {'p50 ms':>7} {'p99 ms':>7}  runs (drain or publish)")
dbs = list(dict.fromkeys(r["db"] for r in rows))
for db in dbs:
    whos = list(dict.fromkeys(r["who"] for r in rows if r["db"] == db))
    for who in whos:
        d, runs = med(db, who, "drain")
        p, pruns = med(db, who, "publish")
        runs = runs or pruns
        l50, _ = med(db, who, "p50")
        l99, _ = med(db, who, "p99")
        f = lambda v, fmt: "" if v is None else format(v, fmt)
        print(f"{db:<11} {who:<34} {f(d, ',.0f'):>9} {f(p, ',.0f'):>9} {f(l50, '.2f'):>7} {f(l99, '.2f'):>7}  "
              f"{' '.join(f'{v:,.0f}' for v in runs)}")
print()
print("Ratios rowbus / peer: of the medians, and per round (the figures of one round were measured together)")
def per_round(db, who, key):
    # The k-th figure of a system on a database is from round k.
    return [r[key] for r in rows if r["db"] == db and r["who"] == who]

def ratio(db, a, b, key="drain"):
    x, _ = med(db, a, key)
    y, _ = med(db, b, key)
    if x is None or y is None or y == 0:
        return
    pairs = [u / v for u, v in zip(per_round(db, a, key), per_round(db, b, key)) if u is not None and v]
    rounds = f"  (per round: {' '.join(f'{q:.2f}' for q in pairs)}; median {statistics.median(pairs):.2f}x)" if pairs else ""
    print(f"{db:<11} {key:<8} {a} / {b}: {x / y:.2f}x{rounds}")
cli, lib, raw = "rowbus CLI consume, 8 workers", "rowbus library run, 8 workers", "raw16 claim loop (ceiling)"
for db in dbs:
    whos = list(dict.fromkeys(r["who"] for r in rows if r["db"] == db))
    graphile = [w for w in whos if w.startswith("graphile-worker") and med(db, w, "drain")[0] is not None]
    if graphile:
        best = max(graphile, key=lambda w: med(db, w, "drain")[0])
        ratio(db, cli, best)
        ratio(db, lib, best)
    for w in whos:
        if (w.startswith("apalis") or w.startswith("pg-boss") or w.startswith("PGQueuer")) and med(db, w, "drain")[0] is not None:
            ratio(db, cli, w)
            ratio(db, lib, w)
    ratio(db, cli, raw)
    ratio(db, lib, raw)
    for w in whos:
        if w != lib and med(db, w, "publish")[0] is not None:
            ratio(db, lib, w, "publish")
