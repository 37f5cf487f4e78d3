"""Who owns which commands partition in the submitter cluster, and under which transactional id.

On Apache Kafka ownership is Kafka's own consumer-group protocol (`GroupOwnership`): the group
coordinator assigns the commands partitions among the admission workers (cooperative-sticky, so a
death moves only the dead member's partitions) and expires a silent member after the session timeout
(`TASKSTREAM_ADMISSION_MEMBER_TIMEOUT_MS`). Each partition is written under one stable transactional id
(`<prefix>-admission-p<N>`): the new owner's init_transactions aborts the previous owner's open
transaction and fences it, before the new owner reads the committed offset, so a dead or stalled owner
can never commit into a partition someone else has taken. On noida-db, which never expires a dead
member's session, the cluster keeps its own membership instead (connectors/noida.py).

Either way every member publishes its state (partitions, the batch in flight, counts) as heartbeats
on the `admission-members` topic, which `taskstream cluster` shows (`StatusBeats`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any, Protocol

from confluent_kafka import Consumer, Message, TopicPartition
from taskstream.connectors import kafka

from taskstream.settings import Settings

log = logging.getLogger("taskstream.admission")


class Owner(Protocol):
    """What the admitter offers an ownership: take a partition (fence it, load its state) and return the
    offset to read it from; let one go."""

    member: str

    def acquire(self, p: int) -> int: ...

    def release(self, p: int, why: str) -> None: ...


class Ownership(Protocol):
    consumer: Consumer
    settled: threading.Event

    def start(self) -> None: ...

    def take(self, most: int, stop: threading.Event) -> list[Message]: ...

    def transactional_id(self, p: int) -> str: ...

    def fence(self, p: int, make_producer: Any) -> None: ...

    def previous_owner(self, p: int) -> str | None: ...

    def heard_from(self, member: str) -> float | None: ...

    def abandoned(self, member: str, p: int) -> bool: ...

    def seek(self, p: int, offset: int) -> None: ...

    def done(self, p: int, next_offset: int) -> None: ...

    def give_up(self, p: int, why: str) -> None: ...

    def beat(self) -> None: ...

    def close(self) -> None: ...


class StatusBeats:
    """A member's heartbeats on the `admission-members` topic (one partition, JSON): who it is, that it
    is up, and `state()` (what it owns, what it is doing), every `admission_heartbeat_ms`."""

    def __init__(self, settings: Settings, member: str, state: Any) -> None:
        self.s = settings
        self.member = member
        self.state = state  # callable -> dict merged into each heartbeat
        self.topic = settings.topic("admission-members")
        self.producer = kafka.producer(settings, **{"linger.ms": 0})
        self.stop = threading.Event()
        self.sender = threading.Thread(target=self._send, name="membership-sender", daemon=True)

    def start(self) -> None:
        self.beat()
        self.sender.start()

    def beat(self, leaving: bool = False, flush: bool = False) -> None:
        value = {
            "member": self.member,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "at_ms": int(time.time() * 1000),
            "state": "left" if leaving else "up",
            **self.state(),
        }
        self.producer.produce(self.topic, key=self.member.encode(), value=json.dumps(value).encode(), partition=0)
        if flush:
            self.producer.flush(10)
        else:
            self.producer.poll(0)

    def _send(self) -> None:
        interval = self.s.admission_heartbeat_ms / 1000
        while not self.stop.wait(interval):
            self.beat()

    def close(self) -> None:
        self.stop.set()
        self.sender.join(5)
        self.beat(leaving=True)
        self.producer.flush(5)


def latest_beats(
    settings: Settings, within_ms: int, topic_key: str = "admission-members", key: str = "member"
) -> dict[str, dict[str, Any]]:
    """Each member's newest heartbeat among those of the last `within_ms` (by log time), on a one-
    partition JSON topic (the submitter cluster's, or the scheduler workers' adverts: `workers`, key
    `worker`)."""
    from taskstream.connectors.reading import read_to_end

    topic = settings.topic(topic_key)
    reader = kafka.consumer(settings, f"{settings.topic_prefix}-beats-{os.getpid()}")
    newest: dict[str, dict[str, Any]] = {}
    try:
        since = int(time.time() * 1000) - within_ms
        found = reader.offsets_for_times([TopicPartition(topic, 0, since)], timeout=10)[0].offset
        if found < 0:
            return newest
        for m in read_to_end(reader, topic, {0: found}, timeout=10):
            try:
                beat = json.loads(m.value() or b"{}")
                newest[str(beat[key])] = beat
            except (ValueError, KeyError, TypeError):
                continue
    finally:
        reader.close()
    return newest


class GroupOwnership:
    """The commands partitions as Kafka's group coordinator assigns them (see the module docstring)."""

    def __init__(self, settings: Settings, owner: Owner, state: Any) -> None:
        self.s = settings
        self.owner = owner
        self.topic = settings.topic("commands")
        self.consumer = kafka.consumer(
            settings,
            f"{settings.topic_prefix}-{kafka.ADMISSION_GROUP_SUFFIX}",
            **{
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": settings.admission_member_timeout_ms,
                "heartbeat.interval.ms": settings.admission_heartbeat_ms,
                "client.id": owner.member,
            },
        )
        self.beats = StatusBeats(settings, owner.member, state)
        self.owned: set[int] = set()
        self.settled = threading.Event()
        self._beats: dict[str, dict[str, Any]] = {}

    def start(self) -> None:
        self.beats.start()
        self.consumer.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost)

    # -- the group's callbacks (run inside poll, on the admitter's thread, between batches) ------------
    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        start = []
        for tp in partitions:
            start.append(TopicPartition(self.topic, tp.partition, self.owner.acquire(tp.partition)))
            self.owned.add(tp.partition)
        consumer.incremental_assign(start)
        consumer.resume(start)  # one given up after a fence, and now given back
        self.settled.set()  # it has been given its share, possibly none
        self.beats.beat()

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._drop(partitions, "the group gave it to another member")
        consumer.incremental_unassign(partitions)

    def _lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._drop(partitions, "lost: this member's session expired")
        consumer.incremental_unassign(partitions)

    def _drop(self, partitions: list[TopicPartition], why: str) -> None:
        for tp in partitions:
            if tp.partition in self.owned:
                self.owned.discard(tp.partition)
                self.owner.release(tp.partition, why)
        self.beats.beat(flush=True)  # landed before the group moves the partitions: see abandoned()

    # -- what the admitter asks ------------------------------------------------------------------------
    def transactional_id(self, p: int) -> str:
        return f"{self.s.topic_prefix}-admission-p{p}"

    def fence(self, p: int, make_producer: Any) -> None:
        """Nothing more to do: the new owner's producer initialises the partition's one transactional id."""

    def previous_owner(self, p: int) -> str | None:
        """Who said last that it owned p (read from the recent heartbeats), for the takeover record."""
        self._beats = latest_beats(self.s, self.s.admission_member_timeout_ms * 10)
        owners = [b for m, b in self._beats.items() if m != self.owner.member and p in (b.get("owned") or [])]
        return max(owners, key=lambda b: b.get("at_ms", 0))["member"] if owners else None

    def heard_from(self, member: str) -> float | None:
        beat = self._beats.get(member)
        return None if beat is None else max(0.0, time.time() - beat.get("at_ms", 0) / 1000)

    def abandoned(self, member: str, p: int) -> bool:
        """Did `member` lose p without letting it go? A member gives a partition up in its revocation
        callback and says so in a heartbeat that lands before the callback returns (`_drop`), and the
        coordinator assigns p to no one else before that callback has run, unless the member's session
        expired. So a newest heartbeat that still lists p means the member died or stalled holding it.
        (Comparing its silence with the session timeout instead raced the two heartbeat timers: the
        status beat can be up to an interval younger than the group heartbeat the coordinator went by.)"""
        return p in (self._beats.get(member, {}).get("owned") or [])

    def seek(self, p: int, offset: int) -> None:
        self.consumer.seek(TopicPartition(self.topic, p, offset))

    def take(self, most: int, stop: threading.Event) -> list[Message]:
        """The next commands of the owned partitions; the group's callbacks run in here. The broker holds
        the fetch until records arrive (fetch.wait.max.ms), so an idle member costs nothing."""
        first = self.consumer.poll(0.5)
        if first is None:
            return []
        return [first, *self.consumer.consume(most - 1, 0)]

    def done(self, p: int, next_offset: int) -> None:
        """The consumer's own position is already past the batch."""

    def give_up(self, p: int, why: str) -> None:
        """Fenced: another member holds the partition's transactional id, so the group has moved it or is
        about to. Stop reading it; the revocation that follows finds nothing left to release."""
        if p in self.owned:
            self.owned.discard(p)
            self.consumer.pause([TopicPartition(self.topic, p)])
            self.owner.release(p, why)

    def beat(self) -> None:
        self.beats.beat()

    def close(self) -> None:
        self.consumer.close()  # leaves the group: the revocation releases every owned partition
        self.beats.close()
