"""Benchmark: replay N events (default 1,000,000) from offset 0 into both projections.

Starts its own embedded stack in a temporary state directory, writes a synthetic but realistic history
(submissions of 10-task chains, each task going submitted -> admitted -> ready -> queued -> claimed ->
started -> succeeded, one in ten failing once and retrying) to a bench topic, then rebuilds the
PostgreSQL and graph projections from offset 0, each in its own process, as `taskstream replay` does
(the graph into the Replay labels of Neo4j, or a fresh Ladybug file). Repeated --runs times per engine
pair (Apache Kafka + Neo4j, and the noida-db + Ladybug fallback) on the same history; writes the median
and range, and the peak RSS of every process (the JVMs included), to bench/results/replay-<pair>.json.

    python bench/replay_bench.py [--engines kafka|fallback|both] [--runs 3] [--events 1000000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import resource
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

from _stack import embedded_stack, kinds, rss_mib, services, settings_of, summary, when, write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def history(n_events: int):  # type: ignore[no-untyped-def]
    from taskstream.schemas.records import EventRecord, SubmissionAccepted

    from taskstream.core import events as e
    from taskstream.core.model import TaskSpec

    made = 0
    t0 = 1_780_000_000_000
    while made < n_events:
        sid = str(uuid.uuid4())
        ids = [str(uuid.uuid4()) for _ in range(10)]
        yield (
            sid,
            EventRecord(
                f"{sid}:accepted",
                None,
                sid,
                0,
                t0,
                "bench",
                SubmissionAccepted("bench", None, sid, {f"t{i}": ids[i] for i in range(10)}),
            ),
        )
        made += 1
        for i, tid in enumerate(ids):
            spec = TaskSpec(
                name=f"t{i}",
                tenant=f"tenant{i % 5}",
                argv=("python3", "-c", "print(1)"),
                dependencies=(ids[i - 1],) if i else (),
                retry_limit=1,
                priority=i,
            )
            flow: list[e.Event] = [
                e.TaskSubmitted(sid, spec),
                e.TaskAdmitted("bench"),
                e.TaskReady("r"),
                e.TaskQueued(1, "default"),
                e.TaskClaimed(1, "w1", f"{tid}-1"),
                e.TaskStarted(f"{tid}-1", "w1", 100),
            ]
            if made % 10 == 0:
                flow += [
                    e.TaskFailed(f"{tid}-1", 1, "boom", 10, "exit status 1"),
                    e.TaskRetryScheduled(2, t0, 10),
                    e.TaskReady("retry"),
                    e.TaskQueued(2, "default"),
                    e.TaskClaimed(2, "w2", f"{tid}-2"),
                    e.TaskStarted(f"{tid}-2", "w2", 101),
                ]
            flow.append(e.TaskSucceeded(flow[-2].claim_id, 0, "ok", 12))  # type: ignore[union-attr]
            for v, ev in enumerate(flow, 1):
                yield tid, EventRecord(f"{tid}:{v}", tid, sid, v, t0 + v, "bench", ev)
                made += 1


def produce(settings, n_events: int) -> float:  # type: ignore[no-untyped-def]
    from taskstream.connectors.kafka import ensure_topics, make_codec, producer

    ensure_topics(settings)
    codec = make_codec(settings)
    p = producer(
        settings,
        partitioner="murmur2_random",
        **{"linger.ms": 50, "batch.num.messages": 10000, "queue.buffering.max.messages": 500000},
    )
    topic = settings.topic("events")
    start = time.perf_counter()
    for i, (key, rec) in enumerate(history(n_events)):
        while True:
            try:
                p.produce(topic, key=key.encode(), value=codec.encode(rec))
                break
            except BufferError:
                p.poll(0.05)
        if i % 10000 == 0:
            p.poll(0)
    p.flush(300)
    return time.perf_counter() - start


def _run(kind: str, settings, targets, out) -> None:  # type: ignore[no-untyped-def]
    from taskstream.projections import replay as rp

    done = [0]

    def progress(n: int) -> None:
        done[0] += n

    start = time.perf_counter()
    if kind == "pg":
        rp.replay_pg(settings, {"pg": targets}, progress)
    else:
        rp.replay_graph(settings, targets, progress)
    out.put(
        {
            "kind": kind,
            "seconds": time.perf_counter() - start,
            "events": done[0],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", choices=("kafka", "fallback", "both"), default="both")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--events", type=int, default=1_000_000)
    args = ap.parse_args()
    from taskstream.connectors.kafka import consumer
    from taskstream.connectors.reading import end_offsets

    for kind in kinds(args.engines):
        with embedded_stack(kind) as env:
            # The bench history goes to its own topics, so the stack's live projectors leave it alone.
            settings = replace(settings_of(env), topic_prefix="bench")
            print(f"[{kind}] producing {args.events:,} events …", flush=True)
            produce_s = produce(settings, args.events)
            c = consumer(settings, "bench-replay-ends")
            ends = end_offsets(c, settings.topic("events"), list(range(settings.partitions)))
            c.close()
            total = sum(ends.values())
            print(f"  {total:,} events in {produce_s:.1f}s ({total / produce_s:,.0f}/s)")
            runs = []
            for i in range(args.runs):
                print(f"[{kind}] run {i + 1}: replaying into PostgreSQL and the graph, one process each …", flush=True)
                out: mp.Queue = mp.get_context("spawn").Queue()
                ctx = mp.get_context("spawn")
                start = time.perf_counter()
                procs = [ctx.Process(target=_run, args=(k, settings, ends, out)) for k in ("pg", "graph")]
                for p in procs:
                    p.start()
                results = {r["kind"]: r for r in (out.get() for _ in procs)}
                for p in procs:
                    p.join()
                runs.append({"wall": time.perf_counter() - start, **results})
                pg_s, graph_s = results["pg"]["seconds"], results["graph"]["seconds"]
                print(f"  {runs[-1]['wall']:.1f}s (pg {pg_s:.1f}s, graph {graph_s:.1f}s)")
            engines = {
                n: round(rss_mib(pid, peak=True)) for n, pid in services(env).items() if n in ("broker", "neo4j")
            }
        report = {
            "benchmark": "replay from offset 0 into both projections",
            "engines": kind,
            "broker": settings.broker,
            "graph": settings.graph_backend,
            "events": total,
            "runs": args.runs,
            "wall_seconds": summary([r["wall"] for r in runs]),
            "events_per_second_median": round(total / summary([r["wall"] for r in runs])["median"]),
            "postgres_seconds": summary([r["pg"]["seconds"] for r in runs]),
            "graph_seconds": summary([r["graph"]["seconds"] for r in runs]),
            "peak_rss_mib": {
                "postgres_replay_process": round(max(r["pg"]["peak_rss_mib"] for r in runs)),
                "graph_replay_process": round(max(r["graph"]["peak_rss_mib"] for r in runs)),
                **{f"{n} (peak over the whole run)": v for n, v in engines.items()},
            },
            "produce_seconds": round(produce_s, 2),
            "aim": "under 60 s and under 1 GiB per replay process",
            "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
            "when": when(),
        }
        write_report(RESULTS / f"replay-{kind}.json", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
