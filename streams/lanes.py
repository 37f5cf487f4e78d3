"""A worker's queue lanes beyond the default one.

Every worker reads the default lane's queue (`queue`, the Faust executor agent in streams/app.py, its
partitions shared among all the workers). A worker given more lanes (TASKSTREAM_WORKER_LANES, `taskstream
worker --lane`) reads each one's topic (`queue.<lane>`) in that lane's own consumer group, so a lane's
partitions are shared among the workers that read it and no other. The batcher sends a task to a lane
all of whose live workers can run it (taskstream/core/batcher.py `route`): a big task goes to a lane
of big workers and is never left on a partition held by one too small for it.

A lane's records are handled as the default lane's are: the tasks of each go to the worker's claimers
(its slots and claim_ahead, sharing the worker's capacity with its other lanes), and a record's offset
is committed once it and every record before it in its partition are handled (streams/worker.py
InOrderAcks). A rebalance of the lane's group delivers its partitions again from their commits; a
record this worker has claimed from already is skipped (ClaimWaiter.first_time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata
from taskstream.connectors.kafka import ensure_lane_topics, lane_topic
from taskstream.schemas import records as r
from taskstream.schemas.codec import DecodeError
from taskstream.streams.context import Context
from taskstream.streams.worker import InOrderAcks

log = logging.getLogger(__name__)
Handle = Callable[[Any, r.QueuedTask], Awaitable[None]]  # (the record, one of its tasks) -> handled


def lane_group(ctx: Context, lane: str) -> str:
    return f"{ctx.settings.topic_prefix}-lane-{lane}"


class LaneReader:
    """Reads one lane's queue in the lane's consumer group and hands its tasks to `claimers` claimers."""

    def __init__(
        self, ctx: Context, lane: str, handle: Handle, claimers: int, on_ready: Callable[[], None] = lambda: None
    ) -> None:
        self.ctx = ctx
        self.on_ready = on_ready  # called once the lane's topic exists and the reader has subscribed to it
        self.lane = lane
        self.handle = handle
        self.claimers = claimers
        self.acks = InOrderAcks()
        self.consumer: AIOKafkaConsumer | None = None
        self.dead: set[asyncio.Task[None]] = set()  # dead-lettering under way (kept till done)

    async def run(self) -> None:
        s = self.ctx.settings
        topic = lane_topic(s, self.lane)
        while True:
            try:
                await asyncio.to_thread(ensure_lane_topics, s, [self.lane])
                break
            except Exception as exc:  # the broker is not up yet, or refused: the lane is read once it is there
                log.warning("lane %s: cannot create its topic %s (%s); trying again in 2s", self.lane, topic, exc)
                await asyncio.sleep(2.0)
        timeout = s.worker_session_timeout_ms
        consumer = self.consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap,
            group_id=lane_group(self.ctx, self.lane),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=timeout,
            heartbeat_interval_ms=max(500, min(3000, timeout // 5)),
            rebalance_timeout_ms=max(timeout * 2, 20_000),
            max_poll_interval_ms=max(timeout * 2, 300_000),
        )
        await consumer.start()
        consumer.subscribe([topic], listener=_Rebalanced(self.acks))
        self.on_ready()  # the worker advertises the lane from now on: the batcher routes to it
        work: asyncio.Queue[tuple[Any, int, r.QueuedTask]] = asyncio.Queue()
        claimers = [asyncio.ensure_future(self._claimer(work)) for _ in range(self.claimers)]
        log.info("lane %s: reading %s in group %s", self.lane, topic, lane_group(self.ctx, self.lane))
        try:
            while True:
                try:
                    batches = await consumer.getmany(timeout_ms=500, max_records=500)
                except KafkaError as exc:  # the claimers and their running tasks go on meanwhile
                    log.warning("lane %s: reading %s failed (%s); trying again in 1s", self.lane, topic, exc)
                    await asyncio.sleep(1.0)
                    continue
                for tp, msgs in batches.items():
                    for m in msgs:
                        self._take(tp, m, work)
        finally:
            for c in claimers:
                c.cancel()  # a running task drains in its claimer (streams/worker.py)
            await asyncio.gather(*claimers, return_exceptions=True)
            with contextlib.suppress(Exception):
                await consumer.stop()

    def _take(self, tp: TopicPartition, m: Any, work: asyncio.Queue[tuple[Any, int, r.QueuedTask]]) -> None:
        try:
            tasks = r.queued_tasks(self.ctx.codec.decode("queued", m.value))
        except DecodeError as err:
            generation = self.acks.taken(tp, m.offset, m)
            task = asyncio.ensure_future(self._dead(tp, m, generation, err.reason))
            self.dead.add(task)
            task.add_done_callback(self.dead.discard)
            return
        generation = self.acks.taken(tp, m.offset, m, len(tasks))
        for qt in tasks:
            work.put_nowait((m, generation, qt))

    async def _dead(self, tp: TopicPartition, m: Any, generation: int, reason: str) -> None:
        await self.ctx.dead_letter(m, reason, f"lane {self.lane}")
        await self._commit(tp, self.acks.handled(tp, m.offset, generation))

    async def _claimer(self, work: asyncio.Queue[tuple[Any, int, r.QueuedTask]]) -> None:
        assert self.consumer is not None
        while True:
            m, generation, qt = await work.get()
            tp = TopicPartition(m.topic, m.partition)
            if tp not in self.consumer.assignment():
                continue  # its partition went to another of the lane's workers, which reads it again
            try:
                await self.handle(m, qt)
            except Exception:  # not even dead-lettered (the broker refused that too): requeue_ms covers it
                log.exception("lane %s could not handle a task of queue record %s[%s]@%s", self.lane, m.topic,
                              m.partition, m.offset)  # fmt: skip
            await self._commit(tp, self.acks.handled(tp, m.offset, generation))

    async def _commit(self, tp: TopicPartition, done: list[Any]) -> None:
        if not done or self.consumer is None:
            return
        try:
            await self.consumer.commit({tp: OffsetAndMetadata(done[-1].offset + 1, "")})
        except KafkaError as exc:  # in a rebalance: delivered again from the last commit, and skipped then
            log.info("lane %s: commit of %s[%s] at %d not taken (%s)", self.lane, tp.topic, tp.partition,
                     done[-1].offset + 1, exc)  # fmt: skip


class _Rebalanced(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, acks: InOrderAcks) -> None:
        self.acks = acks

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.acks.rebalanced()  # what was taken is delivered again from the commits

    async def on_partitions_assigned(self, assigned: Any) -> None:
        log.info("lane partitions now: %s", sorted(f"{tp.topic}[{tp.partition}]" for tp in assigned))
