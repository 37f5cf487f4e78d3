"""Runs one projection: reads the events topic from the projection's own checkpoints and hands it
batches. The projection writes the rows and the new checkpoints in one transaction, so a crash at any
point resumes exactly where the last commit left off (no consumer-group offsets are used).

Bytes that do not decode are copied to the dead-letter topic with the reason in headers and skipped:
a bad record never stalls a partition.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from confluent_kafka import Consumer, Producer, TopicPartition
from taskstream.schemas.codec import Codec, DecodeError
from taskstream.schemas.records import EventRecord

log = logging.getLogger(__name__)
SLOW_BATCH_S = 0.5  # a batch that takes longer is logged with where its time went


@dataclass(frozen=True, slots=True)
class RawRecord:
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Item:
    partition: int
    offset: int
    log_ms: int
    record: EventRecord | RawRecord


@dataclass
class Batch:
    topic: str
    items: list[Item] = field(default_factory=list)
    next_offsets: dict[int, int] = field(default_factory=dict)  # partition -> next offset to read


class Projection(Protocol):
    name: str

    def checkpoints(self, topic: str) -> dict[int, int]: ...

    def apply(self, batch: Batch) -> None: ...

    def close(self) -> None: ...


def dead_letter(producer: Producer, topic: str, msg: Any, reason: str, source: str) -> None:
    headers = [
        ("taskstream.error", reason.encode()[:2000]),
        ("taskstream.source.topic", msg.topic().encode()),
        ("taskstream.source.partition", str(msg.partition()).encode()),
        ("taskstream.source.offset", str(msg.offset()).encode()),
        ("taskstream.detected.by", source.encode()),
    ]
    producer.produce(topic, key=msg.key(), value=msg.value(), headers=headers)


class ProjectionRunner:
    def __init__(
        self,
        projection: Projection,
        consumer: Consumer,
        codec: Codec | None,
        topic: str,
        partitions: int,
        dlq: tuple[Producer, str] | None = None,
        batch_size: int = 2000,
        on_ready: Callable[[], None] | None = None,
        idle: Any = None,
        poll_timeout: float = 0.5,
        linger: float = 0.0,
    ) -> None:
        self.projection = projection
        self.consumer = consumer
        self.codec = codec
        self.topic = topic
        self.partitions = partitions
        self.dlq = dlq
        self.batch_size = batch_size
        self.on_ready = on_ready
        self.stop_event = threading.Event()
        self.assigned = threading.Event()
        self.applied = 0
        self.next: dict[int, int] = {}  # partition -> the next offset to read (checkpoints as applied)
        # what the consumer does while idle (connectors/broker.py::idle): by default, wait in its polls
        self.idle = idle if idle is not None else _Waiting()
        self.poll_timeout = poll_timeout
        # a batch smaller than batch_size waits this long for more records: one transaction per many
        # events instead of per few (at 15 tasks/s the projections' per-transaction cost was half the
        # stack's CPU per task, Neo4j's most of all), at the price of that much more projection lag
        self.linger = linger

    def _assign(self) -> None:
        """Assign every partition at its checkpoint (explicit offsets; the log start where none)."""
        saved = self.projection.checkpoints(self.topic)
        self.next.clear()
        for p in range(self.partitions):
            if p in saved:
                self.next[p] = saved[p]
            else:
                self.next[p] = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[0]
        self._reassign()

    def _reassign(self) -> None:
        self.consumer.assign([TopicPartition(self.topic, p, o) for p, o in sorted(self.next.items())])

    def poll_once(self, timeout: float = 0.2, until: dict[int, int] | None = None) -> int:
        """Apply one batch. With `until` (partition -> offset), records at or past it are left alone."""
        # wait at most `timeout` for the first record, then take what is already fetched: consume(n, t)
        # alone waits the whole t unless n records come, which delayed small batches of big records
        first = self.consumer.poll(timeout)
        if first is None:
            return 0
        t0 = time.monotonic()
        msgs = [first, *self.consumer.consume(self.batch_size - 1, 0)]
        if self.linger and until is None and len(msgs) < self.batch_size:
            msgs.extend(self.consumer.consume(self.batch_size - len(msgs), self.linger))
        big = self.idle.big_batch(msgs)  # then stop fetching while it is applied; resume at `self.next`
        if big:
            self.consumer.unassign()
        batch = Batch(self.topic)
        for m in msgs:
            if m.error():
                log.warning("consumer error on %s: %s", self.topic, m.error())
                continue
            part, offset = cast(int, m.partition()), cast(int, m.offset())
            if until is not None and offset >= until.get(part, 0):
                continue
            batch.next_offsets[part] = offset + 1
            if self.codec is None:  # a raw topic (dead letters): the bytes and headers are the record
                pairs = cast(list[tuple[str, bytes | None]], m.headers() or [])
                headers = {k: (v or b"").decode(errors="replace") for k, v in pairs}
                raw = RawRecord(m.key(), m.value(), headers)
                batch.items.append(Item(part, offset, m.timestamp()[1], raw))
                continue
            try:
                rec = self.codec.decode("event", m.value())
            except DecodeError as err:
                log.error("undecodable record %s[%d]@%d: %s", m.topic(), m.partition(), m.offset(), err.reason)
                if self.dlq:
                    dead_letter(self.dlq[0], self.dlq[1], m, err.reason, f"projection:{self.projection.name}")
                continue
            batch.items.append(Item(part, offset, m.timestamp()[1], rec))  # packed admissions stay packed
        if self.dlq:
            self.dlq[0].flush(10)  # dead letters are durable before the checkpoint moves past them
        if batch.next_offsets:
            t1 = time.monotonic()
            self.projection.apply(batch)
            self.applied += len(batch.items)
            self.next.update(batch.next_offsets)
            t2 = time.monotonic()
            if t2 - t0 > SLOW_BATCH_S:
                log.info(
                    "%s: %d record(s) in %.2fs (read and decode %.2fs, apply %.2fs)",
                    self.projection.name,
                    len(msgs),
                    t2 - t0,
                    t1 - t0,
                    t2 - t1,
                )
        if big:
            self._reassign()
        return len(batch.items)

    def run(self) -> None:
        self._assign()
        self.assigned.set()
        if self.on_ready:
            self.on_ready()
        while not self.stop_event.is_set():
            try:
                n = self.poll_once(self.poll_timeout)
            except Exception:
                # The transaction rolled back; re-seek to the checkpoints and try again after a pause
                # (backpressure, never skipping).
                log.exception("projection %s failed to apply a batch; retrying", self.projection.name)
                self.stop_event.wait(1.0)
                self._assign()
                continue
            if n:
                self.idle.woke()
                continue
            if self.idle.rest(self.next, self.stop_event):  # stopped fetching until a partition has more
                self._reassign()

    def catch_up(self, until: dict[int, int], progress: Callable[[int], None] | None = None) -> None:
        """Apply everything before `until` (partition -> next offset) from the stored checkpoints, then return."""
        self._assign()
        while True:
            done = self.projection.checkpoints(self.topic)
            if all(done.get(p, 0) >= off for p, off in until.items() if off > 0):
                return
            n = self.poll_once(0.5, until)
            if progress and n:
                progress(n)

    def stop(self) -> None:
        self.stop_event.set()


class _Waiting:
    """Idle time spent in the consumer's polls (a broker that holds empty fetches: Kafka)."""

    def rest(self, next_offsets: dict[int, int], stop: threading.Event) -> bool:
        return False

    def woke(self) -> None:
        pass

    def big_batch(self, msgs: list[Any]) -> bool:
        return False
