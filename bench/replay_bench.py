"""Benchmark: replay N events (default 1,000,000) from offset 0 into both projections.

Starts its own embedded stack in a temporary state directory, writes a synthetic but realistic history
(submissions of 10-task chains, each task going submitted -> admitted -> ready -> queued -> claimed ->
started -> succeeded, one in ten failing once and retrying) to a bench topic, then rebuilds the
PostgreSQL and graph projections from offset 0, each in its own process, as `taskstream replay` does.
Prints the figures and writes bench/results/replay.json.

    python bench/replay_bench.py [--events 1000000]
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

from _stack import embedded_stack, write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "replay.json"


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
    ap.add_argument("--events", type=int, default=1_000_000)
    args = ap.parse_args()
    from taskstream.projections.lag import log_ends

    from taskstream.settings import Settings

    with embedded_stack() as env:
        # The bench history goes to its own topics, so the stack's live projectors leave it alone.
        settings = replace(Settings.from_env(env), topic_prefix="bench")
        print(f"producing {args.events:,} events …", flush=True)
        produce_s = produce(settings, args.events)
        ends = log_ends(settings, settings.topic("events"))
        total = sum(ends.values())
        print(f"  {total:,} events in {produce_s:.1f}s ({total / produce_s:,.0f}/s)")
        print("replaying into PostgreSQL and the graph, one process each …", flush=True)
        out: mp.Queue = mp.get_context("spawn").Queue()
        ctx = mp.get_context("spawn")
        start = time.perf_counter()
        procs = [ctx.Process(target=_run, args=(k, settings, ends, out)) for k in ("pg", "graph")]
        for p in procs:
            p.start()
        results = {r["kind"]: r for r in (out.get() for _ in procs)}
        for p in procs:
            p.join()
        wall = time.perf_counter() - start
    report = {
        "benchmark": "replay from offset 0 into both projections",
        "events": total,
        "wall_seconds": round(wall, 2),
        "events_per_second": round(total / wall),
        "postgres": {
            "seconds": round(results["pg"]["seconds"], 2),
            "peak_rss_mib": round(results["pg"]["peak_rss_mib"]),
        },
        "graph": {
            "seconds": round(results["graph"]["seconds"], 2),
            "peak_rss_mib": round(results["graph"]["peak_rss_mib"]),
        },
        "peak_rss_mib_max": round(max(r["peak_rss_mib"] for r in results.values())),
        "peak_rss_mib_sum_of_both_processes": round(sum(r["peak_rss_mib"] for r in results.values())),
        "produce_seconds": round(produce_s, 2),
        "aim": "under 60 s and under 1 GiB",
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_report(RESULTS, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
