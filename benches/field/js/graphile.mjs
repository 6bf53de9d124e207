// graphile-worker for benches/field/run.sh. In a database of its own (the script creates and
// drops it):
//   1. with --publish: N single addJob calls from 8 concurrent publishers (timed), then deleted;
//   2. N jobs added with one addJobs call per 5,000 (its bulk insert, not timed);
//   3. a runner at --concurrency, timed from run() until its task function has run N times;
//   4. with --latency S: S jobs added one at a time to the idle runner, each timed from addJob
//      to the start of its task function (same process, woken by LISTEN/NOTIFY).
// --mode preset: the settings of graphile-worker's performance page (local queue of 500 jobs,
// job completions batched with completeJobBatchDelay/failJobBatchDelay 0, a pool one larger
// than the concurrency); --mode defaults: the library's defaults. Prints one JSON line.
import { Logger, makeWorkerUtils, run, runMigrations } from "graphile-worker";

const opts = { url: "", messages: 20000, concurrency: 8, mode: "defaults", publish: false, latency: 0 };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const flag = argv[i];
  if (flag === "--publish") opts.publish = true;
  else if (flag === "--database-url") opts.url = argv[++i];
  else if (flag === "--messages") opts.messages = Number(argv[++i]);
  else if (flag === "--concurrency") opts.concurrency = Number(argv[++i]);
  else if (flag === "--mode") opts.mode = argv[++i];
  else if (flag === "--latency") opts.latency = Number(argv[++i]);
  else throw new Error(`unknown argument ${flag}`);
}
const N = opts.messages;
const logger = new Logger(() => () => {});
const connectionString = opts.url;
const preset =
  opts.mode === "preset"
    ? {
        worker: {
          localQueue: { size: 500 },
          completeJobBatchDelay: 0,
          failJobBatchDelay: 0,
          maxPoolSize: opts.concurrency + 1,
        },
      }
    : { worker: {} };

await runMigrations({ connectionString, logger });
const utils = await makeWorkerUtils({ connectionString, logger });

let publishRate = null;
if (opts.publish) {
  const started = performance.now();
  await Promise.all(
    Array.from({ length: 8 }, async (_, p) => {
      const count = Math.floor(N / 8) + (p < N % 8 ? 1 : 0);
      for (let i = 0; i < count; i++) await utils.addJob("noop", { i });
    }),
  );
  publishRate = N / ((performance.now() - started) / 1000);
  await utils.withPgClient((c) => c.query("delete from graphile_worker._private_jobs"));
}

const insertStarted = performance.now();
for (let i = 0; i < N; i += 5000) {
  const specs = [];
  for (let j = i; j < Math.min(N, i + 5000); j++) specs.push({ identifier: "noop", payload: { i: j } });
  await utils.addJobs(specs);
}
const insertS = (performance.now() - insertStarted) / 1000;

let handled = 0;
let drained;
const allHandled = new Promise((resolve) => (drained = resolve));
let waiting = null;
const taskList = {
  noop: async (payload) => {
    if (payload && payload.t !== undefined) {
      if (waiting) waiting(performance.now() - payload.t);
      return;
    }
    if (++handled === N) drained(performance.now());
  },
};
const started = performance.now();
const runner = await run({
  connectionString,
  concurrency: opts.concurrency,
  taskList,
  logger,
  noHandleSignals: true,
  preset,
});
const ended = await allHandled;
const drainRate = N / ((ended - started) / 1000);

const latencies = [];
for (let s = 0; s < opts.latency; s++) {
  await new Promise((r) => setTimeout(r, 5));
  const measured = new Promise((resolve) => (waiting = resolve));
  await utils.addJob("noop", { t: performance.now() });
  latencies.push(await Promise.race([measured, new Promise((r) => setTimeout(() => r(null), 5000))]));
}
const got = latencies.filter((l) => l !== null).sort((a, b) => a - b);
const pct = (q) => (got.length ? got[Math.min(got.length - 1, Math.ceil(q * got.length) - 1)] : null);

await runner.stop();
await utils.release();
console.log(
  JSON.stringify({
    system: "graphile-worker",
    mode: opts.mode,
    concurrency: opts.concurrency,
    messages: N,
    insert_s: insertS,
    drain_msgs_per_s: drainRate,
    publish_msgs_per_s: publishRate,
    latency_p50_ms: pct(0.5),
    latency_p99_ms: pct(0.99),
    latency_lost: latencies.length - got.length,
  }),
);
process.exit(0);
