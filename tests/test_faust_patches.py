"""taskstream's changes to Faust (connectors/faust_patches.py) and the executor's in-order acks
(streams/worker.py), on Faust's own Consumer.ack and commit logic."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.consumer import Consumer
from faust.types import TP
from hypothesis import given, settings
from hypothesis import strategies as st
from taskstream.connectors.faust_patches import (
    ack_processed_only,
    commit_past_gaps_at_once,
    merge_gaps_locally,
    track_heartbeats,
)
from taskstream.streams.worker import InOrderAcks


def fake_consumer(generation: int) -> SimpleNamespace:
    """The state Consumer.ack reads and writes, for one topic whose acks count."""
    return SimpleNamespace(
        app=SimpleNamespace(consumer_generation_id=generation, topics=SimpleNamespace(acks_enabled_for=lambda t: True)),
        _committed_offset=defaultdict(lambda: None),
        _acked_index=defaultdict(set),
        _acked=defaultdict(list),
        _unacked_messages=set(),
        _n_acked=0,
        _waiting_for_ack=None,
    )


class Msg(SimpleNamespace):
    __hash__ = object.__hash__  # Consumer.ack keeps messages in a set


def message(offset: int, generation: int, tracked: bool = True) -> Msg:
    return Msg(
        tracked=tracked,
        acked=False,
        tp=TP("taskstream.task-inputs", 0),
        offset=offset,
        topic="taskstream.task-inputs",
        generation_id=generation,
    )


def test_a_message_the_stream_skipped_is_not_acked_so_its_offset_is_not_committed() -> None:
    """Faust skips (does not track, does not hand to the agent) a message that arrives during a
    rebalance, then acks it; refused, its offset stays uncommitted until it is fetched and processed."""
    ack_processed_only()
    ack_processed_only()  # twice changes nothing
    c = fake_consumer(generation=3)
    skipped, processed = message(4, generation=2, tracked=False), message(5, generation=3)
    assert Consumer.ack(c, skipped) is False  # type: ignore[arg-type]
    assert Consumer.ack(c, message(6, generation=3, tracked=False)) is False  # type: ignore[arg-type]
    assert Consumer.ack(c, processed) is True  # type: ignore[arg-type]
    tp = TP("taskstream.task-inputs", 0)
    assert c._acked[tp] == [5] and 4 not in c._acked_index[tp] and not skipped.acked
    # fetched again after the rebalance's seek and processed this time, it is acked
    assert Consumer.ack(c, message(4, generation=3)) is True  # type: ignore[arg-type]
    assert sorted(c._acked[tp]) == [4, 5]


def test_queue_records_are_acked_in_offset_order_whatever_order_they_finish_in() -> None:
    acks = InOrderAcks()
    g = [acks.taken("p0", off, f"e{off}") for off in (10, 11, 12, 13)]
    acks.taken("p1", 5, "x5")
    assert acks.handled("p0", 12, g[2]) == []  # 10 and 11 are still being handled
    assert acks.handled("p0", 11, g[1]) == []
    assert acks.handled("p1", 5, 0) == ["x5"]  # partitions are independent
    assert acks.handled("p0", 10, g[0]) == ["e10", "e11", "e12"]
    assert acks.handled("p0", 13, g[3]) == ["e13"]
    assert acks.handled("p0", 13, g[3]) == []  # each once

    # a rebalance: what was taken before is delivered again and acked as that, never as the old copy
    old = acks.taken("p0", 14, "old14")
    acks.rebalanced()
    new = acks.taken("p0", 14, "new14")
    assert acks.handled("p0", 14, old) == []
    assert acks.handled("p0", 14, new) == ["new14"]

    # a seek back within a generation: the records delivered again are acked in their new order
    acks.taken("p0", 20, "a20")
    acks.taken("p0", 18, "b18")
    acks.taken("p0", 19, "b19")
    assert acks.handled("p0", 19, new) == []
    assert acks.handled("p0", 18, new) == ["b18", "b19"]


def test_a_queue_record_of_several_tasks_is_acked_once_all_of_them_are_handled() -> None:
    acks = InOrderAcks()
    g = acks.taken("p0", 20, "e20", tasks=3)
    acks.taken("p0", 21, "e21")
    assert acks.handled("p0", 21, g) == []  # 20 still has tasks being handled
    assert acks.handled("p0", 20, g) == []
    assert acks.handled("p0", 20, g) == []
    assert acks.handled("p0", 20, g) == ["e20", "e21"]


def test_faust_commits_past_a_record_still_being_handled_unless_acks_come_in_order() -> None:
    """Faust's own commit logic (Consumer._new_offset): with the last commit at 10, and 11 handled before
    10, acking 11 alone commits 12, past 10. Through InOrderAcks nothing is acked until 10 is done."""
    tp = TP("taskstream.queue", 0)

    def consumer() -> SimpleNamespace:
        c = fake_consumer(generation=1)
        c._committed_offset[tp] = 10
        c._gap = defaultdict(list)  # no gaps (Faust keeps an IntervalTree; empty, it is falsy too)
        return c

    def queued(offset: int) -> Msg:
        return Msg(tracked=True, acked=False, tp=tp, offset=offset, topic=tp.topic, generation_id=1)

    plain = consumer()
    Consumer.ack(plain, queued(11))  # type: ignore[arg-type]
    assert Consumer._new_offset(plain, tp) == 12  # type: ignore[arg-type]  # 10 was passed over

    c, acks = consumer(), InOrderAcks()
    msgs = {off: queued(off) for off in (10, 11)}
    gen = [acks.taken(tp, off, m) for off, m in msgs.items()]
    for m in acks.handled(tp, 11, gen[1]):
        Consumer.ack(c, m)  # type: ignore[arg-type]
    assert Consumer._new_offset(c, tp) is None  # type: ignore[arg-type]
    for m in acks.handled(tp, 10, gen[0]):
        Consumer.ack(c, m)  # type: ignore[arg-type]
    assert Consumer._new_offset(c, tp) == 12  # type: ignore[arg-type]


def test_after_a_rebalance_never_committed_partitions_of_our_topics_are_read_from_their_beginning() -> None:
    """Faust's seek back after recovery leaves a partition without a committed offset where its consumer
    got to (past what was skipped during recovery); the patch sends such partitions of the worker's own
    topics to their beginning, and leaves committed ones and Faust's changelogs as aiokafka put them."""
    import asyncio

    from aiokafka import TopicPartition
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
    from taskstream.connectors.faust_patches import seek_uncommitted_to_beginning

    queue0, queue1, queue2 = (TopicPartition("taskstream.queue", p) for p in range(3))
    changelog = TopicPartition("taskstream-scheduler-tasks-changelog", 0)
    committed = {queue0: None, queue1: 7, queue2: 0, changelog: None}

    class AioConsumer:
        sought: list[tuple[TopicPartition, int]] = []

        async def seek_to_committed(self) -> dict[TopicPartition, int | None]:
            return committed

        async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
            return {tp: 100 + tp.partition for tp in tps}  # a log whose start was deleted

        def assignment(self) -> set[TopicPartition]:
            return {queue0, queue1, changelog}  # queue2 was taken away meanwhile

        def seek(self, tp: TopicPartition, offset: int) -> None:  # a position at once, not a reset
            self.sought.append((tp, offset))

    aio = AioConsumer()

    class Thread:
        def _ensure_consumer(self) -> AioConsumer:
            return aio

        async def call_thread(self, fun: Any) -> Any:
            return await fun()

    seek_uncommitted_to_beginning({"taskstream.queue"})
    seek_uncommitted_to_beginning({"taskstream.queue"})  # twice changes nothing
    got = asyncio.run(AIOKafkaConsumerThread.seek_to_committed(Thread()))  # type: ignore[arg-type]
    assert got == committed  # Faust still gets the committed offsets
    assert aio.sought == [(queue0, 100)]


