// pg-boss for benches/field/run.sh. In a database of its own (the script creates and drops it):
//   1. with --publish: N single send() calls from 8 concurrent publishers (timed), then deleted;
//   2. N jobs inserted with one insert() call per 5,000 (its bulk insert, not timed);
//   3. work() with --workers pollers (localConcurrency) of --batch jobs each, timed from work()
//      until the handler has seen N jobs.
// A pg-boss worker waits pollingIntervalSeconds (2 s by default, 0.5 s at least) between two
// fetches even when the last one came back full, unless a burst trigger is on; the drain here
// turns on burstWhenBatchFull (fetch again at once while fetches come back full) and polls every
// 0.5 s, its fastest settings. Prints one JSON line.
import { PgBoss } from "pg-boss";

const opts = { url: "", messages: 20000, workers: 1, batch: 8, publish: false };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  const flag = argv[i];
  if (flag === "--publish") opts.publish = true;
  else if (flag === "--database-url") opts.url = argv[++i];
  else if (flag === "--messages") opts.messages = Number(argv[++i]);
  else if (flag === "--workers") opts.workers = Number(argv[++i]);
  else if (flag === "--batch") opts.batch = Number(argv[++i]);
  else throw new Error(`unknown argument ${flag}`);
}
const N = opts.messages;
const boss = new PgBoss({ connectionString: opts.url, max: Math.max(10, opts.workers + 2) });
boss.on("error", (e) => console.error("pg-boss:", e.message));
await boss.start();

let publishRate = null;
if (opts.publish) {
  await boss.createQueue("field-publish");
  const started = performance.now();
  await Promise.all(
    Array.from({ length: 8 }, async (_, p) => {
      const count = Math.floor(N / 8) + (p < N % 8 ? 1 : 0);
      for (let i = 0; i < count; i++) await boss.send("field-publish", { i });
    }),
  );
  publishRate = N / ((performance.now() - started) / 1000);
  await boss.deleteQueue("field-publish");
}

await boss.createQueue("field");
const insertStarted = performance.now();
for (let i = 0; i < N; i += 5000) {
  const jobs = [];
  for (let j = i; j < Math.min(N, i + 5000); j++) jobs.push({ data: { i: j } });
  await boss.insert("field", jobs);
}
const insertS = (performance.now() - insertStarted) / 1000;

let handled = 0;
let drained;
const allHandled = new Promise((resolve) => (drained = resolve));
const started = performance.now();
await boss.work(
  "field",
  {
    batchSize: opts.batch,
    localConcurrency: opts.workers,
    pollingIntervalSeconds: 0.5,
    burstWhenBatchFull: true,
  },
  async (jobs) => {
    handled += jobs.length;
    if (handled >= N) drained(performance.now());
  },
);
const ended = await allHandled;
const drainRate = N / ((ended - started) / 1000);

await boss.stop({ graceful: false, wait: true, timeout: 2000 }).catch(() => {});
console.log(
  JSON.stringify({
    system: "pg-boss",
    workers: opts.workers,
    batch: opts.batch,
    messages: N,
    insert_s: insertS,
    drain_msgs_per_s: drainRate,
    publish_msgs_per_s: publishRate,
  }),
);
process.exit(0);
