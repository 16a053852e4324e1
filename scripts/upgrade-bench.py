#!/usr/bin/env python3
"""The 0.1 -> 0.2 conversion beside a live 0.1 publisher: how long the application waits.

Loads a 0.1 store (sql/fixtures/store-0.1.sql's tables, then N events with one delivery each)
into a schema of its own, starts a publisher that writes one event and its delivery per
transaction at --rate a second with 0.1's columns, runs `relaybus upgrade --yes [--online]`,
and reports the conversion's time and the publisher's longest transaction. With --kills K
(online only) the upgrade is killed at K random points, each followed by a rerun, before a last
run finishes it. Afterwards it checks every row: counts, lanes, handlers, the catalog
(`setup --check`), and that a worker delivers every event once.

With --after S (online), the 0.1 publisher goes on for S seconds after the conversion beside a
0.2 publisher started when it returns, then `upgrade --contract --force` ends the expansion while
the 0.2 publisher goes on: a rolling deploy's timeline.

Needs psycopg 3 (`pip install "psycopg[binary]"`). Example:
  scripts/upgrade-bench.py --binary target/release/relaybus --events 1000000 --online --kills 10
  scripts/upgrade-bench.py --binary target/release/relaybus --events 1000000 --online --after 60 --drain
"""

import argparse
import os
import random
import signal
import subprocess
import threading
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "sql", "fixtures", "store-0.1.sql")


def load(url, schema, events):
    ddl = open(FIXTURE).read().split("INSERT INTO")[0]
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        c.execute(f'CREATE SCHEMA "{schema}"')
        c.execute(f'SET search_path TO "{schema}"')
        c.execute(ddl)
        c.execute(
            "INSERT INTO relaybus_events (id, type, key, payload) "
            "SELECT 'e' || lpad(g::text, 8, '0'), 't', CASE WHEN g %% 2 = 0 THEN 'k' || (g %% 1000) END, "
            "'{\"pad\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}' FROM generate_series(1, %s) g",
            (events,),
        )
        c.execute(
            "INSERT INTO relaybus_deliveries (id, event_id, handler, key, sequence, status) "
            "SELECT 'd' || lpad(g::text, 8, '0'), 'e' || lpad(g::text, 8, '0'), 'h', "
            "CASE WHEN g %% 2 = 0 THEN 'k' || (g %% 1000) END, g, "
            "CASE WHEN g %% 100 = 0 THEN 'processing' ELSE 'pending' END "
            "FROM generate_series(1, %s) g",
            (events,),
        )
        c.execute("ANALYZE relaybus_events")
        c.execute("ANALYZE relaybus_deliveries")


class Publisher(threading.Thread):
    """A 0.1 publisher: one event and its delivery per transaction, `rate` a second, with 0.1's
    columns only. With `v02`, a 0.2 publisher instead: the event with its handlers, the delivery
    with its lane by the publish-time hash, as 0.2's publish writes them."""

    def __init__(self, url, schema, rate, v02=False):
        super().__init__(daemon=True)
        self.url, self.schema, self.rate, self.v02 = url, schema, rate, v02
        self.stop = threading.Event()
        self.published = 0
        self.longest = 0.0
        self.errors = []

    def publish(self, c, n):
        if self.v02:
            c.execute(
                "INSERT INTO relaybus_events (id, type, payload, handlers) VALUES (%s, 'live', '{}', '{h}')",
                (f"n{n:08d}",),
            )
            c.execute(
                "INSERT INTO relaybus_deliveries (id, event_id, handler, lane) "
                "VALUES (%s, %s, 'h', relaybus_lane_of(%s))",
                (f"nd{n:08d}", f"n{n:08d}", f"n{n:08d}"),
            )
        else:
            c.execute(
                "INSERT INTO relaybus_events (id, type, payload) VALUES (%s, 'live', '{}')",
                (f"p{n:08d}",),
            )
            c.execute(
                "INSERT INTO relaybus_deliveries (id, event_id, handler) VALUES (%s, %s, 'h')",
                (f"pd{n:08d}", f"p{n:08d}"),
            )

    def run(self):
        with psycopg.connect(self.url, autocommit=False) as c:
            c.execute(f'SET search_path TO "{self.schema}"')
            c.commit()
            n = 0
            next_at = time.monotonic()
            while not self.stop.is_set():
                n += 1
                started = time.monotonic()
                try:
                    self.publish(c, n)
                    c.commit()
                    self.published += 1
                except psycopg.Error as e:
                    c.rollback()
                    self.errors.append(str(e).splitlines()[0])
                self.longest = max(self.longest, time.monotonic() - started)
                next_at += 1.0 / self.rate
                time.sleep(max(0.0, next_at - time.monotonic()))


