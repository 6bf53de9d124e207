"""Absurd (PyPI `absurd-sdk`, schema from `absurdctl init`): 5-step no-op workflows worked by 8.

Written the way Absurd's SDK documentation writes them: a task registered with
`app.register_task(name=...)` whose body runs its steps with `ctx.step(name, fn)` (each step's
result is a checkpoint row), spawned with `spawn(...)` and run by
`app.start_worker(concurrency=8)` (one claim loop feeding a pool of 8 threads). The worker polls
for tasks every `poll_interval`: 0.25 s at its defaults, 0.01 s in mode poll10ms. The schema is
installed by `absurdctl init` (the SQL bundled in absurdctl, needs psql) in a scratch database
of its own (see common.py).

Throughput: the clock starts, the main thread spawns WORKFLOWS tasks one by one (on a client of
its own) while the worker runs them, and the clock stops when the last one is `completed` (read
by a plain count every 5 ms once all are spawned). Latency: on the then idle worker, after a
random 0-1 s gap (common.idle_gap), one task at a time is spawned and its result read through
`fetch_task_result` every 1 ms until it is completed; start-to-result is from before the spawn
to that read (p50_ms, p99_ms). The same tasks' rows give start-to-end without the probe: the
run's completed_at - the task's enqueue_at (recorded_p50_ms, recorded_p99_ms).

--layout clients runs WORKERS clients instead, each with its own connection and a
start_worker() of one task at a time (the pool's 8 threads share one connection); run.sh uses
the default, pool, unless ABSURD_LAYOUT says otherwise.

Run by run.sh from a venv with the pinned packages of requirements-absurd.txt.
"""

import subprocess
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path

import psycopg
from absurd_sdk import Absurd

from common import idle_gap, parse_args, report, scratch_database, wait_until

QUEUE = "wfbench"
TASK = "no-op-workflow"


def layout_option(p) -> None:
    p.add_argument("--layout", choices=("pool", "clients"), default="pool",
                   help="pool: one client's start_worker(concurrency=WORKERS), the SDK's way to run "
                   "several tasks at once (its threads share the client's connection); clients: "
                   "WORKERS clients, each its own connection and start_worker()")


def main() -> None:
    args = parse_args("absurd", layout_option)
    with scratch_database(args.url, "absurd") as url:
        absurdctl = Path(sys.executable).with_name("absurdctl")
        subprocess.run([str(absurdctl), "init", "-d", url], check=True, stdout=subprocess.DEVNULL)

        poll = {} if args.mode == "defaults" else {"poll_interval": 0.01}
        if args.layout == "pool":
            apps = [Absurd(url, queue_name=QUEUE)]
            run = {"concurrency": args.workers, **poll}
        else:
            apps = [Absurd(url, queue_name=QUEUE) for _ in range(args.workers)]
            run = poll
        apps[0].create_queue(QUEUE)
        for app in apps:
            @app.register_task(name=TASK)
            def no_op_workflow(params, ctx):
                total = 0
                for i in range(params["steps"]):
                    total += ctx.step(f"step-{i}", lambda i=i: i)
                return total

        workers = [threading.Thread(target=app.start_worker, kwargs=run) for app in apps]
        for worker in workers:
            worker.start()
        spawner = Absurd(url, queue_name=QUEUE)
        try:
            with psycopg.connect(url, autocommit=True) as probe:
                def count(state: str) -> int:
                    return probe.execute(
                        "select count(*) from absurd.t_wfbench where state = %s", (state,)
                    ).fetchone()[0]

                started = time.perf_counter()
                for i in range(args.workflows):
                    spawner.spawn(TASK, {"steps": args.steps, "n": i}, queue=QUEUE)
                wait_until(lambda: count("completed") >= args.workflows, 3600, 0.005)
                seconds = time.perf_counter() - started
                if count("failed"):
                    raise SystemExit("absurd: some tasks failed")
                steps_recorded = probe.execute("select count(*) from absurd.c_wfbench").fetchone()[0]
                if steps_recorded != args.workflows * args.steps:
                    raise SystemExit(f"absurd: {steps_recorded} checkpoints recorded, "
                                     f"expected {args.workflows * args.steps}")

                latencies, ids = [], []
                for i in range(args.latency_samples):
                    idle_gap()
                    t0 = time.perf_counter()
                    task_id = spawner.spawn(TASK, {"steps": args.steps, "n": -1 - i}, queue=QUEUE)["task_id"]
                    ids.append(task_id)

                    def done() -> bool:
                        snap = spawner.fetch_task_result(task_id)
                        if snap is not None and snap.state == "failed":
                            raise SystemExit(f"absurd: task {task_id} failed")
                        return snap is not None and snap.state == "completed"

                    wait_until(done, 60, 0.001)
                    latencies.append((time.perf_counter() - t0) * 1000)
                # The task row is stamped when spawned, its run's row when it completes.
                recorded = [r[0] for r in probe.execute(
                    "select extract(epoch from r.completed_at - t.enqueue_at)::float8 * 1000"
                    " from absurd.t_wfbench t join absurd.r_wfbench r using (task_id)"
                    " where t.task_id = any(%s) and r.state = 'completed'", (ids,)).fetchall()]
        finally:
            for app in apps:
                app.stop_worker()
            for worker in workers:
                worker.join()
            spawner.close()
            for app in apps:
                app.close()
    report("absurd", version("absurd-sdk"), args, seconds, latencies, recorded,
           {"layout": args.layout, "steps_recorded": steps_recorded})


if __name__ == "__main__":
    main()
