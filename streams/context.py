"""What every agent shares: settings, the codec, topic handles and small helpers to write records."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from faust.exceptions import ProducerSendError
from taskstream.connectors.kafka import lane_topic
from taskstream.connectors.partitioning import partition_for
from taskstream.connectors.table_state import ChangelogRecord
from taskstream.schemas.codec import Codec
from taskstream.schemas.records import (
    EVENT_HEADER,
    KINDS_HEADER,
    EventRecord,
    InputRecord,
    QueuedTask,
    TaskEvents,
    pack,
    pack_inputs,
    pack_queued,
)

from taskstream.settings import Settings

log = logging.getLogger(__name__)
PACK_MAX_EVENTS = 1_000  # events per TaskEvents record (and tasks per queue record) at most ...
PACK_MAX_BYTES = 256 * 1024  # ... and about this many bytes: far under the producer's 1 MB request limit
PARTITIONS_KEPT = 200_000  # task id -> partition, remembered (a task's id is written a dozen times)


def _headers(rec: Any) -> list[tuple[str, bytes]] | None:
    """Events carry their kind in a header, so a consumer can skip what it does not need undecoded; a
    packed TaskEvents also the kinds of its members (KINDS_HEADER, comma-separated)."""
    if not isinstance(rec, EventRecord):
        return None
    if type(rec.payload) is TaskEvents:
        kinds = sorted({type(m.payload).__name__ for m in rec.payload.events})
        return [(EVENT_HEADER, b"TaskEvents"), (KINDS_HEADER, ",".join(kinds).encode())]
    return [(EVENT_HEADER, rec.kind.encode())]


def chunks(recs: list[Any], weight: Any) -> list[list[Any]]:
    """Records in order, in runs of at most PACK_MAX_EVENTS and about PACK_MAX_BYTES (by `weight`)."""
    out: list[list[Any]] = []
    chunk: list[Any] = []
    size = 0
    for rec in recs:
        w = weight(rec)
        if chunk and (len(chunk) >= PACK_MAX_EVENTS or size + w > PACK_MAX_BYTES):
            out.append(chunk)
            chunk, size = [], 0
        chunk.append(rec)
        size += w
    if chunk:
        out.append(chunk)
    return out


def text_weight(body: Any) -> int:
    """About how many bytes an event's payload or an input's body takes: an output tail and a reason
    are what can make one big."""
    return 200 + len(getattr(body, "output_tail", "")) + len(getattr(body, "reason", ""))


def _spec_weight(q: QueuedTask) -> int:
    """About how many bytes a queue record's task takes: its spec's strings are what can make it big."""
    spec = q.spec
    env = sum(len(k) + len(v) for k, v in spec.env.items())
    call = len(spec.call.args_json) + len(spec.call.kwargs_json) if spec.call is not None else 0
    return 300 + sum(len(a) for a in spec.argv) + env + call + sum(len(d) for d in spec.dependencies)


def unit_random(*parts: object) -> float:
    """A number in [0, 1) that is a pure function of `parts`: reprocessing an input reproduces it."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class LaneTopic:
    """The queue topic of a lane other than the default one, sent to by name (Context.send_all)."""

    name: str

    def get_topic_name(self) -> str:
        return self.name


