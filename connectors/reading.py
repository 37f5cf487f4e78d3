"""Reading partitions "to the end", right on both brokers. Every read to the end in taskstream (audit,
replay's snapshots, the cluster view, admission's link index, benches, tests) goes through `read_to_end`.

The end is the partition's end offset when the read starts. For a read_committed consumer that is the
last stable offset (what librdkafka asks the broker for), and it can lie past the last record: a log
that ends on a transaction's commit or abort marker, or on aborted records, has no record at its end
offset minus one. A loop that waits for a record at `end - 1` therefore never ends (`taskstream audit`
hung that way on Kafka after every committed admission). What does reach the end is the consumer's
position: librdkafka moves it past markers and aborted records it skips (measured on Kafka 4.1 and on
noida-db: after a committed two-record transaction at offsets 0-1 the position is 3). So a partition is
done when its position reaches its end offset, whatever the last offsets hold.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition


class ReadTimeout(RuntimeError):
    """A read to the end did not get there in time (the broker is unreachable, or stalled)."""


def end_offsets(consumer: Any, topic: str, partitions: list[int], timeout: float = 10.0) -> dict[int, int]:
    """Each partition's end offset now: the last stable offset for a read_committed consumer."""
    ends = {}
    for p in partitions:
        try:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout, cached=False)
        except KafkaException as exc:
            raise ReadTimeout(f"cannot learn where {topic}[{p}] ends: {exc.args[0].str()}") from exc
        ends[p] = high
    return ends


def read_to_end(
    consumer: Any,
    topic: str,
    starts: dict[int, int],
    *,
    timeout: float = 60.0,
    batch: int = 1000,
    ends: dict[int, int] | None = None,
) -> Iterator[Message]:
    """Every record of `topic` from each partition's start offset (partition -> offset) to the end it had
    when the read began (or `ends`). Assigns the consumer to those partitions and leaves it unassigned.
    Records past the end are not yielded; a start at or past the end yields nothing for that partition."""
    ends = ends if ends is not None else end_offsets(consumer, topic, sorted(starts))
    pending = {p for p, start in starts.items() if start < ends[p]}
    if not pending:
        return
    consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(pending)])
    deadline = time.monotonic() + timeout
    try:
        while pending:
            if time.monotonic() > deadline:
                where = ", ".join(f"{topic}[{p}] up to {ends[p]}" for p in sorted(pending))
                raise ReadTimeout(f"did not read to the end within {timeout:.0f}s: {where}")
            # wait for the first record only, then take what is already fetched: consume(n, t) would wait
            # all of t for fewer than n records, and an assigned consumer spins on noida-db meanwhile
            first = consumer.poll(0.2)
            msgs = [] if first is None else [first, *consumer.consume(batch - 1, 0)]
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(m.partition())
                    continue
                if m.offset() < ends[m.partition()]:
                    yield m
            positions = consumer.position([TopicPartition(topic, p) for p in sorted(pending)])
            for tp in positions:
                if tp.offset is not None and tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
    finally:
        consumer.unassign()


def records_between(consumer: Any, topic: str, partition: int, start: int, end: int, most: int = 10_000) -> int:
    """How many records (not markers) lie in [start, end) of a partition, counting at most `most`: a
    checkpoint behind the end offset by markers only is not behind at all."""
    if end - start > most:
        return end - start  # too far behind to count one by one; offsets are near enough
    n = 0
    for _ in read_to_end(consumer, topic, {partition: start}, ends={partition: end}, timeout=30.0):
        n += 1
    return n
