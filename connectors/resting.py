"""Keeping idle librdkafka consumers off a broker that answers empty fetches at once (noida-db).

An assigned librdkafka consumer fetches again as soon as an answer comes back; noida-db ignores the
fetch wait and answers an empty fetch at once, so every idle assigned consumer spins (an idle embedded
stack spent ~80% of its two cores this way, most of it in the broker: docs/measurements.md). pause and
resume restarted fetching late or never on noida-db, so an idle consumer is unassigned instead, and asks
for the partitions' end offsets (one request per partition, at a growing interval) until one has
records past where it is; then it is assigned again at explicit offsets.

Where it is: the consumer's position, which librdkafka moves past transaction markers and aborted
records it skipped (measured), so a partition whose last records were a commit marker is not taken for
one with records to read.
"""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

BIG_BATCH_BYTES = 256 * 1024  # records worth unassigning the consumer for while they are worked on


def worth_unassigning(msgs: list[Any]) -> bool:
    """Is this batch big enough to stop fetching while it is decoded and handled? An assigned consumer
    keeps refetching from noida-db meanwhile: ~0.27 s of CPU beside a 10,000-task admission's 0.4 s
    (measured). The caller assigns again at its tracked offsets afterwards."""
    return sum(len(m.value() or b"") for m in msgs) > BIG_BATCH_BYTES


class Resting:
    def __init__(self, consumer: Any, topic: str, first: float = 0.005, ceiling: float = 0.1) -> None:
        self.consumer = consumer
        self.topic = topic
        self.first = first
        self.ceiling = ceiling
        self._pause = first

    def settle(self, next_offsets: dict[int, int]) -> None:
        """Move each partition's next offset up to the consumer's position (call while still assigned)."""
        try:
            positions = self.consumer.position([TopicPartition(self.topic, p) for p in next_offsets])
        except KafkaException:
            return
        for tp in positions:
            if tp.offset is not None and tp.offset > next_offsets.get(tp.partition, tp.offset):
                next_offsets[tp.partition] = tp.offset

    def behind(self, next_offsets: dict[int, int]) -> bool:
        """Does any partition have records at or past its next offset? (Unknown counts as yes.)"""
        for p, offset in next_offsets.items():
            try:
                _, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5, cached=False)
            except KafkaException:
                return True
            if high > offset:
                return True
        return False

    def pause(self) -> float:
        """How long to wait before looking again: doubles from `first` up to `ceiling` while idle."""
        pause = self._pause
        self._pause = min(self.ceiling, self._pause * 2)
        return pause

    def woke(self) -> None:
        """Records arrived: the next idle spell starts with short pauses again."""
        self._pause = self.first

    def rest(self, next_offsets: dict[int, int], stop: threading.Event) -> None:
        """Settle, unassign, and return once a partition has records past its next offset (or on stop).
        The caller assigns again at `next_offsets`."""
        self.settle(next_offsets)
        self.consumer.unassign()
        while not stop.wait(self.pause()):
            if self.behind(next_offsets):
                return
