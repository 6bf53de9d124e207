"""PGQueuer for benches/field/run.sh.

In a database of its own (the script creates and drops it):
  1. with --publish: N single enqueue() calls from 8 publishers on connections of their own
     (timed), then deleted;
  2. N jobs enqueued with one list enqueue() per 5,000 (its bulk insert, not timed);
  3. QueueManager.run(batch_size=--batch, max_concurrent_tasks=--tasks), timed from run() until
     the entrypoint has run N times;
  4. with --latency S: S jobs enqueued one at a time to the idle manager, each timed from
     enqueue() to the start of the entrypoint (same process, woken by LISTEN/NOTIFY).
Prints one JSON line.
"""

import argparse
import asyncio
import json
import time

import asyncpg
from pgqueuer import AsyncpgDriver, Queries, QueueManager


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--database-url", required=True)
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--publish", action="store_true")
    p.add_argument("--latency", type=int, default=0)
    a = p.parse_args()
    n = a.messages

    setup = await asyncpg.connect(a.database_url)
    queries = Queries(AsyncpgDriver(setup))
    await queries.install()

    publish_rate = None
    if a.publish:
        conns = [await asyncpg.connect(a.database_url) for _ in range(8)]

        async def publisher(i: int, conn: asyncpg.Connection) -> None:
            q = Queries(AsyncpgDriver(conn))
            for _ in range(n // 8 + (1 if i < n % 8 else 0)):
                await q.enqueue("publish", None)

        started = time.perf_counter()
        await asyncio.gather(*(publisher(i, c) for i, c in enumerate(conns)))
        publish_rate = n / (time.perf_counter() - started)
        for c in conns:
            await c.close()
        await queries.clear_queue("publish")

    started = time.perf_counter()
    for i in range(0, n, 5000):
        k = min(n, i + 5000) - i
        await queries.enqueue(["noop"] * k, [None] * k, [0] * k)
    insert_s = time.perf_counter() - started

    conn = await asyncpg.connect(a.database_url)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    loop = asyncio.get_running_loop()
    drained = loop.create_future()
    handled = 0
    waiting: list[asyncio.Future] = []

    @qm.entrypoint("noop")
    async def noop(job) -> None:
        nonlocal handled
        if job.payload:
            if waiting and not waiting[0].done():
                waiting[0].set_result(time.perf_counter() - float(job.payload.decode()))
            return
        handled += 1
        if handled == n and not drained.done():
            drained.set_result(time.perf_counter())

    started = time.perf_counter()
    running = asyncio.create_task(qm.run(batch_size=a.batch, max_concurrent_tasks=a.tasks))
    ended = await asyncio.wait_for(drained, 900)
    drain_rate = n / (ended - started)

    latencies = []
    for _ in range(a.latency):
        await asyncio.sleep(0.005)
        fut = loop.create_future()
        waiting[:] = [fut]
        await queries.enqueue("noop", str(time.perf_counter()).encode())
        try:
            latencies.append(await asyncio.wait_for(fut, 5) * 1000)
        except asyncio.TimeoutError:
            pass
    latencies.sort()

    def pct(q: float):
        if not latencies:
            return None
        return latencies[min(len(latencies) - 1, max(0, -(-int(q * 1000) * len(latencies) // 1000) - 1))]

    qm.shutdown.set()
    try:
        await asyncio.wait_for(running, 10)
    except Exception:
        pass
    print(
        json.dumps(
            {
                "system": "pgqueuer",
                "batch": a.batch,
                "tasks": a.tasks,
                "messages": n,
                "insert_s": insert_s,
                "drain_msgs_per_s": drain_rate,
                "publish_msgs_per_s": publish_rate,
                "latency_p50_ms": pct(0.5),
                "latency_p99_ms": pct(0.99),
                "latency_lost": a.latency - len(latencies),
            }
        ),
        flush=True,
    )


asyncio.run(main())