def relaybus(args, binary, url, schema, *more):
    env = dict(os.environ, RELAYBUS_DATABASE_URL=url)
    return subprocess.Popen([binary, "--schema", schema, *more], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def check(args, url, schema, published):
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f'SET search_path TO "{schema}"')
        one = lambda q: c.execute(q).fetchone()[0]
        events = one("SELECT count(*) FROM relaybus_events")
        deliveries = one("SELECT count(*) FROM relaybus_deliveries")
        wrong_lanes = one(
            "SELECT count(*) FROM relaybus_deliveries WHERE lane <> relaybus_lane_of(coalesce(key, event_id))")
        wrong_handlers = one(
            "SELECT count(*) FROM relaybus_events e WHERE handlers IS DISTINCT FROM "
            "ARRAY(SELECT DISTINCT handler FROM relaybus_deliveries d WHERE d.event_id = e.id ORDER BY 1)")
    want = args.events + published
    assert (events, deliveries) == (want, want), (events, deliveries, want)
    assert wrong_lanes == 0 and wrong_handlers == 0, (wrong_lanes, wrong_handlers)
    r = relaybus(args, args.binary, url, schema, "setup", "--check")
    out, err = r.communicate()
    assert r.returncode == 0, err
    if args.drain:
        r = relaybus(args, args.binary, url, schema, "run", "--handler", "h", "--noop", "--drain",
                     "--completion-history", "--concurrency", "200", "--batch-size", "200")
        out, err = r.communicate(timeout=3600)
        assert r.returncode == 0, err
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f'SET search_path TO "{schema}"')
            done, once = c.execute(
                "SELECT count(*), count(DISTINCT event_id) FROM relaybus_completions").fetchone()
            left = c.execute("SELECT count(*) FROM relaybus_deliveries").fetchone()[0]
        assert (done, once, left) == (want, want, 0), (done, once, left, want)
    return events


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", default="target/release/relaybus")
    p.add_argument("--url", default=os.environ.get("RELAYBUS_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    p.add_argument("--schema", default="upgrade_bench")
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--online", action="store_true")
    p.add_argument("--kills", type=int, default=0)
    p.add_argument("--kill-window", type=float, default=60.0,
                   help="kills fall uniformly in this many seconds after each start")
    p.add_argument("--drain", action="store_true", help="deliver every event afterwards and count")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--after", type=float, default=0.0,
                   help="online: keep the 0.1 publisher this many seconds after the conversion, "
                        "beside a 0.2 publisher started when it returns, then contract")
    args = p.parse_args()
    random.seed(args.seed)

    started = time.monotonic()
    load(args.url, args.schema, args.events)
    print(f"loaded {args.events} events and deliveries in {time.monotonic() - started:.1f} s", flush=True)
    publisher = Publisher(args.url, args.schema, args.rate)
    publisher.start()
    time.sleep(2)
    upgrade = ["upgrade", "--yes"] + (["--online"] if args.online else [])
    started = time.monotonic()
    for k in range(args.kills):
        at = random.uniform(0, args.kill_window)
        r = relaybus(args, args.binary, args.url, args.schema, *upgrade)
        try:
            r.wait(timeout=at)
            print(f"kill {k + 1}: the run ended before {at:.1f} s (exit {r.returncode})", flush=True)
        except subprocess.TimeoutExpired:
            r.send_signal(signal.SIGKILL)
            r.wait()
            print(f"kill {k + 1}: killed at {at:.1f} s", flush=True)
    r = relaybus(args, args.binary, args.url, args.schema, *upgrade)
    out, err = r.communicate()
    took = time.monotonic() - started
    assert r.returncode == 0, err
    newer = Publisher(args.url, args.schema, args.rate, v02=True)
    if args.after:
        newer.start()
        time.sleep(args.after)
    else:
        time.sleep(1)
    publisher.stop.set()
    publisher.join()
    print(out.strip().splitlines()[-1])
    # An offline conversion ends the 0.1 publisher's time: its inserts fail (no lane) after it.
    print(f"conversion: {took:.1f} s{' after ' + str(args.kills) + ' kills' if args.kills else ''}; "
          f"0.1 publisher: {publisher.published} transactions, longest {publisher.longest * 1000:.0f} ms, "
          f"{len(publisher.errors)} failed ({publisher.errors[0] if publisher.errors else '-'})",
          flush=True)
    if args.after:
        started = time.monotonic()
        r = relaybus(args, args.binary, args.url, args.schema, "upgrade", "--contract", "--yes", "--force")
        out, err = r.communicate()
        contracted = time.monotonic() - started
        assert r.returncode == 0, err
        time.sleep(1)
        newer.stop.set()
        newer.join()
        print(out.strip().splitlines()[-1])
        print(f"contract: {contracted:.2f} s; 0.2 publisher (from the conversion's return to after "
              f"the contract): {newer.published} transactions, longest {newer.longest * 1000:.0f} ms, "
              f"{len(newer.errors)} failed ({newer.errors[0] if newer.errors else '-'})", flush=True)
    events = check(args, args.url, args.schema, publisher.published + newer.published)
    print(f"checked: {events} events, lanes and handlers right, setup --check current"
          f"{', every event delivered once' if args.drain else ''}")


if __name__ == "__main__":
    main()
