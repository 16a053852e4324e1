#!/usr/bin/env python3
"""How a fleet of workers shares one store: throughput and database load by worker count.

For each worker count N (default 1, 2, 4, 8, 16, 32, 64) on a private PostgreSQL
(scripts/throwaway-postgres.sh, max_connections 600): a schema of its own with a backlog of
--events unkeyed events for one handler, drained by N `relaybus run --noop --drain` processes
(--concurrency, --batch-size, --pool-size each); then N idle workers (no --drain, default
poll) on the emptied store for --idle seconds. Reports, per N: deliveries a second between 10%
and 90% of the drain, the server's transactions a second during it (every relaybus statement is
its own transaction), and the idle fleet's transactions a second, in all and per worker.

Needs psycopg 3 (`pip install "psycopg[binary]"`, or the interpreter of .venv-examples). Example:
  .venv-examples/bin/python scripts/scale-bench.py --binary target/release/relaybus
"""

import argparse
import os
import subprocess
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))


def transactions(url):
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        return c.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()[0]


def remaining(url, schema):
    with psycopg.connect(url, autocommit=True) as c:
        return c.execute(f'SELECT count(*) FROM "{schema}".relaybus_deliveries').fetchone()[0]


def workers(args, url, schema, n, drain):
    flags = ["--handler", "h", "--noop", "--concurrency", str(args.concurrency),
             "--batch-size", str(args.batch_size), "--pool-size", str(args.pool_size)]
    if drain:
        flags += ["--drain"]
    env = dict(os.environ, RELAYBUS_DATABASE_URL=url, RELAYBUS_LOG="warn")
    return [subprocess.Popen([args.binary, "--schema", schema, "run", *flags], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(n)]


def one(args, url, n):
    schema = f"scale_{n}"
    env = dict(os.environ, RELAYBUS_DATABASE_URL=url)
    subprocess.run([args.binary, "--schema", schema, "setup"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    lines = "".join('{"type": "t", "payload": {"pad": "%s"}, "handlers": ["h"]}\n' % ("x" * 150)
                    for _ in range(args.events))
    subprocess.run([args.binary, "--schema", schema, "publish", "--batch-size", "500"], env=env,
                   input=lines.encode(), check=True, stdout=subprocess.DEVNULL)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f'VACUUM ANALYZE "{schema}".relaybus_deliveries')
        c.execute("CHECKPOINT")
    total = args.events
    fleet = workers(args, url, schema, n, drain=True)
    marks = []
    while any(p.poll() is None for p in fleet):
        marks.append((time.monotonic(), remaining(url, schema), transactions(url)))
        time.sleep(0.25)
    marks.append((time.monotonic(), remaining(url, schema), transactions(url)))
    lo = next(m for m in marks if m[1] <= total * 0.9)
    hi = next(m for m in marks if m[1] <= total * 0.1)
    rate = (lo[1] - hi[1]) / (hi[0] - lo[0])
    # Less the sampling's own: three transactions every quarter second.
    tps = (hi[2] - lo[2]) / (hi[0] - lo[0]) - 12
    fleet = workers(args, url, schema, n, drain=False)
    time.sleep(5)
    t0, x0 = time.monotonic(), transactions(url)
    time.sleep(args.idle)
    t1, x1 = time.monotonic(), transactions(url)
    for p in fleet:
        p.terminate()
    for p in fleet:
        p.wait()
    # Three of the counted transactions are the sampling's own.
    idle = (x1 - x0 - 3) / (t1 - t0)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return rate, tps, idle


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default="target/release/relaybus")
    ap.add_argument("--workers", default="1,2,4,8,16,32,64")
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--batch-size", type=int, default=200)
    ap.add_argument("--pool-size", type=int, default=4)
    ap.add_argument("--idle", type=float, default=10.0)
    args = ap.parse_args()
    url = subprocess.run([os.path.join(HERE, "throwaway-postgres.sh"), str(os.getpid()),
                          "-c", "max_connections=600", "-c", "shared_buffers=1GB"],
                         check=True, capture_output=True, text=True).stdout.strip()
    print("| workers | deliveries/s | transactions/s (drain) | idle fleet: transactions/s | per idle worker |")
    print("|---:|---:|---:|---:|---:|")
    for n in [int(w) for w in args.workers.split(",")]:
        rate, tps, idle = one(args, url, n)
        print(f"| {n} | {rate:,.0f} | {tps:,.0f} | {idle:,.1f} | {idle / n:.2f} |", flush=True)


if __name__ == "__main__":
    main()
