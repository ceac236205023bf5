// The inbox benchmark's second peer queue (bench/loadtest --bin inbox): graphile-worker behind
// the same route shape as the inbox. `POST /peer` checks the Stripe signature with Stripe's own
// library (`Stripe.webhooks.constructEvent`: HMAC-SHA256 over `{t}.{body}`, 300 s tolerance),
// enqueues the event's id as a graphile-worker job and answers 200 once the enqueue has committed
// (`addJob` is one autocommitted statement); a worker running `PEER_CONCURRENCY` jobs at once
// inserts one row per event into `PEER_EFFECTS_TABLE`. `GET /enqueued` answers how many events
// were enqueued so far, which the harness compares with the effects table's rows to tell the
// backlog drained.
//
// Settings (environment): DATABASE_URL (default postgres://postgres@127.0.0.1:5432/test),
// PEER_SECRET (the endpoint secret), PEER_SCHEMA (graphile-worker's schema, migrated at start),
// PEER_EFFECTS_TABLE (created by the harness), PEER_CONCURRENCY (default 16), PEER_POOL_SIZE
// (default 32).
//
// Prints `listening http://127.0.0.1:PORT` on stdout once the worker runs and the route is
// served, and nothing else there (warnings and errors go to stderr). Exits once its stdin ends
// (the harness closing it), or on SIGTERM or SIGINT, after the worker has stopped.

import http from "node:http";
import process from "node:process";

import graphileWorker from "graphile-worker";
import Stripe from "stripe";

const { Logger, run } = graphileWorker;

/** An environment setting, or `fallback`; exits with a message when neither is there. */
function setting(name, fallback) {
  const value = process.env[name] ?? fallback;
  if (value === undefined || value === "") {
    console.error(`peer-graphile: ${name} is not set`);
    process.exit(2);
  }
  return value;
}

/** A setting that names a table or schema: interpolated into SQL, so plain identifiers only. */
function identifier(name) {
  const value = setting(name);
  if (!/^[a-z_][a-z0-9_]*$/.test(value)) {
    console.error(`peer-graphile: ${name} must be a lower-case SQL identifier, not ${value}`);
    process.exit(2);
  }
  return value;
}

const connectionString = setting("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test");
const secret = setting("PEER_SECRET");
const schema = identifier("PEER_SCHEMA");
const effects = identifier("PEER_EFFECTS_TABLE");
const concurrency = Number(setting("PEER_CONCURRENCY", "16"));
const maxPoolSize = Number(setting("PEER_POOL_SIZE", "32"));
const insert = `INSERT INTO ${effects} (event_id) VALUES ($1)`;

// graphile-worker logs every job at `info`; only warnings and errors are kept, on stderr.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") {
    console.error(`peer-graphile ${level}: ${message}`);
  }
});

const runner = await run({
  connectionString,
  schema,
  concurrency,
  maxPoolSize,
  logger,
  noHandleSignals: true,
  taskList: {
    insert_event: async (payload, helpers) => {
      await helpers.query(insert, [payload.id]);
    },
  },
});
runner.promise.catch((error) => {
  console.error(`peer-graphile: the worker failed: ${error}`);
  process.exit(1);
});

let enqueued = 0;

/** The status answering a delivery of `body` signed `signature`. */
async function receive(body, signature) {
  let event;
  try {
    event = Stripe.webhooks.constructEvent(body, signature ?? "", secret);
  } catch {
    return 400;
  }
  try {
    await runner.addJob("insert_event", { id: event.id });
  } catch (error) {
    console.error(`peer-graphile: enqueue failed: ${error}`);
    return 500;
  }
  enqueued += 1;
  return 200;
}

const server = http.createServer((request, response) => {
  if (request.method === "POST" && request.url === "/peer") {
    const chunks = [];
    request.on("data", (chunk) => chunks.push(chunk));
    request.on("end", () => {
      receive(Buffer.concat(chunks), request.headers["stripe-signature"]).then((status) =>
        response.writeHead(status).end(),
      );
    });
  } else if (request.method === "GET" && request.url === "/enqueued") {
    response.writeHead(200, { "content-type": "text/plain" }).end(String(enqueued));
  } else {
    response.writeHead(404).end();
  }
});

let stopping = false;
async function shutdown() {
  if (stopping) {
    return;
  }
  stopping = true;
  server.close();
  server.closeAllConnections();
  await runner.stop();
  process.exit(0);
}
process.stdin.on("end", shutdown);
process.stdin.on("error", shutdown);
process.stdin.resume();
process.on("SIGTERM", shutdown);
process.on("SIGINT", shutdown);

server.listen(0, "127.0.0.1", () => {
  console.log(`listening http://127.0.0.1:${server.address().port}`);
});
