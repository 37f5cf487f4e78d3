"""Projection lag: for each projection and partition, its checkpoint against the log's end."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from confluent_kafka import TopicPartition
from taskstream.connectors.kafka import consumer
from taskstream.connectors.reading import end_offsets, records_between

from taskstream.settings import Settings


@dataclass(frozen=True)
class Lag:
    projection: str
    partition: int
    checkpoint: int | None  # None: the projection has applied nothing from this partition
    log_end: int
    behind: int  # records after the checkpoint (a log ending on transaction markers is not behind)


def pg_checkpoints(dsn: str, topic: str, projection: str = "pg") -> dict[int, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT partition, next_offset FROM projection_checkpoints WHERE projection = %s AND topic = %s",
            (projection, topic),
        ).fetchall()
    return {int(p): int(o) for p, o in rows}


def graph_checkpoints(raw: dict[str, int], topic: str, projection: str = "graph") -> dict[int, int]:
    prefix = f"{projection}:{topic}/"
    return {int(k[len(prefix) :]): v for k, v in raw.items() if k.startswith(prefix)}


def projection_lag(settings: Settings, pg: dict[int, int], graph: dict[int, int] | None) -> list[Lag]:
    topic = settings.topic("events")
    c = consumer(settings, group="taskstream-lag")
    try:
        ends = end_offsets(c, topic, list(range(settings.partitions)))

        def lag(name: str, done: dict[int, int]) -> list[Lag]:
            rows = []
            for p, end in sorted(ends.items()):
                at = done.get(p)
                start = at if at is not None else c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0]
                behind = records_between(c, topic, p, start, end) if end > start else 0
                rows.append(Lag(name, p, at, end, behind))
            return rows

        return lag("pg", pg) + (lag("graph", graph) if graph is not None else [])
    finally:
        c.close()
