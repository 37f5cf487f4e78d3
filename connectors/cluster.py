"""What the submitter cluster looks like now, read from the log: members from their heartbeats on the
`admission-members` topic, partition ownership from what each live member says it owns, and the backlog
of each commands partition (commands after the admission group's committed offset: not yet decided,
or decided inside a transaction that has not committed: admissions in flight)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from confluent_kafka import KafkaError, TopicPartition
from taskstream.connectors import kafka

from taskstream.settings import Settings


def _beats(settings: Settings, last: int = 5000) -> dict[str, dict[str, Any]]:
    topic = settings.topic("admission-members")
    c = kafka.consumer(
        settings, f"{settings.topic_prefix}-cluster-view-{uuid.uuid4()}", **{"enable.partition.eof": True}
    )
    newest: dict[str, dict[str, Any]] = {}
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        if high <= low:
            return newest
        c.assign([TopicPartition(topic, 0, max(low, high - last))])
        deadline = time.monotonic() + 15
        done = False
        while not done and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error():
                    done = done or m.error().code() == KafkaError._PARTITION_EOF
                    continue
                try:
                    beat = json.loads(m.value() or b"{}")
                    newest[beat["member"]] = beat
                except (ValueError, KeyError, TypeError):
                    continue
    finally:
        c.close()
    return newest


def describe(settings: Settings) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    timeout = settings.admission_member_timeout_ms
    members = []
    for name, beat in sorted(_beats(settings).items()):
        silent = max(0, now_ms - int(beat.get("at_ms", 0)))  # a member clock slightly ahead reads as 0
        alive = beat.get("state") == "up" and silent <= timeout
        members.append(
            {
                "member": name,
                "alive": alive,
                "state": beat.get("state"),
                "pid": beat.get("pid"),
                "host": beat.get("host"),
                "silent_ms": silent,
                "owned": beat.get("owned", []) if alive else [],
                "in_flight": beat.get("in_flight") if alive else None,
                "decided": beat.get("decided", 0),
                "accepted": beat.get("accepted", 0),
                "rejected": beat.get("rejected", 0),
                "forwarded": beat.get("forwarded", 0),
                "dead_lettered": beat.get("dead_lettered", 0),
                "takeovers": beat.get("takeovers", []),
            }
        )
    owner = {p: m["member"] for m in members if m["alive"] for p in m["owned"]}
    topic = settings.topic("commands")
    group = f"{settings.topic_prefix}-{kafka.ADMISSION_GROUP_SUFFIX}"
    c = kafka.consumer(settings, group)
    partitions = []
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
        committed = {tp.partition: tp.offset for tp in c.committed(tps, timeout=10)}
        for p in range(settings.partitions):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            done = committed.get(p, -1)
            done = done if done >= 0 else low
            partitions.append(
                {"partition": p, "owner": owner.get(p), "committed": done, "end": high, "backlog": max(0, high - done)}
            )
    finally:
        c.close()
    return {"members": members, "partitions": partitions, "member_timeout_ms": timeout}
