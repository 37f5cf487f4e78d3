"""The task owner's CPU per task, in one process: the lifecycle's decisions without a broker or a stack.

`bench/throughput.py` runs every service on two shared cores, and on these machines a run's CPU per
task moves by a third between runs minutes apart on the same code (docs/measurements.md, 2026-12-05,
sixth): a change worth a few percent of the worker cannot be seen there. This runs the part of the
worker that decides, the lifecycle (`streams/lifecycle.py`), on what a no-op DAG brings it, with the
real pure core, Avro codec, packing and state codec, and times only that:

- the admission's packed TasksAdmitted records (`streams/admission.Admitted.records`, encoded as the
  admitter writes them), handed to `Lifecycle.on_batch` as Faust would deliver them: each task is
  submitted, admitted, made ready, queued and claimed for this worker in-process;
- each claimed task's finish report (a short run: its start comes with it), handed over in-process
  in batches as the worker's inbox gathers them: each task starts and succeeds.

Every write goes through the real `Context.send_all` (records encoded and packed) to a producer that
only acknowledges; the tables are in memory, their changelog records produced all the same. Left out
is the I/O: the broker, RocksDB, Faust's delivery, the runner. Prints and writes
bench/results/owner.json: microseconds of CPU per task (process time) per round, their median and
minimum, and the records written per task by topic.

Even in one process the machine's speed moves a round by a quarter within seconds. To compare two
versions of the code, run them in turn several times, many rounds each, and compare the minimum (the
noise only ever adds): run against run, an unchanged tree came out within 2-3%.

    python bench/owner_bench.py [--tasks 10000] [--rounds 7] [--finish-batch 32] [--no-save]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stack import when, write_report  # noqa: E402
from taskstream.connectors.table_state import MemoryState  # noqa: E402
from taskstream.schemas import records as r  # noqa: E402
from taskstream.schemas.codec import ENVELOPES, Codec  # noqa: E402
from taskstream.streams.admission import Admitted  # noqa: E402
from taskstream.streams.context import EVENT_HEADER, Context  # noqa: E402
from taskstream.streams.inbox import Inbox, LocalInput  # noqa: E402
from taskstream.streams.lifecycle import Lifecycle  # noqa: E402

from taskstream.core.submission import parse_document, submission_id_for, task_ids  # noqa: E402
from taskstream.settings import Settings  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "owner.json"
WORKER = "bench-w0"


class _Topic:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_topic_name(self) -> str:
        return self.name


class _Acknowledging:
    """A producer that takes every record at once: each send's future is done with its offset."""

    def __init__(self) -> None:
        self.offsets: dict[tuple[str, int], int] = {}
        self.per_topic: dict[str, int] = {}

    async def send(self, topic: str, key: Any, value: Any, partition: Any, _ts: Any, _headers: Any) -> Any:
        part = partition if partition is not None else 0
        offset = self.offsets[topic, part] = self.offsets.get((topic, part), -1) + 1
        self.per_topic[topic] = self.per_topic.get(topic, 0) + 1
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(SimpleNamespace(topic=topic, partition=part, offset=offset))
        return fut

    def _ensure_producer(self) -> _Acknowledging:  # aiokafka's producer under Faust's: this one too
        return self

    def create_batch(self) -> list[Any]:
        return _Batch()

    async def send_batch(self, batch: list[Any], topic: str, *, partition: int) -> Any:
        first = self.offsets.get((topic, partition), -1) + 1
        self.offsets[topic, partition] = first + len(batch) - 1
        self.per_topic[topic] = self.per_topic.get(topic, 0) + len(batch)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(SimpleNamespace(topic=topic, partition=partition, offset=first))
        return fut


class _Batch(list):  # type: ignore[type-arg]
    """A record batch that takes every record (aiokafka's BatchBuilder, but never full)."""

    def append(self, *, key: Any, value: Any, timestamp: Any) -> Any:  # type: ignore[override]
        super().append((key, value))
        return True


class _Changelogged(MemoryState):
    """The tables in memory, with the changelog records a Faust table's would have (produced with each
    batch's writes, as on the worker)."""

    def __init__(self, topic: str) -> None:
        super().__init__()
        self.changelog_topic = topic

    def changelog(self, partition: int, items: Any) -> list[Any]:
        return [(self.changelog_topic, partition, key, value) for key, value in items.items()]


