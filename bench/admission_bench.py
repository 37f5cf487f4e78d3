"""Benchmark: admission of one random 10,000-task DAG (about 3 dependencies each, some fan-in).

Starts its own embedded stack, submits the DAG through the SDK (Avro on the commands topic), and
measures from the moment the SDK starts sending (and, for the decision, also from the moment the
command is durable on the commands topic):
  - the admission decision: SubmissionAccepted read (read_committed) from the events topic;
  - the tasks committed: every packed TasksAdmitted record of the submission readable (a large
    submission's decision is committed before its tasks, docs/admission.md);
  - the projections: every task row in PostgreSQL, and every node and edge in the graph.
Tasks start a day later, so nothing runs during the measurement. Repeated --runs times on one stack
per engine pair (Apache Kafka + Neo4j, and the noida-db + Ladybug fallback); writes the median and
range per pair to bench/results/admission-<pair>.json.

    python bench/admission_bench.py [--engines kafka|fallback|both] [--runs 5] [--tasks 10000] [--seed 7]
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path

from _stack import embedded_stack, kinds, settings_of, summary, when, write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# How often the projections' checkpoints are polled: the figures are late by up to this much. Polling
# Neo4j every 20 ms doubled its CPU for a 10,000-task admission (3.3 -> 5.2 s, measured).
POLL_S = 0.1


def random_dag(n: int, seed: int):  # type: ignore[no-untyped-def]
    from taskstream.core.model import TaskSpec
    from taskstream.core.submission import Submission

    rng = random.Random(seed)
    start = int(time.time() * 1000) + 86_400_000
    hubs = [f"t{i}" for i in range(0, n, 97)]  # popular prerequisites: fan-in and fan-out
    specs = []
    for i in range(n):
        earlier = min(i, 3)
        deps: set[str] = set()
        if i:
            deps.update(f"t{rng.randrange(i)}" for _ in range(earlier))
            if rng.random() < 0.2:
                deps.add(rng.choice([h for h in hubs if int(h[1:]) < i] or ["t0"]))
        specs.append(
            TaskSpec(
                name=f"t{i}", tenant="bench", argv=("true",), dependencies=tuple(sorted(deps)), not_before_ms=start
            )
        )
    return Submission("bench", tuple(specs), idempotency_key=f"bench-{seed}-{n}-{time.time_ns()}")


def admission_ends(  # type: ignore[no-untyped-def]
    watch, idle, topic: str, partitions: int, starts: dict[int, int], task_ids: list[str]
) -> dict[int, int]:
    """Per partition, the offset just past the submission's packed admission records, once all are
    committed (a large submission's tasks are committed just after its decision). Which records to wait
    for follows from the ids: one per partition and CHUNK_TASKS tasks, keyed by its first task's id. Only
    keys and headers are read: nothing is decoded while the projections run."""
    from confluent_kafka import TopicPartition
    from taskstream.connectors.partitioning import partition_for
    from taskstream.streams.admission import CHUNK_TASKS

    per_partition: dict[int, list[str]] = {}
    for tid in task_ids:  # in submission order, as admission groups them
        per_partition.setdefault(partition_for(tid.encode(), partitions), []).append(tid)
    expected = {tid.encode() for ids in per_partition.values() for tid in ids[::CHUNK_TASKS]}
    ends: dict[int, int] = {}
    nxt = dict(starts)
    stop = threading.Event()
    deadline = time.perf_counter() + 300
    watch.assign([TopicPartition(topic, p, o) for p, o in nxt.items()])
    while expected and time.perf_counter() < deadline:
        msgs = watch.consume(1000, 0.01)
        if not msgs and idle.rest(nxt, stop):  # unassigned while idle: an idle watcher spins on noida-db
            watch.assign([TopicPartition(topic, p, o) for p, o in nxt.items()])
        for m in msgs:
            if m.error():
                continue
            nxt[m.partition()] = m.offset() + 1
            if dict(m.headers() or ()).get("taskstream.event") == b"TasksAdmitted" and m.key() in expected:
                expected.discard(m.key())
                ends[m.partition()] = m.offset() + 1
    assert not expected, f"{len(expected)} packed admission records not committed within 300 s"
    return ends


def measure_decision(settings, tasks: int, seed: int) -> float:  # type: ignore[no-untyped-def]
    """Submit a random DAG; the seconds from the SDK's first byte to its decision, read committed."""
    from taskstream.sdk import Client

    with Client(settings, issuer="bench") as client:
        start = time.perf_counter()
        cid, sid = client.submit(random_dag(tasks, seed))
        out = client.wait_outcome(sid, 120, command_id=cid)
        took = time.perf_counter() - start
    assert out.accepted, out
    return took


def measure(settings, args, seq: int):  # type: ignore[no-untyped-def]
    """One submission of a random DAG: the seconds to each milestone, from the SDK's first byte."""
    from confluent_kafka import TopicPartition
    from taskstream.connectors import broker
    from taskstream.connectors.kafka import consumer, make_codec
    from taskstream.connectors.partitioning import partition_for
    from taskstream.projections.graph_service import graph_queries
    from taskstream.schemas.records import SubmissionAccepted, SubmissionRejected

    from taskstream.core.submission import submission_id_for
    from taskstream.sdk import Client

    sub = random_dag(args.tasks, args.seed + seq)
    n_edges = sum(len(t.dependencies) for t in sub.tasks)
    codec = make_codec(settings)
    client = Client(settings, issuer="bench")
    sid = submission_id_for(sub.tenant, sub.idempotency_key, "")  # keyed: independent of the command id
    topic = settings.topic("events")
    part = partition_for(sid.encode(), settings.partitions)  # the decision is keyed by submission id
    watch = consumer(settings, group="bench-admission")
    starts = {
        p: watch.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
        for p in range(settings.partitions)
    }
    nxt = {part: starts[part]}
    idle = broker.idle(settings, watch, topic, first=0.002, ceiling=0.01)  # an idle watcher must not load noida-db
    import psycopg

    t0 = time.perf_counter()
    _, sid = client.submit(sub)
    t_sent = time.perf_counter()
    decision = None
    stop = threading.Event()
    watch.assign([TopicPartition(topic, part, nxt[part])])
    while decision is None and time.perf_counter() - t0 < 300:
        msgs = watch.consume(1000, 0.01)
        if not msgs and idle.rest(nxt, stop):
            watch.assign([TopicPartition(topic, part, nxt[part])])
        for m in msgs:
            if m.error():
                continue
            nxt[part] = m.offset() + 1
            if m.key() != sid.encode():
                continue
            rec = codec.decode("event", m.value())
            if isinstance(rec.payload, SubmissionAccepted | SubmissionRejected):
                decision = (rec.kind, time.perf_counter())
                task_ids = list(rec.payload.task_ids.values()) if decision[0] == "SubmissionAccepted" else []
    assert decision is not None, "no admission decision within 300 s"
    assert decision[0] == "SubmissionAccepted", decision
    # Both projections write their rows and their checkpoint in one transaction, so a projection shows
    # every node and edge once its checkpoint has passed the submission's packed admission records on
    # every partition (found after the decision is timed). Polling checkpoints is cheap and takes no
    # lock the writers need; the counts are checked once, afterwards.
    watch.unassign()
    ends = admission_ends(watch, idle, topic, settings.partitions, starts, task_ids)
    t_admitted = time.perf_counter()
    watch.close()
    client.close()
    t_pg = t_graph = None
    graph = graph_queries(settings)
    with psycopg.connect(settings.dsn, autocommit=True) as conn:
        while (t_pg is None or t_graph is None) and time.perf_counter() - t0 < 600:
            if t_pg is None:
                done = dict(
                    conn.execute(
                        "SELECT partition, next_offset FROM projection_checkpoints "
                        "WHERE projection = 'pg' AND topic = %s",
                        (topic,),
                    ).fetchall()
                )
                if all(done.get(p, 0) >= end for p, end in ends.items()):
                    t_pg = time.perf_counter()
            if t_graph is None:
                done = {int(k.rpartition("/")[2]): v for k, v in graph.checkpoints().items() if topic in k}
                if all(done.get(p, 0) >= end for p, end in ends.items()):
                    t_graph = time.perf_counter()
            time.sleep(POLL_S)
        (rows,) = conn.execute("SELECT count(*) FROM tasks WHERE submission_id = %s", (sid,)).fetchone()
    assert rows == args.tasks, f"PostgreSQL has {rows} of {args.tasks} tasks"
    counts = graph.counts(sid)
    assert counts == {"nodes": args.tasks, "edges": n_edges}, counts
    return {
        "edges": n_edges,
        "produce_seconds": t_sent - t0,
        "decision_seconds": decision[1] - t0,
        "decision_after_command_durable_seconds": decision[1] - t_sent,
        "tasks_committed_seconds": t_admitted - t0,
        "postgres_complete_seconds": None if t_pg is None else t_pg - t0,
        "graph_complete_seconds": None if t_graph is None else t_graph - t0,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", choices=("kafka", "fallback", "both"), default="both")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    for kind in kinds(args.engines):
        with embedded_stack(kind) as env:
            settings = settings_of(env)
            runs = []
            for i in range(args.runs):
                runs.append(measure(settings, args, i))
                print(f"{kind} run {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in runs[-1].items() if k != "edges"))
        keys = [k for k in runs[0] if k != "edges"]
        report = {
            "benchmark": "admission of one random DAG",
            "engines": kind,
            "broker": settings.broker,
            "graph": settings.graph_backend,
            "tasks": args.tasks,
            "edges": runs[0]["edges"],
            "runs": args.runs,
            **{k: summary([r[k] for r in runs]) for k in keys},
            "aim": "decision under 0.5 s, projections under 5 s (median and every run)",
            "when": when(),
        }
        write_report(RESULTS / f"admission-{kind}.json", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
