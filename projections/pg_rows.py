"""Pure mapping from one event to the SQL that projects it into the PostgreSQL read model.

Every task statement is guarded by the task's version (`version < new`), so applying an event twice,
or an older one after a newer, changes nothing. The writer (pg.py) adds the checkpoint.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from taskstream.schemas import records as r

from taskstream.core import events as e

Statement = tuple[str, tuple[Any, ...]]


def ts(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


_INSERT_TASK = """
INSERT INTO tasks (task_id, submission_id, name, tenant, status, version, argv, env, working_dir, cpu, memory_mb,
    gpu, execution_cap_ms, retry_limit, backoff, delay_tolerance_ms, priority, dependencies, not_before, labels,
    submitted_at, updated_at)
VALUES (%s, %s, %s, %s, 'SUBMITTED', %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (task_id) DO NOTHING"""


_TENANT_SEEN = (
    "INSERT INTO tenants (tenant, first_seen, last_submission) VALUES (%s, %s, %s) ON CONFLICT (tenant) "
    "DO UPDATE SET first_seen = least(tenants.first_seen, EXCLUDED.first_seen), "
    "last_submission = greatest(tenants.last_submission, EXCLUDED.last_submission)"
)
# Order-independent (least/greatest), so a replay in another partition interleaving gives the same row.
_WORKER_SEEN = (
    "INSERT INTO workers (worker_id, first_seen, last_seen) VALUES (%s, %s, %s) "
    "ON CONFLICT (worker_id) DO UPDATE SET first_seen = least(workers.first_seen, EXCLUDED.first_seen), "
    "last_seen = greatest(workers.last_seen, EXCLUDED.last_seen)"
)


def _set(task_id: str, version: int, at: datetime | None, **cols: Any) -> Statement:
    names = list(cols)
    assignments = ", ".join(f"{n} = %s" for n in names)
    sql = f"UPDATE tasks SET {assignments}, version = %s, updated_at = %s WHERE task_id = %s AND version < %s"
    return sql, (*cols.values(), version, at, task_id, version)


def _attempt(task_id: str, attempt: int, **cols: Any) -> Statement:
    names = list(cols)
    values = ", ".join(["%s"] * len(names))
    sql = (
        f"INSERT INTO attempts (task_id, attempt, {', '.join(names)}) VALUES (%s, %s, {values}) "
        f"ON CONFLICT (task_id, attempt) DO UPDATE SET {', '.join(f'{n} = EXCLUDED.{n}' for n in names)}"
    )
    return sql, (task_id, attempt, *cols.values())


def _current_attempt(task_id: str, **cols: Any) -> Statement:
    """Update the task's current attempt row (the attempt number lives on the task row)."""
    names = list(cols)
    sql = (
        f"UPDATE attempts SET {', '.join(f'{n} = %s' for n in names)} "
        f"WHERE task_id = %s AND attempt = (SELECT attempt FROM tasks WHERE task_id = %s)"
    )
    return sql, (*cols.values(), task_id, task_id)


def dead_letter_statement(
    topic: str,
    partition: int,
    offset: int,
    log_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: dict[str, str],
) -> Statement:
    src_part = headers.get("taskstream.source.partition")
    src_off = headers.get("taskstream.source.offset")
    return (
        'INSERT INTO dead_letters (topic, partition, "offset", source_topic, source_partition, source_offset, '
        "detected_by, reason, key, value, logged_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
        "ON CONFLICT DO NOTHING",
        (
            topic,
            partition,
            offset,
            headers.get("taskstream.source.topic"),
            int(src_part) if src_part and src_part.lstrip("-").isdigit() else None,
            int(src_off) if src_off and src_off.lstrip("-").isdigit() else None,
            headers.get("taskstream.detected.by"),
            headers.get("taskstream.error", "(no reason given)"),
            key,
            value,
            ts(log_ms),
        ),
    )


def statements(rec: r.EventRecord) -> list[Statement]:
    p = rec.payload
    at = ts(rec.event_ms)
    tid = rec.task_id
    v = rec.version
    match p:
        case r.SubmissionAccepted():
            return [
                (
                    "INSERT INTO submissions (submission_id, tenant, idempotency_key, command_id, outcome, task_ids,"
                    " decided_at) VALUES (%s, %s, %s, %s, 'ACCEPTED', %s, %s) ON CONFLICT DO NOTHING",
                    (rec.submission_id, p.tenant, p.idempotency_key, p.command_id, json.dumps(p.task_ids), at),
                )
            ]
        case r.SubmissionRejected():
            errs = [{"task": x.task, "field": x.field, "reason": x.reason} for x in p.errors]
            return [
                (
                    "INSERT INTO submissions (submission_id, tenant, command_id, outcome, errors, decided_at)"
                    " VALUES (%s, %s, %s, 'REJECTED', %s, %s) ON CONFLICT DO NOTHING",
                    (rec.submission_id, p.tenant, p.command_id, json.dumps(errs), at),
                )
            ]
    assert tid is not None, f"task event {rec.event_id} without a task id"
    match p:
        case e.TaskSubmitted(spec=s):
            bo = {
                "initial_ms": s.backoff.initial_ms,
                "factor": s.backoff.factor,
                "max_ms": s.backoff.max_ms,
                "jitter": s.backoff.jitter,
            }
            return [
                (_TENANT_SEEN, (s.tenant, at, at)),
                (
                    _INSERT_TASK,
                    (
                        tid,
                        p.submission_id,
                        s.name,
                        s.tenant,
                        v,
                        list(s.argv),
                        json.dumps(s.env),
                        s.working_dir,
                        s.resources.cpu,
                        s.resources.memory_mb,
                        s.resources.gpu,
                        s.execution_cap_ms,
                        s.retry_limit,
                        json.dumps(bo),
                        s.delay_tolerance_ms,
                        s.priority,
                        list(s.dependencies),
                        ts(s.not_before_ms),
                        json.dumps(s.labels),
                        at,
                        at,
                    ),
                ),
            ]
        case e.TaskAdmitted():
            return [_set(tid, v, at, status="WAITING", admitted_at=at)]
        case e.TaskRejected(reason=why):
            return [_set(tid, v, at, status="REJECTED", reason=why, finished_at=at)]
        case e.TaskReady(reason=why):
            return [_set(tid, v, at, status="READY", reason=why, ready_at=at, worker=None)]
        case e.TaskQueued(attempt=n):
            return [_set(tid, v, at, status="QUEUED", attempt=n, queued_at=at), _attempt(tid, n, queued_at=at)]
        case e.TaskClaimed(attempt=n, worker=w, claim_id=cid):
            return [
                _set(tid, v, at, status="CLAIMED", worker=w, claimed_at=at),
                _attempt(tid, n, worker=w, claim_id=cid, claimed_at=at),
                (_WORKER_SEEN, (w, at, at)),
            ]
        case e.TaskStarted(pid=pid):
            return [_current_attempt(tid, started_at=at, pid=pid), _set(tid, v, at, status="RUNNING", started_at=at)]
        case e.TaskSucceeded():
            return [
                _current_attempt(
                    tid,
                    ended_at=at,
                    exit_code=p.exit_code,
                    duration_ms=p.duration_ms,
                    output_tail=p.output_tail,
                    outcome="SUCCEEDED",
                ),
                _set(tid, v, at, status="SUCCEEDED", exit_code=p.exit_code, reason="", finished_at=at),
            ]
        case e.TaskFailed():
            return [
                _current_attempt(
                    tid,
                    ended_at=at,
                    exit_code=p.exit_code,
                    duration_ms=p.duration_ms,
                    output_tail=p.output_tail,
                    outcome="FAILED",
                    reason=p.reason,
                ),
                _set(tid, v, at, exit_code=p.exit_code, reason=p.reason),
            ]
        case e.TaskTimedOut():
            return [
                _current_attempt(tid, outcome="TIMED_OUT", reason=f"over its cap of {p.cap_ms} ms"),
                _set(tid, v, at),
            ]
        case e.TaskRetryScheduled():
            return [_set(tid, v, at, status="RETRY_WAIT", worker=None)]
        case e.TaskDeadLettered(reason=why):
            return [_set(tid, v, at, status="DEAD_LETTERED", reason=why, finished_at=at)]
        case e.TaskCancelled(reason=why):
            return [_set(tid, v, at, status="CANCELLED", reason=why, finished_at=at)]
        case e.TaskReprioritized(new_priority=prio):
            return [_set(tid, v, at, priority=prio)]
        case e.TaskHeartbeat() | e.ClaimRejected() | e.CompletionRejected():
            return [_set(tid, v, at)]
    raise TypeError(f"no projection for {type(p).__name__}")
