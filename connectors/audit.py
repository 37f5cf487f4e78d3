"""Reading one task's history straight from the events topic (the system of record)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import TopicPartition
from taskstream.connectors.kafka import consumer, make_codec
from taskstream.connectors.partitioning import partition_for
from taskstream.connectors.reading import read_to_end
from taskstream.schemas.codec import DecodeError
from taskstream.schemas.records import EVENT_HEADER, PACKED_KINDS, EventRecord, task_events

from taskstream.settings import Settings


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _details(payload: Any) -> str:
    fields = {f.name: getattr(payload, f.name) for f in dataclasses.fields(payload)}
    if "spec" in fields:
        spec = fields.pop("spec")
        fields["argv"] = list(spec.argv)
        fields["dependencies"] = len(spec.dependencies)
    if "output_tail" in fields:
        fields["output_tail"] = fields["output_tail"].strip()[-120:]
    return ", ".join(f"{k}={v}" for k, v in fields.items())


def describe(rec: EventRecord, msg: Any) -> dict[str, Any]:
    """One event as a flat row for people and scripts: what, when (event and log time), by whom, why."""
    return {
        "version": rec.version,
        "event": rec.kind,
        "task_id": rec.task_id,
        "submission_id": rec.submission_id,
        "event_time": _when(rec.event_ms),
        "log_time": _when(msg.timestamp()[1]),
        "node": rec.node,
        "details": _details(rec.payload),
        "partition": msg.partition(),
        "offset": msg.offset(),
        "event_id": rec.event_id,
    }


def task_history(settings: Settings, task_id: str) -> list[dict[str, Any]]:
    codec = make_codec(settings, wait_s=5)
    topic = settings.topic("events")
    part = partition_for(task_id.encode(), settings.partitions)
    c = consumer(settings, group=f"taskstream-audit-{task_id}")
    try:
        low, _ = c.get_watermark_offsets(TopicPartition(topic, part), timeout=10)
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        # to the partition's end as it is now, also when the log ends on a transaction marker
        for m in read_to_end(c, topic, {part: low}, timeout=120):
            # a task's events may be packed with others' (TasksAdmitted, TaskEvents) under the first one's key
            packed = dict(m.headers() or ()).get(EVENT_HEADER, b"").decode() in PACKED_KINDS
            if m.key() != task_id.encode() and not packed:
                continue
            try:
                rec = codec.decode("event", m.value())
            except DecodeError as exc:
                out.append(
                    {
                        "version": "?",
                        "event": "UNDECODABLE",
                        "event_time": "",
                        "log_time": _when(m.timestamp()[1]),
                        "node": "",
                        "details": exc.reason,
                        "offset": m.offset(),
                    }
                )
                continue
            for ev in task_events(rec):
                if ev.task_id != task_id:
                    continue
                dup = ev.event_id in seen
                seen.add(ev.event_id)
                out.append(
                    {
                        "version": ev.version,
                        "event": ev.kind + (" (duplicate delivery)" if dup else ""),
                        "submission_id": ev.submission_id,
                        "event_time": _when(ev.event_ms),
                        "log_time": _when(m.timestamp()[1]),
                        "node": ev.node,
                        "details": _details(ev.payload),
                        "offset": m.offset(),
                        "partition": part,
                        "event_id": ev.event_id,
                    }
                )
        return out
    finally:
        c.close()