def test_an_answered_heartbeat_is_reported_with_when_it_was_sent_and_a_refused_one_is_not() -> None:
    """On aiokafka's own GroupCoordinator._do_heartbeat, its broker answer faked: no error, a rebalance
    under way (still a member), an unknown member (let go on)."""
    from aiokafka.consumer.group_coordinator import GroupCoordinator

    heard: list[float] = []
    track_heartbeats(heard.append)
    track_heartbeats(heard.append)  # installed once: a second listener, not a second wrapper
    track_heartbeats(lambda _: pytest.fail("a heartbeat of another group"), "another group")

    def coordinator(error_code: int) -> Any:
        async def send_req(_request: Any) -> Any:
            await asyncio.sleep(0.01)
            return SimpleNamespace(error_code=error_code)

        return SimpleNamespace(
            group_id="g", generation=3, member_id="m", _send_req=send_req,
            request_rejoin=lambda: None, reset_generation=lambda: None,
        )  # fmt: skip

    before = time.monotonic()
    assert asyncio.run(GroupCoordinator._do_heartbeat(coordinator(0))) is True
    assert len(heard) == 2 and heard[0] == heard[1] and before <= heard[0] <= time.monotonic() - 0.01
    assert asyncio.run(GroupCoordinator._do_heartbeat(coordinator(27))) is True  # RebalanceInProgress
    assert len(heard) == 4
    assert asyncio.run(GroupCoordinator._do_heartbeat(coordinator(25))) is False  # UnknownMemberId
    assert len(heard) == 4