class _Claims:
    """This worker's local claims with room for everything: each task queued is claimed in-process
    (streams/worker.LocalClaims does this up to its slots and claim_ahead)."""

    worker_id = WORKER

    def __init__(self, lane: str) -> None:
        self.lane = lane
        self.handed: list[tuple[r.QueuedTask, str]] = []

    def ready_lane(self, _spec: Any) -> str:
        return self.lane

    def reserve(self, qt: r.QueuedTask) -> str:
        return f"{qt.task_id}:{qt.attempt}:{WORKER}"

    def hand(self, qt: r.QueuedTask, claim_id: str) -> None:
        self.handed.append((qt, claim_id))

    def release(self, _n: int) -> None:
        raise AssertionError("every claim of the bench is written")


def one_round(n: int, finish_batch: int, seed: int) -> tuple[float, dict[str, float]]:
    """CPU seconds for `n` tasks from admission to success, and the records written per task by topic."""
    s = Settings()
    topics = [_Topic(s.topic(t)) for t in ("events", "task-inputs", "queue", "dead-letters")]
    codec = Codec({env: i for i, env in enumerate(ENVELOPES, start=1)}, lambda sid: None)
    producer = _Acknowledging()
    ctx = Context(s, codec, "bench-node", *topics, producer=producer)
    lc = Lifecycle(ctx, _Changelogged("tasks-changelog"), _Changelogged("timers-changelog"))
    claims = _Claims(s.lane)
    lc.local = claims
    lc.inbox = Inbox(topics[1].name, ctx.partition, lambda: range(s.partitions), codec)

    doc = {"tenant": "bench", "tasks": [{"name": f"t{i}", "call": "os:getpid"} for i in range(n)]}
    sub = parse_document(doc)
    sid = submission_id_for("bench", None, f"bench-{seed}")
    admitted = Admitted("bench-admission", sid, 1_000, sub, task_ids(sub, sid))
    events = topics[0].name
    messages = [
        SimpleNamespace(
            topic=events,
            partition=ctx.partition(key),
            offset=i,
            key=key.encode(),
            value=codec.encode(rec),
            headers={EVENT_HEADER: b"TasksAdmitted"},
        )
        for i, (_, key, rec) in enumerate(admitted.records(ctx.partition))
    ]

    async def guard(_message: Any, handling: Any) -> None:
        await handling

    async def run() -> None:
        await lc.on_batch(messages, events, guard)
        if len(claims.handed) != n:
            raise SystemExit(f"{len(claims.handed)} of {n} tasks were claimed at admission")
        finishes = [
            LocalInput(
                r.InputRecord(
                    f"{cid}:finish", qt.task_id, 2_000, WORKER, r.FinishReport(cid, 0, "", 1, "", 1_999, 4242)
                ),
                topics[1].name,
                ctx.partition(qt.task_id),
            )
            for qt, cid in claims.handed
        ]
        for i in range(0, n, finish_batch):
            await lc.on_batch(finishes[i : i + finish_batch], events, guard)

    start = time.process_time()
    asyncio.run(run())
    took = time.process_time() - start
    done = sum(1 for raw in lc.tasks.values() if b'"SUCCEEDED"' in raw)
    if done != n:
        raise SystemExit(f"{done} of {n} tasks succeeded")
    return took, {topic: round(k / n, 3) for topic, k in sorted(producer.per_topic.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--finish-batch", type=int, default=32, help="finish reports decided per batch")
    ap.add_argument("--no-save", action="store_true", help="print only (for comparing code changes)")
    args = ap.parse_args()
    one_round(min(args.tasks, 500), args.finish_batch, seed=-1)  # imports and caches warm
    runs: list[float] = []
    records: dict[str, float] = {}
    for i in range(args.rounds):
        took, records = one_round(args.tasks, args.finish_batch, seed=i)
        runs.append(round(took / args.tasks * 1e6, 1))
    report = {
        "benchmark": "the task owner's CPU per no-op task, admission to success, in one process (no I/O)",
        "when": when(),
        "tasks": args.tasks,
        "finish_batch": args.finish_batch,
        "records_written_per_task": records,
        "cpu_us_per_task": {"median": statistics.median(runs), "min": min(runs), "max": max(runs), "runs": runs},
    }
    if args.no_save:
        print(report)
    else:
        write_report(RESULTS, report)


if __name__ == "__main__":
    main()
