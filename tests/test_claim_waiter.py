"""The claim waiter reads from the broker only the events partitions its worker's lifecycle does not own
(streams/worker.ClaimWaiter), on a real broker: what the lifecycle decides is handed over in-process; a
partition taken over is read to the end it had first; one given away is read again from just after the
lifecycle's last write there, so a verdict the next owner wrote before the waiter noticed is not missed.

Verdicts are written here straight to a topic of the test's own, standing for the owners' writes."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic
from taskstream.connectors.kafka import admin, make_codec
from taskstream.connectors.partitioning import partition_for
from taskstream.schemas import records as r
from taskstream.streams.context import Context, _headers
from taskstream.streams.worker import ClaimWaiter

from taskstream.core import events as e
from tests.conftest import Stack
from tests.test_context import _Topic

pytestmark = [pytest.mark.stack, pytest.mark.fallback]
PARTITIONS = 4


class Owners:
    """Writes verdicts to the test's events topic as task owners would, and says where they landed."""

    def __init__(self, stack: Stack) -> None:
        prefix = f"cw-{uuid.uuid4().hex[:8]}"
        self.settings = dataclasses.replace(stack.settings, topic_prefix=prefix, partitions=PARTITIONS)
        name = self.settings.topic("events")
        client = admin(self.settings)  # kept while its future is waited for
        client.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
        topics = [_Topic(self.settings.topic(t)) for t in ("events", "task-inputs", "queue", "dead-letters")]
        self.ctx = Context(self.settings, make_codec(self.settings), "owner", *topics, producer=None)
        self.producer = Producer({"bootstrap.servers": self.settings.bootstrap})

    def task_on(self, partition: int) -> str:
        return next(t for t in (f"task-{uuid.uuid4().hex[:6]}" for _ in range(1000)) if self.partition(t) == partition)

    def partition(self, task_id: str) -> int:
        return partition_for(task_id.encode(), PARTITIONS)

    def verdict(self, task_id: str, claim_id: str) -> r.EventRecord:
        return self.ctx.event(task_id, "sub", 5, 1000, e.TaskClaimed(1, "w1", claim_id))

    def write(self, rec: r.EventRecord) -> int:
        """Write `rec` to its task's partition; its offset."""
        landed: list[int] = []
        self.producer.produce(
            self.settings.topic("events"),
            self.ctx.codec.encode(rec),
            key=str(rec.task_id).encode(),
            partition=self.partition(str(rec.task_id)),
            headers=_headers(rec),
            on_delivery=lambda err, msg: landed.append(msg.offset()) if err is None else None,
        )
        self.producer.flush(30)
        assert landed, "the verdict was not written"
        return landed[0]


@pytest.fixture
def owners(stack: Stack) -> Any:
    made = Owners(stack)
    yield made
    made.producer.flush(10)
    del made.producer  # its threads stop now, not after the stack is down


async def started(owners: Owners, held: set[int]) -> tuple[ClaimWaiter, asyncio.Task[None]]:
    waiter = ClaimWaiter(owners.ctx, "w1", lambda: frozenset(held))
    task = asyncio.ensure_future(waiter.run())
    await asyncio.wait_for(waiter.ready.wait(), 60)
    return waiter, task


async def until(check: Any, what: str, timeout: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


def reading(waiter: ClaimWaiter) -> set[int]:
    return {tp.partition for tp in waiter.consumer.assignment()}


def test_held_partitions_come_in_process_and_one_given_away_is_read_from_the_last_write(owners: Owners) -> None:
    async def scenario() -> None:
        held: set[int] = set()
        waiter, task = await started(owners, held)
        try:
            assert reading(waiter) == set(range(PARTITIONS)), "nothing held: every partition is read"
            held.update(range(PARTITIONS))
            await until(lambda: not reading(waiter), "every partition left to the lifecycle")

            # written on a held partition, but not by this worker's lifecycle: not read from the broker
            t2 = owners.task_on(1)
            c2 = waiter.expect("c2")
            owners.write(owners.verdict(t2, "c2"))
            await asyncio.sleep(1.0)
            assert not c2.done(), "a held partition is not read from the broker"
            # ... what the lifecycle writes there is handed over as it becomes durable
            v2 = owners.verdict(t2, "c2")
            waiter.written([v2], {1: owners.write(v2)})
            assert c2.done() and c2.result().claim_id == "c2"

            # the partition moves to another worker, which writes a verdict before this waiter notices
            t3 = owners.task_on(1)
            c3 = waiter.expect("c3")
            owners.write(owners.verdict(t3, "c3"))
            held.discard(1)
            await asyncio.wait_for(c3, 20)
            assert reading(waiter) == {1}, "the partition given away is read again; the others are not"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def test_a_partition_taken_over_is_read_to_the_end_it_had_before_it_is_left_to_the_lifecycle(owners: Owners) -> None:
    async def scenario() -> None:
        held: set[int] = set()
        waiter, task = await started(owners, held)
        try:
            t1 = owners.task_on(2)
            c1 = waiter.expect("c1")
            real_end_offsets = waiter.consumer.end_offsets

            async def end_offsets(partitions: Any) -> Any:
                # the earlier owner's last verdict lands just as this worker takes the partition over,
                # before the waiter has fetched it
                owners.write(owners.verdict(t1, "c1"))
                return await real_end_offsets(partitions)

            waiter.consumer.end_offsets = end_offsets
            held.add(2)
            await asyncio.wait_for(c1, 20)
            await until(lambda: reading(waiter) == {0, 1, 3}, "the drained partition left to the lifecycle")
            assert waiter.local[2] >= 1, "its mark is past what it read"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())


def test_a_waiter_whose_worker_holds_nothing_reads_every_partition(owners: Owners) -> None:
    async def scenario() -> None:
        waiter, task = await started(owners, set())
        try:
            claims = {p: waiter.expect(f"c{p}") for p in range(PARTITIONS)}
            for p in range(PARTITIONS):
                owners.write(owners.verdict(owners.task_on(p), f"c{p}"))
            done = await asyncio.wait_for(asyncio.gather(*claims.values()), 20)
            assert [v.claim_id for v in done] == [f"c{p}" for p in range(PARTITIONS)]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
