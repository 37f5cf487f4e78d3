"""What the submitter cluster looks like now, read from the broker: each admission worker's state from
its heartbeats on the `admission-members` topic; who is alive and who owns which commands partition from
the admission consumer group (on Kafka: the group coordinator's answer) or, on noida-db, from what each
live member says it owns; and the backlog of each commands partition (commands after the admission
group's committed offset: not yet decided, or decided inside a transaction that has not committed)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from confluent_kafka import ConsumerGroupState, TopicPartition
from taskstream.connectors import broker, kafka
from taskstream.connectors.reading import read_to_end, records_between

from taskstream.settings import Settings


def _beats(settings: Settings, last: int = 5000) -> dict[str, dict[str, Any]]:
    topic = settings.topic("admission-members")
    c = kafka.consumer(settings, f"{settings.topic_prefix}-cluster-view-{uuid.uuid4()}")
    newest: dict[str, dict[str, Any]] = {}
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        for m in read_to_end(c, topic, {0: max(low, high - last)}, timeout=15):
            try:
                beat = json.loads(m.value() or b"{}")
                newest[beat["member"]] = beat
            except (ValueError, KeyError, TypeError):
                continue
    finally:
        c.close()
    return newest


def group_members(settings: Settings) -> dict[str, list[int]] | None:
    """The admission group's members (their client ids, which are the member names) and the commands
    partitions the coordinator gave each; None where the broker's groups are not used (noida-db)."""
    if not broker.of(settings).expires_dead_members:
        return None
    group = f"{settings.topic_prefix}-{kafka.ADMISSION_GROUP_SUFFIX}"
    client = kafka.admin(settings)  # kept referenced until the answer is in: its futures die with it
    desc = client.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    out: dict[str, list[int]] = {}
    if desc.state in (ConsumerGroupState.DEAD, ConsumerGroupState.EMPTY):
        return out
    topic = settings.topic("commands")
    for m in desc.members:
        parts = [tp.partition for tp in (m.assignment.topic_partitions if m.assignment else []) if tp.topic == topic]
        out[m.client_id] = sorted(parts)
    return out


def describe(settings: Settings) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    timeout = settings.admission_member_timeout_ms
    in_group = group_members(settings)
    beats = _beats(settings)
    for name in in_group or {}:
        beats.setdefault(name, {"member": name, "state": "up"})
    members = []
    for name, beat in sorted(beats.items()):
        silent = max(0, now_ms - int(beat.get("at_ms", 0)))  # a member clock slightly ahead reads as 0
        if in_group is None:
            alive = beat.get("state") == "up" and silent <= timeout
            owned = beat.get("owned", []) if alive else []
        else:  # the coordinator's view: a member is alive until its session expires
            alive = name in in_group
            owned = in_group.get(name, [])
        members.append(
            {
                "member": name,
                "alive": alive,
                "state": beat.get("state"),
                "pid": beat.get("pid"),
                "host": beat.get("host"),
                "silent_ms": silent,
                "owned": owned,
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
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
            done = committed.get(p, -1)
            done = done if done >= 0 else low
            # commands forwarded by admission transactions leave markers: count records, not offsets
            backlog = records_between(c, topic, p, done, high) if high > done else 0
            partitions.append(
                {"partition": p, "owner": owner.get(p), "committed": done, "end": high, "backlog": backlog}
            )
    finally:
        c.close()
    ownership = "the consumer group" if in_group is not None else "the members' heartbeats"
    return {"members": members, "partitions": partitions, "member_timeout_ms": timeout, "ownership": ownership}
