"""The PostgreSQL projection writer: applies a batch of events and its checkpoint in one transaction.

The batch is folded in Python (pg_rows.fold) and written set-based: new tasks and patches are COPYed
into temporary tables and merged with one statement each, so the cost is per batch, not per event.
"""

from __future__ import annotations

from typing import Any

import psycopg
from taskstream.projections.pg_rows import (
    ATTEMPT_PATCH_COLS,
    ATTEMPT_UPSERT_COLS,
    NEW_TASK_COLS,
    TASK_PATCH_COLS,
    dead_letter_row,
    fold,
)
from taskstream.projections.runner import Batch, RawRecord
from taskstream.schemas.records import EventRecord

_TEMP = """
CREATE TEMP TABLE IF NOT EXISTS _new_tasks (LIKE tasks INCLUDING DEFAULTS) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS _task_patch (
    task_id uuid, version bigint, updated_at timestamptz, mask bigint, status text, reason text, attempt integer,
    worker text, exit_code integer, priority integer, admitted_at timestamptz, ready_at timestamptz,
    queued_at timestamptz, claimed_at timestamptz, started_at timestamptz, finished_at timestamptz, lane text
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS _attempt_upsert (
    task_id uuid, attempt integer, queued_at timestamptz, worker text, claim_id text,
    claimed_at timestamptz, lane text
) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS _attempt_patch (
    task_id uuid, claim_id text, mask bigint, started_at timestamptz, pid integer, ended_at timestamptz,
    exit_code integer, duration_ms bigint, output_tail text, outcome text, reason text
) ON COMMIT DELETE ROWS;
"""


def _pick(cols: tuple[str, ...], target: str, source: str) -> str:
    return ", ".join(
        f"{c} = CASE WHEN {source}.mask & {1 << i} <> 0 THEN {source}.{c} ELSE {target}.{c} END"
        for i, c in enumerate(cols)
    )


MERGE_NEW_TASKS = (
    f"INSERT INTO tasks ({', '.join(NEW_TASK_COLS)}) SELECT {', '.join(NEW_TASK_COLS)} FROM _new_tasks "
    "ON CONFLICT (task_id) DO NOTHING"
)
_READY_BIT = 1 << TASK_PATCH_COLS.index("ready_at")
MERGE_TASK_PATCHES = (
    f"UPDATE tasks t SET {_pick(TASK_PATCH_COLS, 't', 'p')}, version = p.version, updated_at = p.updated_at, "
    # the deadline the batcher ranks by comes with the ready time, to the second: tasks ready within
    # the same second with the same tolerance are ranked by priority, not by milliseconds of readiness
    f"promote_by = CASE WHEN p.mask & {_READY_BIT} <> 0 "
    "THEN date_trunc('second', p.ready_at + t.delay_tolerance_ms * interval '1 ms') ELSE t.promote_by END "
    "FROM _task_patch p WHERE t.task_id = p.task_id AND t.version < p.version"
)
# Upserted attempt columns are never set to NULL on purpose, so COALESCE keeps what a batch did not set.
MERGE_ATTEMPT_UPSERTS = (
    f"INSERT INTO attempts AS a (task_id, attempt, {', '.join(ATTEMPT_UPSERT_COLS)}) "
    f"SELECT task_id, attempt, {', '.join(ATTEMPT_UPSERT_COLS)} FROM _attempt_upsert "
    "ON CONFLICT (task_id, attempt) DO UPDATE SET "
    + ", ".join(f"{c} = COALESCE(EXCLUDED.{c}, a.{c})" for c in ATTEMPT_UPSERT_COLS)
)
MERGE_ATTEMPT_PATCHES = (
    f"UPDATE attempts a SET {_pick(ATTEMPT_PATCH_COLS, 'a', 'p')} FROM _attempt_patch p "
    "WHERE a.task_id = p.task_id AND a.claim_id = p.claim_id"
)
TENANT_SEEN = (
    "INSERT INTO tenants (tenant, first_seen, last_submission) VALUES (%s, %s, %s) ON CONFLICT (tenant) "
    "DO UPDATE SET first_seen = least(tenants.first_seen, EXCLUDED.first_seen), "
    "last_submission = greatest(tenants.last_submission, EXCLUDED.last_submission)"
)
# A tenant's latest terms win (its TenantSet events are all in one partition, in order).
TENANT_SET = (
    "INSERT INTO tenants (tenant, subscription, max_running, weight, set_at, first_seen, last_submission) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (tenant) DO UPDATE SET "
    "first_seen = least(tenants.first_seen, EXCLUDED.first_seen), "
    "last_submission = greatest(tenants.last_submission, EXCLUDED.last_submission), "  # order-independent
    + ", ".join(
        f"{c} = CASE WHEN tenants.set_at IS NULL OR EXCLUDED.set_at >= tenants.set_at THEN EXCLUDED.{c} "
        f"ELSE tenants.{c} END"
        for c in ("subscription", "max_running", "weight", "set_at")
    )
)
# Order-independent (least/greatest), so a replay interleaving partitions differently gives the same row.
WORKER_SEEN = (
    "INSERT INTO workers (worker_id, first_seen, last_seen) VALUES (%s, %s, %s) ON CONFLICT (worker_id) "
    "DO UPDATE SET first_seen = least(workers.first_seen, EXCLUDED.first_seen), "
    "last_seen = greatest(workers.last_seen, EXCLUDED.last_seen)"
)
BATCHER_CHANNEL = "taskstream_batcher"  # NOTIFYed in a transaction that changed what the batcher counts
SUBMISSION = (
    "INSERT INTO submissions (submission_id, tenant, idempotency_key, command_id, outcome, task_ids, errors, "
    "decided_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (submission_id) DO UPDATE SET "
    # A rejection admits nothing and does not use up the idempotency key: a later decision on the same
    # key replaces it. An acceptance is final: a later copy of the key admits nothing new.
    "tenant = EXCLUDED.tenant, idempotency_key = EXCLUDED.idempotency_key, command_id = EXCLUDED.command_id, "
    "outcome = EXCLUDED.outcome, task_ids = EXCLUDED.task_ids, errors = EXCLUDED.errors, "
    "decided_at = EXCLUDED.decided_at WHERE submissions.outcome = 'REJECTED'"
)
DEAD_LETTER = (
    'INSERT INTO dead_letters (topic, partition, "offset", source_topic, source_partition, source_offset, '
    "detected_by, reason, key, value, logged_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT DO NOTHING"
)
CHECKPOINT = (
    "INSERT INTO projection_checkpoints (projection, topic, partition, next_offset, updated_at) "
    "VALUES (%s, %s, %s, %s, now()) ON CONFLICT (projection, topic, partition) "
    "DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()"
)