def merged_the_old_way(adds: list[tuple[int, int]], committed: int | None) -> set[tuple[int, int]]:
    """What Faust 0.15.3's own `_add_gap` leaves: each gap added, then the whole tree merged."""
    from intervaltree import IntervalTree

    tree = IntervalTree()
    for begin, end in adds:
        begin = begin if committed is None else max(begin, committed + 1)
        if begin <= end:
            tree.addi(begin, end + 1)
            tree.merge_overlaps()
    return {(iv.begin, iv.end) for iv in tree}


def gaps_consumer(committed: int | None) -> SimpleNamespace:
    from intervaltree import IntervalTree

    return SimpleNamespace(
        _committed_offset=defaultdict(lambda: committed),
        _gap=defaultdict(IntervalTree),
        _acked=defaultdict(list),
        _acked_index=defaultdict(set),
    )


@settings(max_examples=300, deadline=None)
@given(
    adds=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 12)).map(lambda p: (p[0], p[0] + p[1])), max_size=25),
    committed=st.none() | st.integers(0, 40),
)
def test_a_gap_merged_with_what_it_meets_leaves_the_tree_faust_s_whole_merge_leaves(
    adds: list[tuple[int, int]], committed: int | None
) -> None:
    """Gaps in any order, overlapping, touching or apart, some before the committed offset: the tree is
    the one Faust's add-then-merge-everything leaves, interval for interval."""
    merge_gaps_locally()
    c = gaps_consumer(committed)
    tp = TP("taskstream.events", 0)
    for begin, end in adds:
        asyncio.run(Consumer._add_gap(c, tp, begin, end))  # type: ignore[arg-type]
    assert {(iv.begin, iv.end) for iv in c._gap[tp]} == merged_the_old_way(adds, committed)


def test_offsets_taken_by_transaction_markers_are_committed_past() -> None:
    """Records at 0, 1, 3, 4 and 7 (the offsets between them: transaction markers), each seen and acked,
    the gaps added as Faust's fetch loop adds them (a gap runs to the record after it, inclusive): the
    offsets Faust's commits go to reach 8, past every gap, and no gap is left."""
    merge_gaps_locally()
    merge_gaps_locally()  # twice changes nothing
    c = gaps_consumer(None)
    tp = TP("taskstream.events", 0)
    last = None
    for offset in (0, 1, 3, 4, 7):
        if last is not None and offset - last > 1:
            asyncio.run(Consumer._add_gap(c, tp, last + 1, offset))  # type: ignore[arg-type]
        c._acked[tp].append(offset)
        c._acked_index[tp].add(offset)
        last = offset
    assert {(iv.begin, iv.end) for iv in c._gap[tp]} == {(2, 4), (5, 8)}
    commits = []
    while (offset := Consumer._new_offset(c, tp)) is not None:  # type: ignore[arg-type]
        commits.append(offset)
        c._committed_offset[tp] = offset  # as Faust records a commit (consumer.py, commit)
    assert commits[-1] == 8 and commits == sorted(commits)
    assert not c._gap[tp]


