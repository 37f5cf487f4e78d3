"""Benchmark: two Faust workers, one SIGKILLed in the middle of a DAG. Measured from the SIGKILL:
  - until the consumer group has the survivor alone (Kafka's coordinator expires the dead member after
    its session timeout; noida-db never does, docs/measurements.md);
  - until the first task the dead worker held runs again (its lease expired, decided by the task's
    owner, which may itself have been the dead worker);
  - until every task has succeeded; and, from the log, how many times each task succeeded (must be 1).
The DAG: 4 chains of 10 tasks of 0.5 s. Repeated --runs times per engine pair; writes median and range
to bench/results/worker-takeover-<pair>.json.

    python bench/worker_takeover_bench.py [--engines kafka|fallback|both] [--runs 3] [--session-ms 6000]
                                          [--set NAME=VALUE ...]

--set runs the stack with a setting changed (TASKSTREAM_<NAME>), to worker-takeover-<pair>-set.json.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from _stack import (
    add_set_option,
    embedded_stack,
    kinds,
    set_settings,
    settings_of,
    start_worker,
    summary,
    when,
    write_report,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
GIVE_UP_S = 120.0


def group_size(s: Any) -> int | None:
    from confluent_kafka import ConsumerGroupState
    from taskstream.connectors.kafka import admin

    group = f"{s.topic_prefix}-scheduler"
    client = admin(s)
    try:
        desc = client.describe_consumer_groups([group], request_timeout=5)[group].result(10)
    except Exception:
        return None
    return 0 if desc.state in (ConsumerGroupState.DEAD, ConsumerGroupState.EMPTY) else len(desc.members)


def once(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    import psycopg
    from taskstream.connectors.kafka import consumer, make_codec
    from taskstream.connectors.reading import read_to_end
    from taskstream.connectors.services import ready_file
    from taskstream.schemas import records as r

    from taskstream.core import events as e
    from taskstream.core.submission import parse_document
    from taskstream.sdk import Client

    extra = {
        "workers": "0",
        "worker_session_timeout_ms": str(args.session_ms),
        "lease_ms": str(args.lease_ms),
        "heartbeat_ms": str(max(200, args.lease_ms // 4)),
        "lease_grace_ms": "1000",
        **args.settings,
    }
    with embedded_stack(kind, **extra) as env:
        s = settings_of(env)
        procs, logs = (list(x) for x in zip(*(start_worker(env, i) for i in (0, 1)), strict=True))
        deadline = time.monotonic() + 90
        while not all(ready_file(s, f"worker-{i}").exists() for i in (0, 1)) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(3)  # both in the group and assigned
        tasks = [
            {"name": f"c{c}-{i}", "argv": ["sleep", "0.5"], "dependencies": [f"c{c}-{i - 1}"] if i else []}
            for c in range(4)
            for i in range(10)
        ]
        with Client(s) as client:
            cid, sid = client.submit(parse_document({"tenant": "bench", "tasks": tasks}))
            ids = client.wait_outcome(sid, 60, command_id=cid).task_ids
        victim = procs[0]
        conn = psycopg.connect(s.dsn, autocommit=True)

        def running_on_victim() -> bool:
            rows = conn.execute(
                "SELECT count(*) FROM tasks WHERE submission_id = %s AND status = 'RUNNING' AND worker LIKE %s",
                (sid, f"%-{victim.pid}-w0"),
            ).fetchone()
            return bool(rows and rows[0])

        while not running_on_victim() and time.monotonic() < deadline + 60:
            time.sleep(0.05)
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        killed_ms = int(time.time() * 1000)
        alone = rerun = done = None
        while time.monotonic() - killed < GIVE_UP_S and done is None:
            now = time.monotonic() - killed
            if alone is None and s.broker == "kafka" and group_size(s) == 1:
                alone = now
            if rerun is None:
                (n,) = conn.execute(
                    "SELECT count(*) FROM attempts a JOIN tasks t USING (task_id) WHERE t.submission_id = %s "
                    "AND a.outcome = 'LEASE_EXPIRED'",
                    (sid,),
                ).fetchone()  # type: ignore[misc]
                if n:
                    rerun = now
            (left,) = conn.execute(
                "SELECT count(*) FROM tasks WHERE submission_id = %s AND status <> 'SUCCEEDED'", (sid,)
            ).fetchone()  # type: ignore[misc]
            if left == 0:
                done = now
            time.sleep(0.1)
        conn.close()
        codec = make_codec(s)
        c = consumer(s, f"bench-{uuid.uuid4()}")
        wanted = set(ids.values())
        # A task's events are idempotent by version (event id `<task>:<version>`): a record written again
        # after a takeover (the dead worker's write was durable, its table's was not) is the same event,
        # and readers skip it. Two different events under one version would be a fork.
        successes: Counter[str] = Counter()
        by_version: dict[str, Any] = {}
        rewritten = forks = 0
        for m in read_to_end(c, s.topic("events"), dict.fromkeys(range(s.partitions), 0), timeout=60):
            for ev in r.task_events(codec.decode("event", m.value())):
                if ev.task_id not in wanted:
                    continue
                seen = by_version.get(ev.event_id)
                if seen is not None:
                    rewritten += 1
                    forks += seen != ev.payload
                    continue
                by_version[ev.event_id] = ev.payload
                if isinstance(ev.payload, e.TaskSucceeded):
                    successes[ev.task_id] += 1
        c.close()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in logs:
            log.close()
    return {
        "killed_at_ms": killed_ms,
        "group_has_the_survivor_alone_s": alone,
        "first_lease_expired_s": rerun,
        "every_task_succeeded_s": done,
        "tasks": len(ids),
        "tasks_succeeded_once": sum(1 for t in ids.values() if successes[t] == 1),
        "tasks_succeeded_more_than_once": sum(1 for t in ids.values() if successes[t] > 1),
        "events_written_again": rewritten,
        "versions_with_two_different_events": forks,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", choices=("kafka", "fallback", "both"), default="both")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--session-ms", type=int, default=6000)
    ap.add_argument("--lease-ms", type=int, default=4000)
    add_set_option(ap)
    args = ap.parse_args()
    args.settings = set_settings(ap, args.set)
    for kind in kinds(args.engines):
        runs = []
        for i in range(args.runs):
            runs.append(once(kind, args))
            print(f"{kind} run {i + 1}: {runs[-1]}", flush=True)
        keys = ("group_has_the_survivor_alone_s", "first_lease_expired_s", "every_task_succeeded_s")
        report = {
            "benchmark": "two Faust workers, one SIGKILLed in the middle of a DAG of 40 tasks",
            "engines": kind,
            "session_timeout_ms": args.session_ms,
            "lease_ms": args.lease_ms,
            "settings": args.settings,
            "runs": args.runs,
            **{k: summary([r[k] for r in runs]) for k in keys},
            "runs_where_every_task_succeeded_within_s": {
                str(GIVE_UP_S): sum(r["every_task_succeeded_s"] is not None for r in runs)
            },
            "tasks_succeeded_more_than_once": sum(r["tasks_succeeded_more_than_once"] for r in runs),
            "events_written_again": sum(r["events_written_again"] for r in runs),
            "versions_with_two_different_events": sum(r["versions_with_two_different_events"] for r in runs),
            "each_run": runs,
            "when": when(),
        }
        name = f"worker-takeover-{kind}-set.json" if args.settings else f"worker-takeover-{kind}.json"
        write_report(RESULTS / name, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
