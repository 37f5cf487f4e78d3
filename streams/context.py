"""What every agent shares: settings, the codec, topic handles and small helpers to write records."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError
from faust.exceptions import ProducerSendError
from taskstream.schemas.codec import Codec
from taskstream.schemas.records import EVENT_HEADER, EventRecord, InputRecord

from taskstream.settings import Settings

log = logging.getLogger(__name__)


def _headers(rec: Any) -> list[tuple[str, bytes]] | None:
    """Events carry their kind in a header, so a consumer can skip what it does not need undecoded."""
    return [(EVENT_HEADER, rec.kind.encode())] if isinstance(rec, EventRecord) else None


def unit_random(*parts: object) -> float:
    """A number in [0, 1) that is a pure function of `parts`: reprocessing an input reproduces it."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


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

    def input(self, task_id: str, at_ms: int, body: Any, input_id: str) -> InputRecord:
        return InputRecord(input_id=input_id, task_id=task_id, sent_ms=at_ms, sender=self.node, body=body)

    async def send_all(self, sends: list[tuple[Any, str, Any]]) -> None:
        """Send (topic, key, record) tuples and wait until every one is durable.

        A failed send is retried, with backoff, until it succeeds: the input that caused it is not
        acknowledged meanwhile, so nothing is lost and the partition waits rather than skips. Resending
        is safe because every record has a deterministic id that readers deduplicate.
        """
        encoded = [
            (topic.get_topic_name(), key.encode(), self.codec.encode(rec), _headers(rec)) for topic, key, rec in sends
        ]
        delay = 0.1
        while True:
            try:
                # Faust's producer underneath the topics: `topic.send` costs ~0.5 ms a record in Faust's
                # channel machinery, which made a 10,000-task admission take 14 s.
                futures = [
                    await self.producer.send(name, key, value, None, None, hdr) for name, key, value, hdr in encoded
                ]
                for fut in futures:
                    await fut
                return
            except (KafkaError, ProducerSendError, OSError) as exc:
                log.warning("send failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

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
