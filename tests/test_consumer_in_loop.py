"""Faust's consumer on the worker's own event loop (connectors/faust_patches.consumer_in_loop), on a real
broker: a Faust worker with the patch delivers a topic's records in order, commits past them, starts
no thread of its own for the consumer, and closes the consumer when it stops. Everything else the
worker does through it (rebalances, a SIGKILLed or frozen worker, draining) is in the stack's tests,
whose workers run with the patch."""

from __future__ import annotations

import asyncio
import io
import threading
import uuid
from pathlib import Path

import faust
import pytest
from aiokafka import TopicPartition
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic
from taskstream.connectors import kafka
from taskstream.connectors.faust_patches import consumer_in_loop

from tests.conftest import Stack

pytestmark = [pytest.mark.stack, pytest.mark.fallback]


def test_faust_s_consumer_runs_on_the_worker_s_loop_delivers_in_order_and_commits(stack: Stack, tmp_path: Path) -> None:
    consumer_in_loop()
    consumer_in_loop()  # twice changes nothing
    settings = stack.settings
    name = f"inloop-{uuid.uuid4().hex[:8]}"
    admin = kafka.admin(settings)
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    sent = [f"record-{i}".encode() for i in range(7)]
    producer = Producer({"bootstrap.servers": settings.bootstrap})
    for value in sent:
        producer.produce(name, key=b"k", value=value)
    assert producer.flush(30) == 0

    async def run() -> tuple[list[bytes], set[str], bool, object, bool]:
        app = faust.App(
            f"inloop-{uuid.uuid4().hex[:8]}",
            broker=f"kafka://{settings.bootstrap}",
            store="memory://",
            web_enabled=False,
            datadir=str(tmp_path),
            topic_partitions=1,
            consumer_auto_offset_reset="earliest",
            broker_commit_every=1,
        )
        topic = app.topic(name, key_serializer="raw", value_serializer="raw", partitions=1)
        got: list[bytes] = []
        all_in = asyncio.Event()

        @app.agent(topic)
        async def collect(stream: faust.StreamT[bytes]) -> None:
            async for value in stream:
                got.append(value)
                if len(got) == len(sent):
                    all_in.set()

        before = {t.ident for t in threading.enumerate()}
        worker = faust.Worker(
            app,
            loop=asyncio.get_running_loop(),
            quiet=True,
            loglevel="WARNING",
            redirect_stdouts=False,
            stdout=io.StringIO(),  # Faust's terminal spinner writes there, also at exit
        )
        running = asyncio.ensure_future(worker.start())  # returns once the worker has stopped
        try:
            await asyncio.wait_for(all_in.wait(), 60)
            delegate = app.consumer._thread
            threads = {type(t).__name__ for t in threading.enumerate() if t.ident not in before}
            on_this_loop = delegate.thread_loop is asyncio.get_running_loop() and delegate._thread is None
            committed = None
            for _ in range(100 if on_this_loop else 0):  # Faust commits every broker_commit_interval (2.8 s by default)
                committed = await delegate._ensure_consumer().committed(TopicPartition(name, 0))
                if committed == len(sent):
                    break
                await asyncio.sleep(0.1)
        finally:
            await worker.stop()
            await asyncio.wait_for(running, 60)
        return got, threads, on_this_loop, committed, delegate._ensure_consumer()._closed

    got, threads, on_this_loop, committed, closed = asyncio.run(run())
    assert got == sent
    assert on_this_loop, "the consumer is driven by the worker's own loop, not a thread's"
    assert "WorkerThread" not in threads, f"no thread of mode's was started for the consumer: {threads}"
    assert committed == len(sent), "the offsets committed through the in-loop consumer"
    assert closed