@dataclass
class Context:
    settings: Settings
    codec: Codec
    node: str
    events: Any  # faust topics
    inputs: Any
    queue: Any
    dead_letters: Any
    producer: Any  # the app's producer (faust.transport Producer)
    commands: Any = None  # the commands topic: what schedules submit goes there, as any submission

    def event(
        self,
        task_id: str | None,
        submission_id: str,
        version: int,
        at_ms: int,
        payload: Any,
        event_id: str | None = None,
    ) -> EventRecord:
        return EventRecord(
            event_id=event_id or f"{task_id}:{version}",
            task_id=task_id,
            submission_id=submission_id,
            version=version,
            event_ms=at_ms,
            node=self.node,
            payload=payload,
        )

    def now_ms(self) -> int:
        """This node's clock, epoch ms, with the injected skew (Settings.clock_offset_ms)."""
        return int(time.time() * 1000) + self.settings.clock_offset_ms

    def input(self, task_id: str, at_ms: int, body: Any, input_id: str) -> InputRecord:
        return InputRecord(input_id=input_id, task_id=task_id, sent_ms=at_ms, sender=self.node, body=body)

    def __post_init__(self) -> None:
        self._partitions: dict[str, int] = {}
        self._own_topics = {self.settings.topic(t) for t in ("events", "task-inputs", "queue")}
        self._lanes: dict[str, Any] = {self.settings.lane: self.queue}
        self._lane_producer: AIOKafkaProducer | None = None
        self._lane_producer_lock = asyncio.Lock()
        self._lane_topics_tracked: set[str] = set()

    async def _lanes_producer(self, topic: str) -> AIOKafkaProducer:
        """The producer of the queue topics of lanes other than the default one, tracking `topic`. Not
        the app's: an aiokafka client that is sent a record for a topic its metadata lacks (a lane's
        topic made after it started) fetches the metadata of the topics it was sent to that way and of
        no other from then on, and the partitions of the rest lose their leaders at the next refresh,
        so their records wait for good (measured: every worker's decisions stopped once a lane was
        added). Here only lane topics are written, and each is tracked before its first record."""
        async with self._lane_producer_lock:
            if self._lane_producer is None:
                producer = AIOKafkaProducer(bootstrap_servers=self.settings.bootstrap, acks="all", linger_ms=1)
                await producer.start()
                self._lane_producer = producer
            if topic not in self._lane_topics_tracked:
                await self._lane_producer.client.add_topic(topic)
                self._lane_topics_tracked.add(topic)
        return self._lane_producer

    def queue_for(self, lane: str) -> Any:
        """The queue topic of a lane (connectors/kafka.py `lane_topic`): the default lane's is `queue`."""
        topic = self._lanes.get(lane)
        if topic is None:
            topic = self._lanes[lane] = LaneTopic(lane_topic(self.settings, lane))
            self._own_topics.add(topic.name)  # co-partitioned like the others
        return topic

    def partition(self, key: str) -> int:
        """The partition of a task's records on events, task-inputs and the queue (co-partitioned, the
        default partitioner's choice): worked out once per task, not once per record by the producer."""
        p = self._partitions.get(key)
        if p is None:
            if len(self._partitions) >= PARTITIONS_KEPT:
                self._partitions.clear()
            p = self._partitions[key] = partition_for(key.encode(), self.settings.partitions)
        return p

    def packed(self, sends: list[tuple[Any, str, Any]]) -> list[tuple[Any, str, Any]]:
        """The same sends with the task events of each partition packed into TaskEvents records (in the
        order they were decided), and its queue records into one QueuedTask standing for all of them,
        where a partition has more than one; everything else as it was. A reader sees each task's
        events, and the queue's tasks, in the same order either way (`records.task_events`,
        `records.queued_tasks`)."""
        events: dict[int, list[EventRecord]] = {}
        queued: dict[tuple[Any, int], list[QueuedTask]] = {}  # (lane's topic, partition) -> its tasks
        out: list[tuple[Any, str, Any]] = []
        for send in sends:
            topic, key, rec = send
            if topic is self.events and type(rec) is EventRecord and rec.task_id is not None and rec.version > 0:
                events.setdefault(self.partition(key), []).append(rec)
            elif type(rec) is QueuedTask and not rec.also and topic is self._lanes.get(rec.lane):
                queued.setdefault((topic, self.partition(key)), []).append(rec)
            else:
                out.append(send)
        for recs in events.values():
            if len(recs) == 1:
                out.append((self.events, str(recs[0].task_id), recs[0]))
                continue
            for chunk in chunks(recs, lambda ev: text_weight(ev.payload)):
                out.append((self.events, str(chunk[0].task_id), pack(chunk, self.node)))
        for (topic, _), qs in queued.items():
            for chunk in chunks(qs, _spec_weight):
                out.append((topic, chunk[0].task_id, chunk[0] if len(chunk) == 1 else pack_queued(chunk)))
        return out

    def inputs_packed(self, recs: list[InputRecord]) -> list[tuple[Any, str, Any]]:
        """Sends of task inputs, those of one partition in one record (records.Inputs), in order: each
        record costs its owner a delivery through Faust's machinery."""
        groups: dict[int, list[InputRecord]] = {}
        for rec in recs:
            groups.setdefault(self.partition(rec.task_id), []).append(rec)
        sends = []
        for group in groups.values():
            for chunk in chunks(group, lambda rec: text_weight(rec.body)):
                one = chunk[0] if len(chunk) == 1 else pack_inputs(chunk, self.node)
                sends.append((self.inputs, chunk[0].task_id, one))
        return sends

    async def send_all(
        self, sends: list[tuple[Any, str, Any]], changelog: list[ChangelogRecord] | None = None
    ) -> dict[str, dict[int, int]]:
        """Send (topic, key, record) tuples, and `changelog` records (connectors/table_state.py), and wait
        until every one is durable; the last offset written per topic and partition (of the records and
        of the changelog).

        All are handed to the producer before any is awaited, so they leave in one request to the
        broker: a batch's events and the state that says they were decided land together or not at all
        (a worker killed between the two had left its events without their state, and the next owner
        decided the same input again; with a claim the owner took for its own worker, differently).
        A failed send is retried, with backoff, until it succeeds: the input that caused it is not
        acknowledged meanwhile, so nothing is lost and the partition waits rather than skips. Resending
        is safe because every record has a deterministic id that readers deduplicate, and a changelog
        record written twice holds the same value for its key (a batch's state is never written while an
        earlier batch's is still on its way: the lifecycle waits for each)."""
        own = self._own_topics
        encoded = [
            (
                topic.get_topic_name(),
                key.encode(),
                self.codec.encode(rec),
                _headers(rec),
                self.partition(key) if topic.get_topic_name() in own else None,
            )
            for topic, key, rec in sends
        ]
        delay = 0.1
        while True:
            try:
                # Faust's producer underneath the topics: `topic.send` costs ~0.5 ms a record in Faust's
                # channel machinery, which made a 10,000-task admission take 14 s.
                futures = []
                for (topic, _, _), (name, key, value, hdr, part) in zip(sends, encoded, strict=True):
                    if type(topic) is LaneTopic:
                        lanes = await self._lanes_producer(name)
                        futures.append(await lanes.send(name, value, key=key, partition=part, headers=hdr))
                    else:
                        futures.append(await self.producer.send(name, key, value, part, None, hdr))
                batches = await self._send_changelog(changelog or ())
                last: dict[str, dict[int, int]] = {}
                for fut, count in [(f, 1) for f in futures] + batches:
                    meta = await fut
                    if meta is not None:  # (None: acks=0, nothing to know)
                        parts = last.setdefault(meta.topic, {})
                        # a batch's future says its first record's offset; its records follow in order
                        parts[meta.partition] = max(parts.get(meta.partition, -1), meta.offset + count - 1)
                return last
            except (KafkaError, ProducerSendError, OSError) as exc:
                log.warning("send failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _send_changelog(self, changelog: Iterable[ChangelogRecord]) -> list[tuple[Any, int]]:
        """Hand the changelog records to the producer as record batches, one or more per topic and
        partition (one future each, with its count of records), instead of one send per record: a
        lifecycle batch writes ~4 changelog records a task, and a send cost ~10 us of the worker's event
        loop a record (Faust's send, aiokafka's, a future of its own), a batch's append ~1 us."""
        by_partition: dict[tuple[str, int], list[tuple[bytes, bytes | None]]] = {}
        for topic, partition, key, value in changelog:
            by_partition.setdefault((topic, partition), []).append((key, value))
        if not by_partition:
            return []
        producer = self.producer._ensure_producer()  # aiokafka's, under Faust's
        out: list[tuple[Any, int]] = []
        for (topic, partition), records in by_partition.items():
            batch, count = producer.create_batch(), 0
            for key, value in records:
                if batch.append(key=key, value=value, timestamp=None) is None:  # full: it goes, another starts
                    out.append((await producer.send_batch(batch, topic, partition=partition), count))
                    batch, count = producer.create_batch(), 0
                    batch.append(key=key, value=value, timestamp=None)  # an empty batch takes any record
                count += 1
            out.append((await producer.send_batch(batch, topic, partition=partition), count))
        return out

    async def dead_letter(self, message: Any, reason: str, detected_by: str) -> None:
        headers = [
            ("taskstream.error", reason.encode()[:2000]),
            ("taskstream.source.topic", str(message.topic).encode()),
            ("taskstream.source.partition", str(message.partition).encode()),
            ("taskstream.source.offset", str(message.offset).encode()),
            ("taskstream.detected.by", detected_by.encode()),
        ]
        fut = await self.dead_letters.send(key=message.key, value=message.value, headers=headers)
        await fut
