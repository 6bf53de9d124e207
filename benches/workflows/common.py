"""Shared by dbos_bench.py and absurd_bench.py: the scratch database, the options, the figures.

Each driver creates a database of its own on the server of --url (named after the driver and
its PID, so a run touches nothing but its own), runs one mode of its system in it and drops it
at the end, whatever happened. It prints one JSON line per measurement on stdout:
{system, mode, workflows, seconds, workflows_per_s, steps_per_s, p50_ms, p99_ms, ...}.
"""

import argparse
import json
import os
import random
import signal
import sys
import time
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

# The two modes every polling system is measured in: its own defaults, and a 10 ms poll.
MODES = ("defaults", "poll10ms")


def parse_args(system: str, more=None) -> argparse.Namespace:
    """The options every driver takes; more(parser) adds a driver's own."""
    # run.sh stops a run with SIGTERM when its PAUSE_FILE appears: exit through the finally
    # blocks, so that the workers stop and the scratch database is dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = argparse.ArgumentParser(description=f"{system}: throughput and latency of 5-step no-op workflows")
    p.add_argument("--url", default=os.environ.get("PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
                   help="any database on the PostgreSQL server; a scratch database is made beside it")
    p.add_argument("--mode", choices=MODES, default="defaults")
    p.add_argument("--workflows", type=int, default=1000, help="workflows in the throughput run")
    p.add_argument("--steps", type=int, default=5, help="no-op steps per workflow")
    p.add_argument("--workers", type=int, default=8, help="concurrent workers")
    p.add_argument("--latency-samples", type=int, default=50,
                   help="workflows started one at a time on the idle worker for p50/p99")
    if more is not None:
        more(p)
    return p.parse_args()


@contextmanager
def scratch_database(url: str, system: str):
    """Creates database wfbench_<system>_<pid> on url's server, yields its URL, drops it."""
    name = f"wfbench_{system}_{os.getpid()}"
    u = urlsplit(url)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    try:
        yield urlunsplit((u.scheme, u.netloc, "/" + name, u.query, ""))
    finally:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))


def idle_gap() -> None:
    """Sleeps a random 0-1 s before a latency sample. Samples started right after the previous
    one ended would be locked to the worker's poll cycle (an Absurd worker that just found
    nothing sleeps its whole 0.25 s, every time); the random gap spreads the starts over it, as
    starts that come at any time are (DBOS polls every 1 s at its defaults, hence 1 s)."""
    time.sleep(random.uniform(0.0, 1.0))


def wait_until(probe, timeout_s: float, period_s: float):
    """Calls probe() every period_s until it returns a true value; returns it (or raises)."""
    deadline = time.monotonic() + timeout_s
    while True:
        v = probe()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done after {timeout_s} s")
        time.sleep(period_s)


def percentile(sorted_ms, q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    i = max(0, min(len(sorted_ms) - 1, int(round(q * len(sorted_ms) + 0.5)) - 1))
    return sorted_ms[i]


def report(system: str, version: str, args, seconds: float, latencies_ms, recorded_ms, extra=None) -> None:
    """Prints the JSON line. latencies_ms: start to result as the caller saw it (probing every
    1 ms); recorded_ms: the same workflows' start to end as their own rows record it (no probe)."""
    lat = sorted(latencies_ms)
    rec = sorted(recorded_ms)
    line = {
        "system": system,
        "version": version,
        "mode": args.mode,
        "workers": args.workers,
        "workflows": args.workflows,
        "steps_per_workflow": args.steps,
        "seconds": round(seconds, 3),
        "workflows_per_s": round(args.workflows / seconds, 1),
        "steps_per_s": round(args.workflows * args.steps / seconds, 1),
        "p50_ms": round(percentile(lat, 0.50), 2) if lat else None,
        "p99_ms": round(percentile(lat, 0.99), 2) if lat else None,
        "latency_samples": len(lat),
        "recorded_p50_ms": round(percentile(rec, 0.50), 2) if rec else None,
        "recorded_p99_ms": round(percentile(rec, 0.99), 2) if rec else None,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    line.update(extra or {})
    print(json.dumps(line), flush=True)
