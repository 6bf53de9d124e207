#!/usr/bin/env python3
"""The plain SKIP LOCKED table's figures of benches/horizon/run.sh, a line per 10 s, in the
shape of `rowbus bench horizon`'s: rows deleted a second (handled), the consumers'
transaction (the claim's UPDATE and the DELETE) p50 and p99 in ms from pgbench's
per-transaction log, dead tuples and size from the sampler.

    plain.py WORKDIR RATE
"""

import glob
import os
import re
import sys


def percentile(values, q):
    if not values:
        return 0.0
    values = sorted(values)
    rank = max(1, min(len(values), int(-(-q * len(values) // 1))))
    return values[rank - 1]


def main():
    work = sys.argv[1]
    window = 10.0
    # pgbench -l: client transaction latency_us script epoch_s epoch_us [lag]
    done = []
    for path in glob.glob(os.path.join(work, "consume.*")):
        if not re.fullmatch(r"consume\.\d+(\.\d+)?", os.path.basename(path)):
            continue
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 6 or parts[2] == "skipped":
                    continue
                done.append((int(parts[4]) + int(parts[5]) / 1e6, int(parts[2]) / 1000.0))
    if not done:
        print("plain: no transactions logged")
        return
    start = min(t for t, _ in done)
    buckets = {}
    for t, ms in done:
        buckets.setdefault(int((t - start) // window), []).append(ms)
    samples = []
    with open(os.path.join(work, "plain.txt")) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 4:
                samples.append((float(parts[0]), int(parts[1]), int(parts[2]), int(parts[3])))
    print("plain SKIP LOCKED table (pgbench), a line per 10 s:")
    print(f"{'t (s)':>7}  {'deleted/s':>9}  {'txn50':>7}  {'txn99':>7}  {'dead':>10}  {'size (kB)':>10}")
    previous = 0
    for i, (at, deleted, dead, size) in enumerate(samples):
        latencies = buckets.get(i, [])
        print(
            f"{at:>7.0f}  {(deleted - previous) / window:>9.0f}  {percentile(latencies, 0.5):>7.2f}  "
            f"{percentile(latencies, 0.99):>7.2f}  {dead:>10}  {size // 1024:>10}"
        )
        previous = deleted


if __name__ == "__main__":
    main()