class PgProjection:
    name = "pg"

    def __init__(self, dsn: str, projection: str = "pg") -> None:
        self.dsn = dsn
        self.projection = projection
        # prepare_threshold=None: no server-side prepared statements, so a schema swap (replay) is
        # picked up by name on the next transaction instead of writing into the retired tables.
        self.conn = psycopg.connect(dsn, prepare_threshold=None)
        with self.conn.transaction():
            self.conn.execute(_TEMP)

    def checkpoints(self, topic: str) -> dict[int, int]:
        with self.conn.transaction():
            rows = self.conn.execute(
                "SELECT partition, next_offset FROM projection_checkpoints WHERE projection = %s AND topic = %s",
                (self.projection, topic),
            ).fetchall()
        return {p: o for p, o in rows}

    def apply(self, batch: Batch) -> None:
        events = [i.record for i in batch.items if isinstance(i.record, EventRecord)]
        letters = [
            dead_letter_row(batch.topic, i.partition, i.offset, i.log_ms, i.record.key, i.record.value,
                            i.record.headers)
            for i in batch.items if isinstance(i.record, RawRecord)
        ]  # fmt: skip
        w = fold(events)
        with self.conn.transaction(), self.conn.cursor() as cur:
            if w.submissions:
                cur.executemany(SUBMISSION, w.submissions)
            if w.new_tasks:
                self._copy(cur, "_new_tasks", NEW_TASK_COLS, w.new_tasks.values())
                cur.execute(MERGE_NEW_TASKS.encode())
            if w.task_patches:
                rows = [
                    (tid, p.version, p.at, p.mask(TASK_PATCH_COLS), *p.row(TASK_PATCH_COLS))
                    for tid, p in w.task_patches.items()
                ]
                self._copy(cur, "_task_patch", ("task_id", "version", "updated_at", "mask", *TASK_PATCH_COLS), rows)
                cur.execute(MERGE_TASK_PATCHES.encode())
            if w.attempt_upserts:
                rows = [(t, n, *[c.get(x) for x in ATTEMPT_UPSERT_COLS]) for (t, n), c in w.attempt_upserts.items()]
                self._copy(cur, "_attempt_upsert", ("task_id", "attempt", *ATTEMPT_UPSERT_COLS), rows)
                cur.execute(MERGE_ATTEMPT_UPSERTS.encode())
            if w.attempt_patches:
                rows = [
                    (t, cid, _mask(c, ATTEMPT_PATCH_COLS), *[c.get(x) for x in ATTEMPT_PATCH_COLS])
                    for (t, cid), c in w.attempt_patches.items()
                ]
                self._copy(cur, "_attempt_patch", ("task_id", "claim_id", "mask", *ATTEMPT_PATCH_COLS), rows)
                cur.execute(MERGE_ATTEMPT_PATCHES.encode())
            if w.tenants:
                cur.executemany(TENANT_SEEN, [(t, a, b) for t, (a, b) in w.tenants.items()])
            if w.tenant_sets:
                cur.executemany(TENANT_SET, list(w.tenant_sets.values()))
            if w.workers:
                cur.executemany(WORKER_SEEN, [(t, a, b) for t, (a, b) in w.workers.items()])
            if w.batcher_news:
                cur.execute(f"NOTIFY {BATCHER_CHANNEL}".encode())
            if letters:
                cur.executemany(DEAD_LETTER, letters)
            cur.executemany(CHECKPOINT, [(self.projection, batch.topic, p, o) for p, o in batch.next_offsets.items()])

    @staticmethod
    def _copy(cur: psycopg.Cursor[Any], table: str, cols: tuple[str, ...], rows: Any) -> None:
        with cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN".encode()) as copy:
            for row in rows:
                copy.write_row(row)

    def close(self) -> None:
        self.conn.close()


def _mask(cols: dict[str, Any], names: tuple[str, ...]) -> int:
    return sum(1 << i for i, n in enumerate(names) if n in cols)
