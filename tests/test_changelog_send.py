"""The lifecycle's changelog records go to the producer as record batches (streams/context.Context.send_all),
on a real broker: every record lands in its partition in the order given, and the last offset send_all
reports per partition is its last record's (what Faust's changelog recovery reads on from), also where
a partition's records fill several batches and where one record is bigger than a batch."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic
from faust.transport.drivers.aiokafka import Producer as FaustProducer
from taskstream.connectors import kafka
from taskstream.connectors.reading import read_to_end
from taskstream.streams.context import Context

from tests.conftest import Stack
from tests.test_context import _Topic

pytestmark = [pytest.mark.stack, pytest.mark.fallback]


class _Faust:
    """Faust's producer as send_all uses it for changelog records: the aiokafka producer underneath."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer

    def _ensure_producer(self) -> AIOKafkaProducer:
        return self.producer


def test_changelog_batches_land_in_order_and_say_their_last_record_s_offset(stack: Stack) -> None:
    assert callable(getattr(FaustProducer, "_ensure_producer", None))  # what send_all reaches under Faust's
    settings = dataclasses.replace(stack.settings, topic_prefix=f"cl-{uuid.uuid4().hex[:8]}", partitions=2)
    name = settings.topic("tasks-changelog")
    client = kafka.admin(settings)
    client.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    many = [(f"task-{i}".encode(), f"{i}:".encode() + b"x" * 1000) for i in range(60)]  # ~60 KB: 4+ batches
    many[30] = (b"big", b"y" * 40_000)  # bigger than a batch (16 KB) on its own
    many[45] = (b"task-3", None)  # a tombstone
    few = [(b"a", b"1"), (b"b", b"2"), (b"a", b"3")]
    changelog = [(name, 0, k, v) for k, v in many] + [(name, 1, k, v) for k, v in few]

    async def send() -> dict[str, dict[int, int]]:
        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, acks="all", linger_ms=1)
        await producer.start()
        try:
            topics = [_Topic(settings.topic(t)) for t in ("events", "task-inputs", "queue", "dead-letters")]
            ctx = Context(settings, kafka.make_codec(settings), "owner", *topics, producer=_Faust(producer))
            first = await ctx.send_all([], changelog)
            assert first == {name: {0: 59, 1: 2}}
            return await ctx.send_all([], [(name, 1, b"c", b"4")])  # the next batch's records follow on
        finally:
            await producer.stop()

    assert asyncio.run(send()) == {name: {1: 3}}
    reader = kafka.consumer(settings, f"cl-read-{uuid.uuid4().hex[:6]}")
    try:
        got: dict[int, list[tuple[Any, Any]]] = {0: [], 1: []}
        for m in read_to_end(reader, name, {0: 0, 1: 0}, timeout=60):
            got[m.partition()].append((m.key(), m.value()))
        ends = [reader.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1] for p in (0, 1)]
    finally:
        reader.close()
    assert got == {0: many, 1: [*few, (b"c", b"4")]}
    assert ends == [60, 4]
