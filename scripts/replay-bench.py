#!/usr/bin/env python3
"""`relaybus events replay` of a large history into a new handler on PostgreSQL: its rate, the WAL
it writes per replayed event, and how long an application's publish waits while it runs.

Loads --events events (keyed over --keys keys, --per-txn of them sharing a creation time as a
publish of that many per transaction leaves them, every delivery completed) into a schema of its
own, then:
1. replays them into a new handler with nothing else running: events/s and WAL bytes per event;
2. publishes one event per transaction with `relaybus_publish` (keys of the same set) for
   --quiet seconds alone, then beside a replay of the same history into a second new handler:
   each publish's latency, alone and beside the replay.

Needs psycopg 3 (scripts/install-example-libraries.sh puts it in .venv-examples). Example:
  .venv-examples/bin/python scripts/replay-bench.py --binary target/release/relaybus \\
      --events 1000000
"""

import argparse
import json
import os
import subprocess
import threading
import time

import psycopg


def run(args, binary, url, schema, *rest):
    env = dict(os.environ, RELAYBUS_DATABASE_URL=url)
    out = subprocess.run([binary, "--schema", schema, *rest], env=env, check=True,
                         capture_output=True, text=True)
    return out.stdout


def load(args, url, schema):
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    run(args, args.binary, url, schema, "setup")
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(
            f'INSERT INTO "{schema}".relaybus_events (id, type, key, payload, handlers, created_at) '
            "SELECT 'e' || lpad(g::text, 8, '0'), 'bench.event', 'k' || (g %% %s), "
            "jsonb_build_object('pad', repeat('x', 150)), '{billing}', "
            "timestamptz '2026-01-01' + (g / %s) * interval '1 ms' "
            "FROM generate_series(0, %s - 1) AS g",
            (args.keys, args.per_txn, args.events))
        c.execute(f'VACUUM ANALYZE "{schema}".relaybus_events')


def replay(args, url, schema, handler):
    out = run(args, args.binary, url, schema, "--json", "events", "replay", "--handler", handler,
              "--new", "--yes", "--batch-size", str(args.batch_size))
    return json.loads(out)


def quiet(args, url, schema):
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CHECKPOINT")
        before = c.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        start = time.monotonic()
        result = replay(args, url, schema, "search")
        took = time.monotonic() - start
        wal = c.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (before,)).fetchone()[0]
    n = result["replayed"]
    print(f"replay alone: {n} events in {took:.1f} s, {n / took:,.0f} events/s, "
          f"{float(wal) / n:,.0f} WAL bytes per event")


class Publisher(threading.Thread):
    """One event per transaction through relaybus_publish, as fast as one connection goes."""

    def __init__(self, url, schema, keys):
        super().__init__(daemon=True)
        self.url, self.schema, self.keys = url, schema, keys
        self.latencies = []
        self.stop = threading.Event()

    def run(self):
        n = 0
        with psycopg.connect(self.url, autocommit=True) as c:
            while not self.stop.is_set():
                start = time.monotonic()
                c.execute(f'SELECT "{self.schema}".relaybus_publish(%s, %s, %s, %s)',
                          ("app.event", json.dumps({"n": n}), ["billing"], f"k{n % self.keys}"))
                self.latencies.append(time.monotonic() - start)
                n += 1


def summary(name, latencies):
    s = sorted(latencies)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))] * 1000
    print(f"publish {name}: {len(s)} publishes, median {pick(0.5):.2f} ms, "
          f"p99 {pick(0.99):.2f} ms, longest {s[-1] * 1000:.1f} ms")


def beside(args, url, schema):
    p = Publisher(url, schema, args.keys)
    p.start()
    time.sleep(args.quiet)
    alone = len(p.latencies)
    start = time.monotonic()
    result = replay(args, url, schema, "search2")
    took = time.monotonic() - start
    p.stop.set()
    p.join()
    summary("alone", p.latencies[:alone])
    summary("beside the replay", p.latencies[alone:])
    n = result["replayed"]
    print(f"replay beside the publisher: {n} events in {took:.1f} s, {n / took:,.0f} events/s")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="target/release/relaybus")
    ap.add_argument("--url", default="postgres://postgres@127.0.0.1:5432/test")
    ap.add_argument("--schema", default="relaybus_replay_bench")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--per-txn", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--quiet", type=float, default=10.0,
                    help="seconds the publisher runs alone first")
    args = ap.parse_args()
    load(args, args.url, args.schema)
    quiet(args, args.url, args.schema)
    beside(args, args.url, args.schema)
    with psycopg.connect(args.url, autocommit=True) as c:
        c.execute(f'DROP SCHEMA "{args.schema}" CASCADE')


if __name__ == "__main__":
    main()
