"""The PostgreSQL projection writer: applies a batch of events and its checkpoint in one transaction."""

from __future__ import annotations

from typing import Any

import psycopg
from taskstream.projections.pg_rows import dead_letter_statement, statements
from taskstream.projections.runner import Batch, RawRecord


class PgProjection:
    name = "pg"

    def __init__(self, dsn: str, projection: str = "pg") -> None:
        self.dsn = dsn
        self.projection = projection
        self.conn = psycopg.connect(dsn)

    def checkpoints(self, topic: str) -> dict[int, int]:
        with self.conn.transaction():
            rows = self.conn.execute(
                "SELECT partition, next_offset FROM projection_checkpoints WHERE projection = %s AND topic = %s",
                (self.projection, topic),
            ).fetchall()
        return {p: o for p, o in rows}

    def apply(self, batch: Batch) -> None:
        stmts: list[tuple[str, tuple[Any, ...]]] = []
        for item in batch.items:
            rec = item.record
            if isinstance(rec, RawRecord):
                stmts.append(
                    dead_letter_statement(
                        batch.topic, item.partition, item.offset, item.log_ms, rec.key, rec.value, rec.headers
                    )
                )
            else:
                stmts.extend(statements(rec))
        with self.conn.transaction(), self.conn.pipeline(), self.conn.cursor() as cur:
            for sql, params in stmts:
                cur.execute(sql, params)  # type: ignore[arg-type]
            cur.executemany(
                "INSERT INTO projection_checkpoints (projection, topic, partition, next_offset, updated_at) "
                "VALUES (%s, %s, %s, %s, now()) ON CONFLICT (projection, topic, partition) "
                "DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()",
                [(self.projection, batch.topic, p, o) for p, o in batch.next_offsets.items()],
            )

    def close(self) -> None:
        self.conn.close()