def delivered(c: SimpleNamespace, tp: TP, read_from: int, offsets: list[int], acked_in: list[int]) -> None:
    """Messages at `offsets` delivered as Faust's fetch loop delivers them after a seek to `read_from`
    (the gap before a message recorded up to it, inclusive), then acked in the order of `acked_in`."""
    last = read_from
    for offset in offsets:
        if offset - last > 1:
            asyncio.run(Consumer._add_gap(c, tp, last + 1, offset))  # type: ignore[arg-type]
        last = offset
    ack(c, tp, acked_in)


def ack(c: SimpleNamespace, tp: TP, offsets: list[int]) -> None:
    for offset in offsets:
        c._acked[tp].append(offset)
        c._acked_index[tp].add(offset)


def test_one_commit_passes_every_gap_below_the_last_acked_offset() -> None:
    """Faust commits once per commit interval (`_new_offset` once per partition). Records at 1, 3, 4, 7
    and 9 (between them: transaction markers), each delivered and acked: the one commit goes to 10.
    Faust 0.15.3's own reaches 4 (the gap before 3 ends at 3, which is then in its list twice), and
    each later commit one repeat further, so a group reading a topic with a gap before most messages
    fell ever further behind."""
    merge_gaps_locally()
    commit_past_gaps_at_once()
    commit_past_gaps_at_once()  # twice changes nothing
    c = gaps_consumer(0)
    tp = TP("taskstream.events", 0)
    delivered(c, tp, 0, [1, 3, 4, 7, 9], [1, 3, 4, 7, 9])
    assert Consumer._new_offset(c, tp) == 10  # type: ignore[arg-type]
    assert c._acked[tp] == [] and not c._acked_index[tp] and not c._gap[tp]


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.integers(1, 4), min_size=1, max_size=40),
    in_flight=st.none() | st.integers(0, 39),
    order=st.randoms(use_true_random=False),
)
def test_a_commit_stops_at_a_message_in_flight_and_the_next_passes_the_last(
    steps: list[int], in_flight: int | None, order: Any
) -> None:
    """Messages after gaps of any size (from a read offset of 5, committed), acked in any order, one
    of them (right after the one before it) perhaps not yet: one commit goes past every acked message
    and gap up to the message in flight, never past it; once it is acked, the next commit goes past the
    last message."""
    merge_gaps_locally()
    commit_past_gaps_at_once()
    waiting_at = in_flight if in_flight is not None and in_flight < len(steps) else None
    if waiting_at is not None:
        steps = [1 if i == waiting_at else step for i, step in enumerate(steps)]
    offsets = [5 + sum(steps[: i + 1]) for i in range(len(steps))]
    waiting = offsets[waiting_at] if waiting_at is not None else None
    c = gaps_consumer(5)
    tp = TP("taskstream.events", 0)
    acked = [o for o in offsets if o != waiting]
    order.shuffle(acked)
    delivered(c, tp, 5, offsets, acked)
    first = Consumer._new_offset(c, tp)  # type: ignore[arg-type]
    if waiting is None:
        assert first == offsets[-1] + 1
        return
    assert first == (None if waiting == 6 else waiting)
    if first is not None:
        c._committed_offset[tp] = first  # as Faust records a commit
    ack(c, tp, [waiting])
    assert Consumer._new_offset(c, tp) == offsets[-1] + 1  # type: ignore[arg-type]


