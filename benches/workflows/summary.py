"""Prints the table of benches/workflows/run.sh from its JSON lines (one per run).

  summary.py RESULTS.jsonl

One row per system and mode: the rounds' workflows/s (and their median), the median steps/s,
and the median of the rounds' p50 and p99 start-to-result latencies.
"""

import json
import statistics
import sys


def main() -> None:
    rows: dict[tuple[str, str], list[dict]] = {}
    with open(sys.argv[1]) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                label = f"{d['system']} {d.get('version', '')} {d.get('layout', '')}".strip()
                rows.setdefault((label, d["mode"]), []).append(d)
    if not rows:
        print("no results")
        return
    print(f"{'system':<20} {'mode':<9} {'workflows/s per round':<24} {'median':>7} {'steps/s':>8} "
          f"{'p50 ms':>7} {'p99 ms':>7}")
    for (system, mode), runs in rows.items():
        wps = [r["workflows_per_s"] for r in runs]
        per_round = " ".join(f"{w:.1f}" for w in wps)
        print(f"{system:<20} {mode:<9} {per_round:<24} {statistics.median(wps):>7.1f} "
              f"{statistics.median(r['steps_per_s'] for r in runs):>8.1f} "
              f"{statistics.median(r['p50_ms'] for r in runs):>7.1f} "
              f"{statistics.median(r['p99_ms'] for r in runs):>7.1f}")


if __name__ == "__main__":
    main()
