"""What taskstream changes in Faust and in aiokafka (its Kafka client), on every broker. Pinned to
faust-streaming 0.15.3 and aiokafka 0.14.0 (pyproject). The broker-specific adjustment (idle fetch
backoff on noida-db) is in connectors/noida.py."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
_MARK = "_taskstream_read_committed"
_ACK_MARK = "_taskstream_processed_only"
_SEEK_MARK = "_taskstream_seek_uncommitted"
_GAP_MARK = "_taskstream_gap_merged_locally"
_UNWANTED_MARK = "_taskstream_unwanted_left_out"
_NEW_OFFSET_MARK = "_taskstream_new_offset_deduplicated"
_unwanted: weakref.WeakKeyDictionary[Any, Callable[[Any], bool]] = weakref.WeakKeyDictionary()


def read_committed_only() -> None:
    """Make every aiokafka consumer in this process read_committed. Admission writes its events in Kafka
    transactions (streams/admitter.py); Faust asks for read_committed only when it runs exactly_once
    itself, and its worker consumer would otherwise see the records of aborted admissions."""
    import aiokafka

    init = aiokafka.AIOKafkaConsumer.__init__
    if getattr(init, _MARK, False):
        return

    def patched(self: Any, *topics: Any, **kwargs: Any) -> None:
        kwargs["isolation_level"] = "read_committed"
        init(self, *topics, **kwargs)

    setattr(patched, _MARK, True)
    aiokafka.AIOKafkaConsumer.__init__ = patched  # type: ignore[method-assign]


def ack_processed_only() -> None:
    """Never commit past a message that was not processed.

    Faust 0.15.3's stream skips a message that arrives during a rebalance (fetched under an older
    consumer-group generation, or while flow control is suspended for recovery) and then acks it like
    a processed one (faust/streams.py, `_py_aiter`: skipped values are acked "otherwise the lag would
    increase"), so its offset is committed and the message is never processed. Measured: two Faust
    workers, one SIGKILLed; PrerequisiteEnded inputs written to the dead worker's partitions before the
    survivor took them over were acked unprocessed (the group's committed offset passed them; no
    changelog write, no dead letter), and their dependents waited for good, in 3 runs of 8. A skipped
    message was never tracked (Faust tracks a message just before it hands it to the agent), so an ack
    of an untracked message is refused: its offset stays uncommitted, and the seek that ends the
    rebalance fetches it again. A message processed just before a rebalance may so run twice; the
    handlers are idempotent."""
    from faust.transport.consumer import Consumer

    original = Consumer.ack
    if getattr(original, _ACK_MARK, False):
        return

    def ack(self: Any, message: Any) -> bool:
        if not getattr(message, "tracked", True):
            return False
        return bool(original(self, message))

    setattr(ack, _ACK_MARK, True)
    Consumer.ack = ack  # type: ignore[method-assign]


def seek_uncommitted_to_beginning(topics: set[str]) -> None:
    """After a rebalance, read the never-committed partitions of `topics` from their beginning again.

    During a rebalance Faust skips what its consumer fetches until table recovery is done, then seeks
    every partition back to its committed offset to fetch the skipped records again (faust
    tables/recovery.py, `perform_seek`). aiokafka's `seek_to_committed` leaves a partition with no
    committed offset (or 0) where it is: past the records fetched and skipped during recovery, which
    this consumer then never reads. Measured: a worker added beside a busy one was given queue
    partitions nobody had committed yet and handled nothing from them, in 4 of 20 runs
    (bench/worker_join_bench.py; its executor got no record, its claimers idle). Here such partitions
    of the worker's own topics (`auto_offset_reset` is earliest) go back to their beginning. Faust's
    changelog partitions are left alone: its recovery positions those itself."""
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    original = AIOKafkaConsumerThread.seek_to_committed
    if getattr(original, _SEEK_MARK, False):
        return

    async def seek_to_committed(self: Any) -> Any:
        consumer = self._ensure_consumer()

        async def seek() -> Any:
            committed = await consumer.seek_to_committed()
            never = [tp for tp, offset in committed.items() if tp.topic in topics and not offset]
            if never:
                log.info(
                    "read from the beginning (never committed): %s",
                    ", ".join(f"{t.topic}[{t.partition}]" for t in never),
                )
                # To an offset, not aiokafka's seek_to_beginning: that only asks for a reset, and until
                # the fetcher has done it the partition has no position, which Faust's livelock check
                # reads (an AssertionError in aiokafka that stopped the worker, seen with three workers
                # joining one after another)
                starts = await consumer.beginning_offsets(never)
                assigned = consumer.assignment()
                for tp in never:
                    if tp in assigned:  # not taken away since
                        consumer.seek(tp, starts[tp])
            return committed

        return await self.call_thread(seek)

    setattr(seek_to_committed, _SEEK_MARK, True)
    AIOKafkaConsumerThread.seek_to_committed = seek_to_committed  # type: ignore[method-assign]


def merge_gaps_locally() -> None:
    """Record an offset gap in what it overlaps only, instead of rebuilding the partition's whole tree of
    gaps for each one.

    Faust keeps, per partition, the offsets its consumer never saw (an `IntervalTree`) so that it can
    commit past them, and every gap it adds runs `merge_overlaps()`, which sorts every interval and
    builds a new tree: O(n log n) for the n gaps since the last commit. A Kafka transaction's commit
    marker takes an offset of its own, so each admission transaction leaves a gap in the events
    partitions it wrote, and the lifecycle, which reads them, adds one per admitted submission. Measured
    with one-task submissions sent open loop at 150/s: `_add_gap` took 11.6% of the busy worker's
    event loop (`merge_overlaps` 10.8%), the loop was busy 79% of the time, and admissions reached the
    lifecycle 1-2 s after they were written (docs/measurements.md, "Gaps"). The tree is kept merged (no
    two intervals overlap), so a new interval can only overlap the intervals it meets: those are
    replaced by one spanning them all, which is what `merge_overlaps()` leaves, in O(k + log n)."""
    from faust.transport.consumer import Consumer
    from intervaltree import Interval

    original = Consumer._add_gap
    if getattr(original, _GAP_MARK, False):
        return

    async def _add_gap(self: Any, tp: Any, offset_from: int, offset_to: int) -> None:
        committed = self._committed_offset[tp]
        gaps = self._gap[tp]
        if committed is not None:
            offset_from = max(offset_from, committed + 1)
        if offset_from > offset_to:
            return
        begin, end = offset_from, offset_to + 1  # an interval excludes its end
        met = gaps.overlap(begin, end)
        if met:
            for iv in met:
                gaps.remove(iv)
            begin, end = min(begin, *(iv.begin for iv in met)), max(end, *(iv.end for iv in met))
        gaps.add(Interval(begin, end))

    setattr(_add_gap, _GAP_MARK, True)
    Consumer._add_gap = _add_gap  # type: ignore[method-assign]


def commit_past_gaps_at_once() -> None:
    """Let one commit pass every gap below the highest acked offset, as Faust means it to.

    Faust's fetch loop records the gap before a message it delivers as running up to that message,
    inclusive (faust/transport/consumer.py, `_drain_messages`), so once the message is acked its offset
    is in `_acked` twice after `_new_offset` adds the gap's offsets to it; its run of consecutive
    offsets (`consecutive_numbers`) ends at the repeat, and each commit moves past one repeat only (the
    duplicate of robinhood/faust#625). The events topic has a gap before nearly every admission the
    lifecycle reads (a transaction's marker, the lifecycle's own writing left out), so the workers'
    group's committed offsets there fell further behind the more was admitted: measured, at 100
    one-task submissions/s, 2,100 records per partition behind after 20 s and 7,400 after 60 s. A
    restarted worker would read all that again, and every commit sorted the ever longer list (its
    `_new_offset` was 3.5% of the worker's event loop at that rate). Here the offsets are deduplicated
    before the run is taken, and the gaps taken are chopped at their end. Otherwise as Faust 0.15.3."""
    from faust.transport.consumer import Consumer
    from faust.utils.functional import consecutive_numbers

    original = Consumer._new_offset
    if getattr(original, _NEW_OFFSET_MARK, False):
        return

    def _new_offset(self: Any, tp: Any) -> int | None:
        acked: list[int] = self._acked[tp]
        if not acked:
            return None
        top = max(acked)
        gaps = self._gap[tp]
        if gaps:
            met = gaps.overlap(0, top)
            if met:
                for iv in met:
                    acked.extend(range(iv.begin, iv.end))
                gaps.chop(0, max(max(iv.end for iv in met), top + 1))
        acked[:] = sorted(set(acked))  # in place: Faust holds this list
        committed = self._committed_offset[tp]
        if committed and acked[0] - committed > 1:  # a message before the first acked one is in flight
            return None
        run = next(consecutive_numbers(acked))
        del acked[: len(run)]
        self._acked_index[tp].difference_update(run)
        return run[-1] + 1

    setattr(_new_offset, _NEW_OFFSET_MARK, True)
    Consumer._new_offset = _new_offset  # type: ignore[method-assign]


def leave_out(app: Any, unwanted: Callable[[Any], bool]) -> None:
    """Leave the messages for which `unwanted(message)` holds out of what `app`'s consumer delivers: as
    if they were offsets it never saw (a transaction's marker is one), so its commits pass them.

    The lifecycle reads the events topic for admissions, and most of what is there is its own writing
    (a packed TaskEvents record per partition and batch), which it skips by header. Through Faust each
    of those cost a whole delivery first (the consumer's callback and its flow-control wait, the
    conductor, the stream, an ack), and each woke the lifecycle for a batch with nothing to decide.
    Here a fetched message that is unwanted is dropped before all that, and each run of dropped offsets
    is recorded as one gap (`Consumer._add_gap`), so the committed offset moves past them once a later
    message is acked. Faust's own gap detection would see them too, but not after a message at offset
    0 (it takes a read offset of 0 for none). What is left out at a partition's end is committed past
    only once a later message there is acked: until the next admission, the workers' group shows those
    few records as lag on the events topic; read again after a restart, they are left out again."""
    from faust.transport.consumer import Consumer

    _unwanted[app] = unwanted
    original = Consumer.getmany
    if getattr(original, _UNWANTED_MARK, False):
        return

    async def getmany(self: Any, timeout: float) -> Any:
        unwanted = _unwanted.get(self.app)
        fetched = original(self, timeout)
        async for item in fetched if unwanted is None else without(self, fetched, unwanted):
            yield item

    setattr(getmany, _UNWANTED_MARK, True)
    Consumer.getmany = getmany  # type: ignore[method-assign]


async def without(consumer: Any, fetched: Any, unwanted: Callable[[Any], bool]) -> Any:
    """The (tp, message) pairs of `fetched` but the unwanted; each run of a partition's offsets left out
    between two messages delivered is added to `consumer`'s gaps, once, when the run ends (at the next
    message delivered from that partition, or at the end of the fetch)."""
    runs: dict[Any, list[int]] = {}  # tp -> [first, last]: the offsets left out since its last delivery
    async for tp, message in fetched:
        if unwanted(message):
            run = runs.get(tp)
            if run is None:
                runs[tp] = [message.offset, message.offset]
            else:
                run[1] = message.offset
            continue
        run = runs.pop(tp, None)
        if run is not None:
            await consumer._add_gap(tp, run[0], run[1])
        yield tp, message
    for tp, run in runs.items():
        await consumer._add_gap(tp, run[0], run[1])


_HEARTBEAT_MARK = "_taskstream_heartbeats"
_heard: list[tuple[str | None, Any]] = []  # (group, listener): what track_heartbeats was given


def track_heartbeats(heard: Any, group_id: str | None = None) -> None:
    """Call `heard(sent_at)` (monotonic) for every heartbeat of group `group_id` (None: of any group) the
    coordinator answered: the member was still in the group when it was sent (streams/tenure.py). A
    worker's other consumer groups (its queue lanes, streams/lanes.py) say nothing of its membership in
    the workers' group. aiokafka keeps its last good heartbeat in a local of its heartbeat loop; its
    `GroupCoordinator._do_heartbeat` returns True for an answer that keeps the membership (none, or a
    rebalance under way)."""
    import time

    from aiokafka.consumer.group_coordinator import GroupCoordinator

    _heard.append((group_id, heard))
    original = GroupCoordinator._do_heartbeat
    if getattr(original, _HEARTBEAT_MARK, False):
        return

    async def _do_heartbeat(self: Any) -> bool:
        sent = time.monotonic()
        ok = bool(await original(self))
        if ok:
            for group, listener in _heard:
                if group is None or group == self.group_id:
                    listener(sent)
        return ok

    setattr(_do_heartbeat, _HEARTBEAT_MARK, True)
    GroupCoordinator._do_heartbeat = _do_heartbeat  # type: ignore[method-assign]


_IN_LOOP_MARK = "_taskstream_consumer_in_loop"


def consumer_in_loop() -> None:
    """Run the Faust worker's Kafka consumer on the worker's event loop, not in a thread of its own.

    Faust 0.15.3 runs aiokafka's consumer in a thread with an event loop of its own
    (`AIOKafkaConsumerThread`) and reaches it through a queue of method calls: each fetch the worker's
    loop asks for crosses to the thread and its answer back, two self-pipe wake-ups and a hand-over of
    the GIL. At a steady rate that is once or twice a task: measured at 100 one-task submissions/s,
    bringing the thread's records over was 18% of the worker's main thread and the self-pipe's writes
    and reads another 6% (docs/measurements.md). Here the same class runs as an ordinary service on
    the worker's loop: its calls are awaited directly, its rebalance callbacks too. Otherwise as
    Faust 0.15.3: the consumer, its fetcher and its coordinator are aiokafka's, created and started as
    Faust does."""
    from faust.transport.drivers import aiokafka as driver
    from mode import Service
    from mode.utils.futures import maybe_async

    if getattr(driver.Consumer._new_consumer_thread, _IN_LOOP_MARK, False):
        return

    class InLoopConsumerThread(driver.AIOKafkaConsumerThread):  # type: ignore[misc]
        def __init__(self, consumer: Any, *, loop: Any = None, **kwargs: Any) -> None:
            loop = loop or asyncio.get_event_loop()
            super().__init__(consumer, loop=loop, thread_loop=loop, **kwargs)

        async def start(self) -> None:  # no thread, and no queue of calls for one (call_thread below)
            self._thread_started.set()
            await Service.start(self)

        async def stop(self) -> None:
            if self._started.is_set() and not self._stopped.is_set():
                self._stopped.set()
                await self.on_stop()
                await self._shutdown_thread()
                await self.on_shutdown()

        async def call_thread(self, fun: Any, *args: Any, **kwargs: Any) -> Any:
            return await maybe_async(fun(*args, **kwargs))  # some are aiokafka's plain methods

        async def cast_thread(self, fun: Any, *args: Any, **kwargs: Any) -> None:
            self.add_future(maybe_async(fun(*args, **kwargs)))

        async def on_partitions_revoked(self, revoked: Any) -> None:
            await self.consumer.on_partitions_revoked(revoked)

        async def on_partitions_assigned(self, assigned: Any, generation_id: int = 0) -> None:
            await self.consumer.on_partitions_assigned(assigned, generation_id)

    def _new_consumer_thread(self: Any) -> Any:
        return InLoopConsumerThread(self, loop=self.loop, beacon=self.beacon)

    setattr(_new_consumer_thread, _IN_LOOP_MARK, True)
    driver.Consumer._new_consumer_thread = _new_consumer_thread  # type: ignore[method-assign]
