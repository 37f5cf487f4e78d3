"""Packing task events (Context.packed): one TaskEvents record per partition and batch, read back as the
same per-task events in the same order."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from taskstream.connectors.partitioning import partition_for
from taskstream.schemas import records as r
from taskstream.schemas.codec import Codec
from taskstream.streams import context as context_module
from taskstream.streams.context import Context, _headers

from taskstream.core import events as e
from taskstream.settings import Settings


class _Topic:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_topic_name(self) -> str:
        return self.name


def make_context(partitions: int = 4) -> Context:
    s = Settings(partitions=partitions)
    topics = [_Topic(s.topic(t)) for t in ("events", "task-inputs", "queue", "dead-letters")]
    codec = Codec({"event": 7, "input": 8}, lambda sid: pytest.fail("no lookup expected"))
    return Context(s, codec, "node-a", *topics, producer=None)


def an_event(ctx: Context, task: str, version: int, payload: Any) -> tuple[Any, str, r.EventRecord]:
    return (ctx.events, task, ctx.event(task, f"sub-{task}", version, 1000 + version, payload))


def test_a_partitions_events_are_one_record_read_back_as_the_same_events_in_order() -> None:
    ctx = make_context()
    tasks = [f"t{i}" for i in range(12)]
    sends = []
    for v, payload in enumerate([e.TaskReady("no prerequisites"), e.TaskQueued(1, "default")], start=3):
        sends += [an_event(ctx, t, v, payload) for t in tasks]
    signal = (ctx.inputs, "t0", ctx.input("t0", 5, r.WatchPrerequisite("t1"), "w"))
    out = ctx.packed([*sends, signal])

    assert signal in out, "other records pass through unchanged"
    packed = [(key, rec) for topic, key, rec in out if topic is ctx.events]
    by_partition: dict[int, list[r.EventRecord]] = {}
    for _, _, rec in sends:
        by_partition.setdefault(partition_for(rec.task_id.encode(), 4), []).append(rec)  # type: ignore[union-attr]
    assert len(packed) == len(by_partition), "one record per partition"
    for key, rec in packed:
        part = partition_for(key.encode(), 4)
        members = r.task_events(rec)
        assert members == by_partition[part], "the same events (ids, versions, node, payloads), in order"
        assert {partition_for(m.task_id.encode(), 4) for m in members} == {part}  # type: ignore[union-attr]
        if len(members) > 1:
            assert type(rec.payload) is r.TaskEvents and rec.task_id is None and key == members[0].task_id


def test_a_lone_event_stays_a_record_of_its_own_and_packs_split_at_the_limit(monkeypatch: Any) -> None:
    ctx = make_context(partitions=1)
    lone = an_event(ctx, "t1", 3, e.TaskReady("no prerequisites"))
    assert ctx.packed([lone]) == [lone]
    monkeypatch.setattr(context_module, "PACK_MAX_EVENTS", 5)
    sends = [an_event(ctx, f"t{i}", 3, e.TaskReady("r")) for i in range(12)]
    out = ctx.packed(sends)
    assert [len(rec.payload.events) for _, _, rec in out] == [5, 5, 2]
    assert [m for _, _, rec in out for m in r.task_events(rec)] == [rec for _, _, rec in sends]


def test_packs_split_by_size_so_a_record_stays_far_under_the_message_limit(monkeypatch: Any) -> None:
    ctx = make_context(partitions=1)
    monkeypatch.setattr(context_module, "PACK_MAX_BYTES", 10_000)
    done = e.TaskSucceeded("c", 0, "x" * 4000, 5)
    out = ctx.packed([an_event(ctx, f"t{i}", 7, done) for i in range(5)])
    assert [len(rec.payload.events) for _, _, rec in out] == [2, 2, 1]
    assert all(len(ctx.codec.encode(rec)) < 10_000 for _, _, rec in out)


@given(st.lists(st.tuples(st.integers(0, 30), st.sampled_from([0, 1, 2])), max_size=60))
def test_any_mix_of_tasks_reads_back_per_task_in_the_order_decided(plan: list[tuple[int, int]]) -> None:
    ctx = make_context(partitions=3)
    kinds = [e.TaskReady("r"), e.TaskClaimed(1, "w", "c"), e.TaskCancelled("why")]
    versions: dict[str, int] = {}
    sends = []
    for task_no, kind in plan:
        tid = f"task-{task_no}"
        versions[tid] = versions.get(tid, 2) + 1
        sends.append(an_event(ctx, tid, versions[tid], kinds[kind]))
    decoded = [ctx.codec.decode("event", ctx.codec.encode(rec)) for _, _, rec in ctx.packed(sends)]
    got = [m for rec in decoded for m in r.task_events(rec)]
    assert sorted(got, key=lambda x: (x.task_id, x.version)) == sorted(
        (rec for _, _, rec in sends), key=lambda x: (x.task_id, x.version)
    )
    for tid in versions:  # each task's events in the order they were decided
        assert [m.version for m in got if m.task_id == tid] == [s[2].version for s in sends if s[1] == tid]


def test_a_packed_record_names_its_members_kinds_in_a_header() -> None:
    ctx = make_context(partitions=1)
    sends = [an_event(ctx, "t1", 5, e.TaskClaimed(1, "w", "c")), an_event(ctx, "t2", 4, e.TaskQueued(1, "d"))]
    [(_, _, rec)] = ctx.packed(sends)
    assert dict(_headers(rec) or []) == {
        "taskstream.event": b"TaskEvents",
        "taskstream.kinds": b"TaskClaimed,TaskQueued",
    }
    assert dict(_headers(sends[0][2]) or []) == {"taskstream.event": b"TaskClaimed"}


def test_with_the_default_limits_every_pack_fits_the_workers_producer_requests() -> None:
    """Faust's producer refuses a request over 1 MB (producer_max_request_size): full output tails and long
    reasons must still pack into records well under it."""
    ctx = make_context(partitions=1)
    tail = "é" * ctx.settings.output_tail_bytes  # two bytes each once encoded
    sends = [an_event(ctx, f"t{i}", 7, e.TaskFailed("c", 1, tail, 5, "r" * 2000)) for i in range(400)]
    out = ctx.packed(sends)
    assert len(out) > 1
    assert max(len(ctx.codec.encode(rec)) for _, _, rec in out) < 1_000_000 // 2


def a_queued(ctx: Context, task: str, argv: tuple[str, ...] = ("true",)) -> tuple[Any, str, r.QueuedTask]:
    return (ctx.queue, task, r.QueuedTask(task, 1, "default", 1000, r.TaskSpec(task, "acme", argv)))


def test_a_partitions_queue_records_are_one_record_standing_for_its_tasks_in_order(monkeypatch: Any) -> None:
    ctx = make_context()
    sends = [a_queued(ctx, f"t{i}") for i in range(20)]
    out = ctx.packed(sends)
    by_partition: dict[int, list[r.QueuedTask]] = {}
    for _, _, rec in sends:
        by_partition.setdefault(partition_for(rec.task_id.encode(), 4), []).append(rec)
    assert len(out) == len(by_partition), "one queue record per partition"
    for topic, key, rec in out:
        assert topic is ctx.queue and key == rec.task_id
        part = partition_for(key.encode(), 4)
        assert r.queued_tasks(rec) == by_partition[part], "the same tasks, in order"
    codec = Codec({"queued": 9}, lambda sid: pytest.fail("no lookup expected"))
    assert [r.queued_tasks(codec.decode("queued", codec.encode(rec))) for _, _, rec in out] == [
        by_partition[partition_for(key.encode(), 4)] for _, key, _ in out
    ]

    one = make_context(partitions=1)
    lone = a_queued(one, "t1")
    assert one.packed([lone]) == [lone], "a lone task stays a record of its own"
    monkeypatch.setattr(context_module, "PACK_MAX_BYTES", 10_000)
    big = [a_queued(one, f"t{i}", ("echo", "x" * 4000)) for i in range(5)]
    assert [len(r.queued_tasks(rec)) for _, _, rec in one.packed(big)] == [2, 2, 1], "split by size"


def test_a_workers_inputs_sent_at_the_same_moment_go_in_one_write_one_record_per_partition() -> None:
    """streams.worker.Reports: what the executors send in the same turn of the event loop is one write,
    the inputs of each partition packed in order; each sender returns once the write is durable; an
    input sent alone stays a record of its own."""
    import asyncio

    from taskstream.streams.worker import Reports

    ctx = make_context()
    writes: list[list[Any]] = []

    async def send_all(sends: list[Any]) -> None:
        await asyncio.sleep(0.01)
        writes.append(list(sends))

    ctx.send_all = send_all  # type: ignore[method-assign]
    reports = Reports(ctx)
    inputs = [ctx.input(f"t{i}", 100 + i, r.ClaimRequest(1, "w", f"c{i}"), f"c{i}:claim") for i in range(10)]

    async def go() -> None:
        await asyncio.gather(*(reports.send(rec) for rec in inputs))
        assert len(writes) == 1, "one write for everything sent together"
        await reports.send(inputs[0])

    asyncio.run(go())
    together, alone = writes
    by_partition: dict[int, list[r.InputRecord]] = {}
    for rec in inputs:
        by_partition.setdefault(partition_for(rec.task_id.encode(), 4), []).append(rec)
    assert len(together) == len(by_partition)
    for topic, key, rec in together:
        assert topic is ctx.inputs and key == rec.task_id
        assert r.task_inputs(rec) == by_partition[partition_for(key.encode(), 4)]
    assert alone == [(ctx.inputs, "t0", inputs[0])]


def test_a_report_on_a_task_this_worker_owns_is_handed_over_in_the_step_that_sends_it() -> None:
    """streams/worker.Reports: a report whose task's partition this worker's lifecycle holds goes into the
    inbox in the sender's own step (no flush task, no turn of the loop in between), and its send returns
    once the batch that decides it is written; one on a partition held elsewhere goes to the broker."""
    import asyncio

    from taskstream.streams.inbox import Inbox
    from taskstream.streams.worker import Reports

    ctx = make_context()
    writes: list[list[Any]] = []

    async def send_all(sends: list[Any]) -> None:
        writes.append(list(sends))

    ctx.send_all = send_all  # type: ignore[method-assign]
    mine = next(f"t{i}" for i in range(50) if ctx.partition(f"t{i}") == 0)
    theirs = next(f"t{i}" for i in range(50) if ctx.partition(f"t{i}") != 0)
    box = Inbox("inputs", ctx.partition, lambda: {0}, None)
    reports = Reports(ctx, box)

    async def go() -> None:
        report = ctx.input(mine, 100, r.FinishReport("c1", 0, "", 1, ""), "c1:finish")
        sending = asyncio.ensure_future(reports.send(report))
        await asyncio.sleep(0)  # one turn: the sender's first step
        assert [item.record for item, _ in box.waiting] == [report], "in the inbox after the sender's step"
        assert not reports.flushes and writes == []
        [(_, fut)] = box.drain()
        await asyncio.sleep(0.01)
        assert not sending.done(), "not returned before its batch is written"
        fut.set_result(None)
        await asyncio.wait_for(sending, 1)
        other = ctx.input(theirs, 100, r.FinishReport("c2", 0, "", 1, ""), "c2:finish")
        await asyncio.wait_for(reports.send(other), 1)
        assert writes == [[(ctx.inputs, theirs, other)]] and box.waiting == []

    asyncio.run(go())


def test_a_claim_beats_a_heartbeat_after_its_claim_and_each_beat_and_those_due_together_go_together() -> None:
    """streams.worker.Heartbeats: a claim's first heartbeat is due heartbeat_ms after it is held (a claim
    dropped sooner never beats), the next heartbeat_ms after that; claims due within a tenth of it beat
    in the same send."""
    import asyncio

    from taskstream.streams.worker import Heartbeats

    ctx = make_context()
    every = ctx.settings.heartbeat_ms / 1000

    async def go() -> None:
        beats = Heartbeats(ctx, None)
        t0 = time.monotonic()
        beats.hold("t1", "c1")
        beats.hold("t2", "c2")
        beats.hold("t3", "c3")
        beats.loop.cancel()  # driven by hand below
        beats.held["c2"][2] = t0 + every * 1.05  # claimed a moment after c1: due together with it
        beats.held["c3"][2] = t0 + every * 1.5
        assert beats.due(t0 + every * 0.5) == [], "nothing is due before heartbeat_ms"
        beats.drop("c3")
        first = beats.due(t0 + every)
        assert [(b.task_id, b.input_id) for b in first] == [("t1", "c1:beat:1"), ("t2", "c2:beat:1")]
        assert all(isinstance(b.body, r.Heartbeat) for b in first)
        assert beats.due(t0 + every * 1.5) == [], "the next one is heartbeat_ms after the last"
        assert [b.input_id for b in beats.due(t0 + every * 2)] == ["c1:beat:2", "c2:beat:2"]

    asyncio.run(go())


def test_each_lanes_tasks_go_to_its_own_topic_one_record_per_partition() -> None:
    """The default lane's tasks go to `queue`, another lane's to `queue.<lane>`, never packed together;
    each lane's topic is partitioned like the queue (a task's partition number is the same)."""
    ctx = make_context(partitions=2)
    big = ctx.queue_for("big")
    assert ctx.queue_for("default") is ctx.queue and ctx.queue_for("big") is big
    assert big.get_topic_name() == ctx.settings.topic("queue.big")
    sends = [a_queued(ctx, f"t{i}") for i in range(6)]
    sends += [(big, f"b{i}", r.QueuedTask(f"b{i}", 1, "big", 1000, r.TaskSpec(f"b{i}", "acme", ("true",))))
              for i in range(6)]  # fmt: skip
    out = ctx.packed(sends)
    lanes = {(topic.get_topic_name(), {t.lane for t in r.queued_tasks(rec)} == {"big"}) for topic, _, rec in out}
    assert lanes == {(ctx.settings.topic("queue"), False), (ctx.settings.topic("queue.big"), True)}
    assert sorted(t.task_id for _, _, rec in out for t in r.queued_tasks(rec)) == sorted(k for _, k, _ in sends)
    assert len(out) <= 4  # one record per lane and partition
