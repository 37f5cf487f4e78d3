"""Projection lag: for each projection and partition, its checkpoint against the log's end."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from confluent_kafka import TopicPartition
from taskstream.connectors.kafka import consumer

from taskstream.settings import Settings


@dataclass(frozen=True)
class Lag:
    projection: str
    partition: int
    checkpoint: int | None  # None: the projection has applied nothing from this partition
    log_end: int

    @property
    def behind(self) -> int:
        return self.log_end - (self.checkpoint or 0)


def log_ends(settings: Settings, topic: str) -> dict[int, int]:
    c = consumer(settings, group="taskstream-lag")
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(settings.partitions)}
    finally:
        c.close()


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
    ends = log_ends(settings, topic)
    out = [Lag("pg", p, pg.get(p), end) for p, end in sorted(ends.items())]
    if graph is not None:
        out += [Lag("graph", p, graph.get(p), end) for p, end in sorted(ends.items())]
    return out
