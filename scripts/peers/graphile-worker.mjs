// Drains N no-op jobs with graphile-worker on a scratch database and prints one JSON line:
// what `scripts/bench.sh --peers` compares outbox with. A benchmark dependency only.
//
//   node graphile-worker.mjs DATABASE_URL fast|default JOBS
//
// fast:    the settings of graphile-worker's performance page at concurrency 4: a local queue
//          of 500 jobs and batched completion (completeJobBatchDelay and failJobBatchDelay 0);
// default: its defaults (concurrency 10, each job fetched and completed on its own).
import { Logger, makeWorkerUtils, run } from "graphile-worker";
import pg from "pg";
import { readFileSync } from "node:fs";

// The version installed beside this script (the package exports no package.json).
const { version } = JSON.parse(
  readFileSync(new URL("./node_modules/graphile-worker/package.json", import.meta.url), "utf8"),
);

const [connectionString, preset, jobsArg] = process.argv.slice(2);
const jobs = Number(jobsArg);
if (!connectionString || !["fast", "default"].includes(preset) || !(jobs > 0)) {
  console.error("usage: node graphile-worker.mjs DATABASE_URL fast|default JOBS");
  process.exit(2);
}

const worker =
  preset === "fast"
    ? { concurrentJobs: 4, maxPoolSize: 10, localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 }
    : { concurrentJobs: 10, maxPoolSize: 10 };
worker.pollInterval = 1000;

// Warnings and errors only: a log line per job would be part of what is timed.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`graphile-worker ${level}: ${message}`);
});

const utils = await makeWorkerUtils({ connectionString, logger });
await utils.migrate();
// Enqueued before the clock starts, in one statement per 1,000 jobs (as outbox bench does).
const enqueueStarted = process.hrtime.bigint();
for (let done = 0; done < jobs; done += 1000) {
  const batch = Array.from({ length: Math.min(1000, jobs - done) }, () => ({ identifier: "noop", payload: {} }));
  await utils.addJobs(batch);
}
const enqueueSeconds = Number(process.hrtime.bigint() - enqueueStarted) / 1e9;
// As outbox bench does: the enqueue's WAL goes to the data files now, not in a checkpoint
// within the timed drain (only a superuser or a pg_checkpoint member may; else as is).
{
  const client = new pg.Client({ connectionString });
  await client.connect();
  await client.query("CHECKPOINT").catch(() => {});
  await client.end();
}

// The clock starts when the first job starts (the worker's start-up is not timed, as outbox
// bench times its drain only) and stops when the last job's completion is in the database.
let ran = 0;
let started;
let allRan;
const allRanPromise = new Promise((resolve) => (allRan = resolve));
const runner = await run({
  connectionString,
  logger,
  noHandleSignals: true,
  preset: { worker },
  taskList: {
    noop: async () => {
      if (ran === 0) started = process.hrtime.bigint();
      ran += 1;
      if (ran === jobs) allRan();
    },
  },
});
await allRanPromise;
// Done means completed in the database: wait until the jobs table is empty.
const client = new pg.Client({ connectionString });
await client.connect();
for (;;) {
  const { rows } = await client.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs");
  if (rows[0].n === 0) break;
  await new Promise((r) => setTimeout(r, 2));
}
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
await client.end();
await runner.stop();
await utils.release();
console.log(
  JSON.stringify({
    peer: "graphile-worker",
    version,
    preset,
    concurrency: worker.concurrentJobs,
    jobs,
    seconds: Number(seconds.toFixed(3)),
    jobs_per_s: Math.round(jobs / seconds),
    enqueue_per_s: Math.round(jobs / enqueueSeconds),
  }),
);