def test_what_is_left_out_before_delivery_is_committed_past_from_offset_0_on() -> None:
    """A partition's records at 0 (wanted), 2-4 (unwanted), 5 (wanted), 6-7 (unwanted) and, in a later
    fetch, 8 (wanted); 1 is a transaction's marker, never fetched. Only 0, 5 and 8 are delivered, and
    once each is acked the commits pass what was left out, the run after offset 0 included (Faust's own
    fetch loop takes a read offset of 0 for none, and records no gap after it); the run at the end of
    a fetch is passed once a later message is acked."""
    from taskstream.connectors.faust_patches import without

    merge_gaps_locally()
    c = gaps_consumer(None)
    c._add_gap = lambda tp, begin, end: Consumer._add_gap(c, tp, begin, end)  # type: ignore[arg-type]
    tp = TP("taskstream.events", 0)

    async def fetch(offsets: list[int]) -> Any:
        for offset in offsets:
            yield tp, SimpleNamespace(offset=offset, wanted=offset in (0, 5, 8))

    async def deliver(offsets: list[int]) -> list[int]:
        return [m.offset async for _, m in without(c, fetch(offsets), lambda m: not m.wanted)]

    def ack_and_commit(offset: int) -> int | None:
        c._acked[tp].append(offset)
        c._acked_index[tp].add(offset)
        committed = None
        while (new := Consumer._new_offset(c, tp)) is not None:  # type: ignore[arg-type]
            committed = c._committed_offset[tp] = new  # as Faust records a commit
        return committed

    assert asyncio.run(deliver([0, 2, 3, 4, 5, 6, 7])) == [0, 5]
    assert ack_and_commit(0) == 1
    assert ack_and_commit(5) == 6, "the commit passes the marker and the run left out after offset 0"
    assert c._committed_offset[tp] == 6, "6 and 7, left out at the end of the fetch, wait for a later ack"
    assert asyncio.run(deliver([8])) == [8]
    assert ack_and_commit(8) == 9
    assert not c._gap[tp]


def test_a_worker_leaves_out_its_lifecycle_s_own_writing_on_the_events_topic_and_nothing_else(tmp_path: Any) -> None:
    """What the worker's app registers with leave_out (streams/app.py): a packed or single event of a
    kind the lifecycle does not act on, on the events topic; never an admission, never a record without
    the kind header, never a record of another topic."""
    from taskstream.connectors.faust_patches import _unwanted
    from taskstream.streams.app import build_app

    from taskstream.settings import Settings

    s = Settings(state_dir=tmp_path, kafka_bootstrap="127.0.0.1:9")
    app = build_app(s)
    unwanted = _unwanted[app]
    events, inputs = s.topic("events"), s.topic("task-inputs")

    def record(topic: str, *headers: tuple[str, bytes]) -> SimpleNamespace:
        return SimpleNamespace(topic=topic, headers=list(headers))

    kind = "taskstream.event"
    assert unwanted(record(events, (kind, b"TaskEvents"), ("taskstream.kinds", b"TaskClaimed,TaskReady")))
    assert unwanted(record(events, (kind, b"TaskSucceeded")))
    assert not unwanted(record(events, (kind, b"TasksAdmitted")))
    assert not unwanted(record(events, (kind, b"TaskSubmitted")))
    assert not unwanted(record(events)), "without the header it might be anything: delivered, decoded"
    assert not unwanted(record(inputs, (kind, b"TaskEvents")))


@pytest.mark.parametrize("standbys", [0, 2])
def test_the_worker_s_app_keeps_as_many_standby_tables_as_the_setting_says(tmp_path: Any, standbys: int) -> None:
    """TASKSTREAM_TABLE_STANDBY_REPLICAS reaches Faust (streams/app.py); Faust's own default is 1."""
    from taskstream.streams.app import build_app

    from taskstream.settings import Settings

    default = build_app(Settings(state_dir=tmp_path / "a", kafka_bootstrap="127.0.0.1:9"))
    assert default.conf.table_standby_replicas == 1
    s = Settings.from_env(
        {"TASKSTREAM_STATE_DIR": str(tmp_path / "b"), "TASKSTREAM_TABLE_STANDBY_REPLICAS": str(standbys)}
    )
    assert build_app(s).conf.table_standby_replicas == standbys


def test_the_worker_s_producer_builds_large_record_batches_that_any_broker_takes(tmp_path: Any) -> None:
    """The worker's producer builds record batches of up to PRODUCER_BATCH_BYTES (aiokafka's default is
    16 KiB: a large admission's changelog went out in ~125 round trips), and a batch stays under the
    1 MiB that a broker takes at Kafka's default message.max.bytes, so no broker refuses one."""
    from taskstream.streams.app import PRODUCER_BATCH_BYTES, build_app

    from taskstream.settings import Settings

    app = build_app(Settings(state_dir=tmp_path, kafka_bootstrap="127.0.0.1:9"))
    assert app.conf.producer_max_batch_size == PRODUCER_BATCH_BYTES
    assert 16 * 1024 < PRODUCER_BATCH_BYTES < 1_048_588
