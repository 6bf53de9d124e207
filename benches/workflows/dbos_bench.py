"""DBOS Transact (PyPI `dbos`): 5-step no-op workflows on a queue worked by 8 workers.

Written the way DBOS's documentation writes them: `@DBOS.step()` functions called from a
`@DBOS.workflow()` function, started with `queue.enqueue(...)` on a queue declared with
`DBOS.register_queue(name, worker_concurrency=8)`. The queue is polled by DBOS's queue thread
every `polling_interval_sec`: 1 s at its defaults, 0.01 s in mode poll10ms. The system database
is a scratch PostgreSQL database of its own (see common.py).

Throughput: the clock starts, the main thread enqueues WORKFLOWS workflows one by one while the
queue's workers run them, and the clock stops when the last one's status is SUCCESS (read by a
plain count every 5 ms once all are enqueued). Latency: on the then idle queue, after a random
0-1 s gap (common.idle_gap), one workflow at a time is enqueued and its status read through
`DBOS.get_workflow_status` every 1 ms until it is SUCCESS; start-to-result is from before the
enqueue to that read (p50_ms, p99_ms). The same workflows' rows give start-to-end without the
probe: completed_at - created_at, in milliseconds (recorded_p50_ms, recorded_p99_ms).

Run by run.sh from a venv with the pinned packages of requirements-dbos.txt.
"""

import time
from importlib.metadata import version

import psycopg
from dbos import DBOS, DBOSConfig

from common import idle_gap, parse_args, report, scratch_database, wait_until

QUEUE = "wfbench"


@DBOS.step()
def noop_step(i: int) -> int:
    return i


@DBOS.workflow()
def no_op_workflow(steps: int) -> int:
    total = 0
    for i in range(steps):
        total += noop_step(i)
    return total


def main() -> None:
    args = parse_args("dbos")
    with scratch_database(args.url, "dbos") as url:
        config: DBOSConfig = {
            "name": "wfbench",
            "system_database_url": url,
            # Logging only (DBOS logs at INFO on launch); stdout is for the JSON line.
            "log_level": "WARNING",
        }
        DBOS(config=config)
        poll = {} if args.mode == "defaults" else {"polling_interval_sec": 0.01}
        # A queue is registered in the system database, so after launch.
        DBOS.launch()
        queue = DBOS.register_queue(QUEUE, worker_concurrency=args.workers, **poll)
        try:
            with psycopg.connect(url, autocommit=True) as probe:
                def succeeded() -> int:
                    return probe.execute(
                        "select count(*) from dbos.workflow_status where queue_name = %s and status = 'SUCCESS'",
                        (QUEUE,),
                    ).fetchone()[0]

                def errored() -> int:
                    return probe.execute(
                        "select count(*) from dbos.workflow_status where queue_name = %s and status = 'ERROR'",
                        (QUEUE,),
                    ).fetchone()[0]

                started = time.perf_counter()
                for _ in range(args.workflows):
                    queue.enqueue(no_op_workflow, args.steps)
                wait_until(lambda: succeeded() >= args.workflows, 3600, 0.005)
                seconds = time.perf_counter() - started
                if errored():
                    raise SystemExit("dbos: some workflows ended in ERROR")
                steps_recorded = probe.execute(
                    "select count(*) from dbos.operation_outputs where function_name like %s",
                    ("%noop_step",),
                ).fetchone()[0]
                if steps_recorded != args.workflows * args.steps:
                    raise SystemExit(f"dbos: {steps_recorded} step outputs recorded, "
                                     f"expected {args.workflows * args.steps}")

                latencies, ids = [], []
                for _ in range(args.latency_samples):
                    idle_gap()
                    t0 = time.perf_counter()
                    handle = queue.enqueue(no_op_workflow, args.steps)
                    wid = handle.get_workflow_id()
                    ids.append(wid)

                    def done() -> bool:
                        st = DBOS.get_workflow_status(wid)
                        if st is not None and st.status == "ERROR":
                            raise SystemExit(f"dbos: workflow {wid} ended in ERROR")
                        return st is not None and st.status == "SUCCESS"

                    wait_until(done, 60, 0.001)
                    latencies.append((time.perf_counter() - t0) * 1000)
                # DBOS stamps a workflow's row in epoch milliseconds when it is enqueued and when
                # it ends.
                recorded = [r[0] for r in probe.execute(
                    "select (completed_at - created_at)::float8 from dbos.workflow_status"
                    " where workflow_uuid = any(%s)", (ids,)).fetchall()]
        finally:
            DBOS.destroy()
    report("dbos", version("dbos"), args, seconds, latencies, recorded, {"steps_recorded": steps_recorded})


if __name__ == "__main__":
    main()
