#!/usr/bin/env python3
"""What one refresh of `relaybus top` costs on a large PostgreSQL store.

Loads --events events, each published for --handlers handlers (default 20,000 x 50: 1,000,000
pending deliveries), keyed over --keys keys, into a schema of its own, buries --dead of them,
and analyzes the tables.
Then:
1. times each statement a refresh runs (and the two a handler's panel adds), as the binary
   renders them from sql/postgres/, --runs times each: the median and the longest, in ms;
2. runs `relaybus top --once --json` (two refreshes, --interval apart), and reports its wall time
   beyond the interval, and the transactions the database committed meanwhile (every statement
   of relaybus's admin commands is a transaction of its own).

Needs psycopg 3 (scripts/install-example-libraries.sh puts it in .venv-examples). Example:
  .venv-examples/bin/python scripts/top-bench.py --binary target/release/relaybus
"""

import argparse
import os
import pathlib
import statistics
import subprocess
import time

import psycopg

SQL = pathlib.Path(__file__).resolve().parent.parent / "sql" / "postgres"

# What a refresh reads (`top::sample`): `stats`, the handler rows, `lanes`, the store's counters.
REFRESH = ["admin/stats", "handlers/list", "admin/lanes", "bench/server_counters",
           "bench/table_counters"]
# What a handler's panel adds (`Inspect::backlog`), for one handler, 50 rows.
PANEL = ["admin/dead_newest", "admin/backlog_keys"]


def statement(name, schema):
    lines = (SQL / f"{name}.sql").read_text().splitlines()
    text = "\n".join(l for l in lines if not l.lstrip().startswith("--"))
    return text.replace("{{schema}}", schema).replace("{{prefix}}", "relaybus_")


def run(binary, url, schema, *rest):
    env = dict(os.environ, RELAYBUS_DATABASE_URL=url)
    return subprocess.run([binary, "--schema", schema, *rest], env=env, check=True,
                          capture_output=True, text=True).stdout


def load(args):
    with psycopg.connect(args.url, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{args.schema}" CASCADE')
    run(args.binary, args.url, args.schema, "setup")
    handlers = [f"handler-{i:02}" for i in range(args.handlers)]
    s = args.schema
    with psycopg.connect(args.url, autocommit=True) as c:
        c.execute(
            f'INSERT INTO "{s}".relaybus_events (id, type, key, payload, handlers) '
            "SELECT 'e' || g, 'bench.event', 'k' || (g %% %s), "
            "jsonb_build_object('pad', repeat('x', 150)), %s "
            "FROM generate_series(0, %s - 1) AS g",
            (args.keys, handlers, args.events))
        c.execute(
            f'INSERT INTO "{s}".relaybus_deliveries (id, event_id, handler, lane, key, sequence) '
            "SELECT lpad(to_hex(g * %s + i), 26, '0'), 'e' || g, h, "
            f'"{s}".relaybus_lane_of(\'k\' || (g %% %s)), \'k\' || (g %% %s), g '
            "FROM generate_series(0, %s - 1) AS g "
            "CROSS JOIN unnest(%s::text[]) WITH ORDINALITY AS u(h, i)",
            (args.handlers, args.keys, args.keys, args.events, handlers))
        c.execute(
            f"UPDATE \"{s}\".relaybus_deliveries SET status = 'dead', last_error = 'exit 1' "
            "WHERE id IN (SELECT id FROM \"" + s + "\".relaybus_deliveries ORDER BY id LIMIT %s)",
            (args.dead,))
        c.execute(f'VACUUM ANALYZE "{s}".relaybus_events')
        c.execute(f'VACUUM ANALYZE "{s}".relaybus_deliveries')
        # As autovacuum leaves a store that has run: without statistics the planner takes the
        # 256 lane rows (a page each) for 19,000, and JIT-compiles `lanes` (400 ms more).
        c.execute(f'ANALYZE "{s}".relaybus_lanes')
        n = c.execute(f'SELECT count(*) FROM "{s}".relaybus_deliveries').fetchone()[0]
    print(f"loaded {n:,} deliveries ({args.dead:,} dead) over {args.handlers} handlers")


def timed(c, text, params, runs):
    took = []
    for _ in range(runs):
        start = time.monotonic()
        c.execute(text, params).fetchall()
        took.append((time.monotonic() - start) * 1000)
    return statistics.median(took), max(took)


def statements(args):
    total = 0.0
    with psycopg.connect(args.url, autocommit=True) as c:
        for name in REFRESH + PANEL:
            params = ("handler-00", 50) if name in PANEL else ()
            # psycopg's placeholders, not the server's.
            text = statement(name, args.schema).replace("$1", "%s").replace("$2", "%s")
            median, longest = timed(c, text, params, args.runs)
            if name in REFRESH:
                total += median
            print(f"{name:24} median {median:8.1f} ms   longest {longest:8.1f} ms")
    print(f"one refresh ({len(REFRESH)} statements): {total:.1f} ms of medians")


def once(args):
    with psycopg.connect(args.url, autocommit=True) as c:
        commits = ("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                   "WHERE datname = current_database()")
        c.execute("SELECT pg_stat_force_next_flush()")
        before = c.execute(commits).fetchone()[0]
        start = time.monotonic()
        run(args.binary, args.url, args.schema, "--json", "top", "--once", "--interval",
            args.interval)
        took = time.monotonic() - start
        time.sleep(1.5)
        c.execute("SELECT pg_stat_force_next_flush()")
        after = c.execute(commits).fetchone()[0]
    interval = float(args.interval.rstrip("s"))
    print(f"top --once --json: {took:.2f} s, {took - interval:.2f} s beyond the interval "
          f"(two refreshes and the start); {after - before} transactions committed meanwhile, "
          "2 of them this script's")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="target/release/relaybus")
    ap.add_argument("--url", default="postgres://postgres@127.0.0.1:5432/test")
    ap.add_argument("--schema", default="relaybus_top_bench")
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--handlers", type=int, default=50)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--dead", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--interval", default="1s")
    ap.add_argument("--keep", action="store_true", help="keep the schema afterwards")
    args = ap.parse_args()
    load(args)
    statements(args)
    once(args)
    if not args.keep:
        with psycopg.connect(args.url, autocommit=True) as c:
            c.execute(f'DROP SCHEMA "{args.schema}" CASCADE')


if __name__ == "__main__":
    main()
