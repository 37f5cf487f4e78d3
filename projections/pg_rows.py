"""Pure mapping from a batch of events to the rows the PostgreSQL read model needs.

A batch is folded per task: one new row per TaskSubmitted, one patch per task holding the last value of
every column its events set (with the highest version), one upsert per (task, attempt) and one patch per
claim. The writer (pg.py) applies these set-based. Every task patch is guarded by the task's version
(`version < new`), inserts are ON CONFLICT DO NOTHING, and events at or below a version already folded
are skipped, so applying an event twice, or an older one after a newer, changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from taskstream.schemas import records as r

from taskstream.core import events as e
from taskstream.core.model import TaskSpec

# Columns a task patch may set, each with its bit in the patch's mask.
TASK_PATCH_COLS = (
    "status", "reason", "attempt", "worker", "exit_code", "priority",
    "admitted_at", "ready_at", "queued_at", "claimed_at", "started_at", "finished_at", "lane",
)  # fmt: skip
ATTEMPT_UPSERT_COLS = ("queued_at", "worker", "claim_id", "claimed_at", "lane")
ATTEMPT_PATCH_COLS = ("started_at", "pid", "ended_at", "exit_code", "duration_ms", "output_tail", "outcome", "reason")


def ts(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


@dataclass
class Patch:
    version: int
    at: datetime | None
    cols: dict[str, Any] = field(default_factory=dict)

    def mask(self, names: tuple[str, ...]) -> int:
        return sum(1 << i for i, n in enumerate(names) if n in self.cols)

    def row(self, names: tuple[str, ...]) -> list[Any]:
        return [self.cols.get(n) for n in names]


@dataclass
class PgWrites:
    submissions: list[tuple[Any, ...]] = field(default_factory=list)
    new_tasks: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    task_patches: dict[str, Patch] = field(default_factory=dict)
    attempt_upserts: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    attempt_patches: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    tenants: dict[str, tuple[datetime, datetime]] = field(default_factory=dict)
    workers: dict[str, tuple[datetime, datetime]] = field(default_factory=dict)
    tenant_sets: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # tenant -> its latest TenantSet row
    # whether anything the batcher counts changed: a task became ready, was queued, ended or left its worker
    batcher_news: bool = False


def _seen(d: dict[str, tuple[datetime, datetime]], key: str, at: datetime) -> None:
    first, last = d.get(key, (at, at))
    d[key] = (min(first, at), max(last, at))


def _task_row(tid: str, rec: r.EventRecord, p: e.TaskSubmitted, at: datetime | None) -> tuple[Any, ...]:
    return _new_row(tid, p.submission_id, p.spec, "SUBMITTED", rec.version, at, None)


def _admitted_row(tid: str, sid: str, spec: TaskSpec, at: datetime) -> tuple[Any, ...]:
    """The row TaskSubmitted (version 1) and then TaskAdmitted (version 2) at `at` leave."""
    return _new_row(tid, sid, spec, "WAITING", 2, at, at)


def _new_row(
    tid: str, sid: str, s: TaskSpec, status: str, version: int, at: datetime | None, admitted: datetime | None
) -> tuple[Any, ...]:
    bo = {"initial_ms": s.backoff.initial_ms, "factor": s.backoff.factor, "max_ms": s.backoff.max_ms,
          "jitter": s.backoff.jitter}  # fmt: skip
    return (
        tid, sid, s.name, s.tenant, status, version, list(s.argv), json.dumps(s.env),
        s.working_dir, s.resources.cpu, s.resources.memory_mb, s.resources.gpu, s.execution_cap_ms, s.retry_limit,
        json.dumps(bo), s.delay_tolerance_ms, s.priority, list(s.dependencies), ts(s.not_before_ms),
        json.dumps(s.labels), at, at, admitted, _call_json(s), json.dumps(dict(s.resources.labels)),
    )  # fmt: skip


def _call_json(s: TaskSpec) -> str | None:
    if s.call is None:
        return None
    return f'{{"target": {json.dumps(s.call.target)}, "args": {s.call.args_json}, "kwargs": {s.call.kwargs_json}}}'


NEW_TASK_COLS = (
    "task_id", "submission_id", "name", "tenant", "status", "version", "argv", "env", "working_dir", "cpu",
    "memory_mb", "gpu", "execution_cap_ms", "retry_limit", "backoff", "delay_tolerance_ms", "priority",
    "dependencies", "not_before", "labels", "submitted_at", "updated_at", "admitted_at", "call", "needs_labels",
)  # fmt: skip


def _changes(
    p: Any, at: datetime | None
) -> tuple[dict[str, Any], tuple[int, dict[str, Any]] | None, tuple[str, dict[str, Any]] | None]:
    """(task columns, attempt upsert by number, attempt patch by claim id) for one lifecycle event."""
    match p:
        case e.TaskAdmitted():
            return {"status": "WAITING", "admitted_at": at}, None, None
        case e.TaskRejected(reason=why):
            return {"status": "REJECTED", "reason": why, "finished_at": at}, None, None
        case e.TaskReady(reason=why, handed_back=True):  # its ready time and deadline stay as they were
            return {"status": "READY", "reason": why, "worker": None}, None, None
        case e.TaskReady(reason=why):
            return {"status": "READY", "reason": why, "ready_at": at, "worker": None}, None, None
        case e.TaskQueued(attempt=n, lane=lane):
            return (
                {"status": "QUEUED", "attempt": n, "queued_at": at, "lane": lane},
                (n, {"queued_at": at, "lane": lane}),
                None,
            )
        case e.TaskClaimed(attempt=n, worker=w, claim_id=cid):
            return (
                {"status": "CLAIMED", "worker": w, "claimed_at": at},
                (n, {"worker": w, "claim_id": cid, "claimed_at": at}),
                None,
            )
        case e.TaskStarted(claim_id=cid, pid=pid):
            return {"status": "RUNNING", "started_at": at}, None, (cid, {"started_at": at, "pid": pid})
        case e.TaskSucceeded(claim_id=cid):
            return (
                {"status": "SUCCEEDED", "exit_code": p.exit_code, "reason": "", "finished_at": at},
                None,
                (
                    cid,
                    {
                        "ended_at": at,
                        "exit_code": p.exit_code,
                        "duration_ms": p.duration_ms,
                        "output_tail": p.output_tail,
                        "outcome": "SUCCEEDED",
                    },
                ),
            )
        case e.TaskFailed(claim_id=cid):
            return (
                {"exit_code": p.exit_code, "reason": p.reason},
                None,
                (
                    cid,
                    {
                        "ended_at": at,
                        "exit_code": p.exit_code,
                        "duration_ms": p.duration_ms,
                        "output_tail": p.output_tail,
                        "outcome": "FAILED",
                        "reason": p.reason,
                    },
                ),
            )
        case e.TaskTimedOut(claim_id=cid):
            return {}, None, (cid, {"outcome": "TIMED_OUT", "reason": f"over its cap of {p.cap_ms} ms"})
        case e.TaskRetryScheduled():
            return {"status": "RETRY_WAIT", "worker": None}, None, None
        case e.TaskDeadLettered(reason=why):
            return {"status": "DEAD_LETTERED", "reason": why, "finished_at": at}, None, None
        case e.TaskCancelled(reason=why):
            return {"status": "CANCELLED", "reason": why, "finished_at": at}, None, None
        case e.TaskReprioritized(new_priority=prio):
            return {"priority": prio}, None, None
        case e.TaskLeaseExpired(claim_id=cid, reason=why):
            return {"reason": why}, None, (cid, {"ended_at": at, "outcome": "LEASE_EXPIRED", "reason": why})
        case e.TaskReleased(claim_id=cid, reason=why):
            return {"reason": why}, None, (cid, {"ended_at": at, "outcome": "RELEASED", "reason": why})
        case e.TaskLimitExceeded(reason=why):
            return {"reason": f"being killed: {why}"}, None, None
        case e.TaskUnqueued(attempt=n, reason=why):  # its ready time and deadline stay as they were
            return {"status": "READY", "attempt": n - 1, "reason": why, "worker": None}, None, None
        case e.TaskHeartbeat() | e.ClaimRejected() | e.CompletionRejected():
            return {}, None, None
    raise TypeError(f"no projection for {type(p).__name__}")


def fold(records: Iterable[r.EventRecord]) -> PgWrites:
    w = PgWrites()
    folded: dict[str, int] = {}  # task id -> highest version folded in this batch
    for rec in r.unpacked(records):
        p = rec.payload
        at = ts(rec.event_ms)
        if isinstance(p, r.SubmissionAccepted):
            w.submissions.append(
                (
                    rec.submission_id,
                    p.tenant,
                    p.idempotency_key,
                    p.command_id,
                    "ACCEPTED",
                    json.dumps(p.task_ids),
                    "[]",
                    at,
                )
            )
            continue
        if isinstance(p, r.SubmissionRejected):
            errs = [{"task": x.task, "field": x.field, "reason": x.reason} for x in p.errors]
            w.submissions.append(
                (rec.submission_id, p.tenant, None, p.command_id, "REJECTED", "{}", json.dumps(errs), at)
            )
            continue
        if isinstance(p, r.TenantSet):
            w.tenant_sets[p.tenant] = (p.tenant, p.tier, p.max_running, p.weight, at, at, at)
            w.batcher_news = True
            continue
        if isinstance(p, r.TasksAdmitted):  # each task's TaskSubmitted + TaskAdmitted: one new row each
            assert at is not None
            for t in p.tasks:
                # before the batch's dedupe: a copy of the record counts whichever batch it falls in, so
                # live (small batches) and a replay (large ones) see the same first and last times
                _seen(w.tenants, t.spec.tenant, at)
                if folded.get(t.task_id, 0) >= 2:
                    continue
                folded[t.task_id] = 2
                w.new_tasks.setdefault(t.task_id, _admitted_row(t.task_id, t.submission(rec), t.spec, at))
            continue
        tid = rec.task_id
        assert tid is not None, f"task event {rec.event_id} without a task id"
        if isinstance(p, e.TaskSubmitted):  # seen whatever the batch, as above
            assert at is not None
            _seen(w.tenants, p.spec.tenant, at)
        elif isinstance(p, e.TaskClaimed) and at is not None:
            _seen(w.workers, p.worker, at)
        if rec.version <= folded.get(tid, 0):
            continue  # a duplicate delivery within the batch
        folded[tid] = rec.version
        if isinstance(p, e.TaskSubmitted):
            w.new_tasks.setdefault(tid, _task_row(tid, rec, p, at))
            continue
        cols, upsert, claim_patch = _changes(p, at)
        if type(p) in BATCHER_NEWS:
            w.batcher_news = True
        patch = w.task_patches.setdefault(tid, Patch(rec.version, at))
        patch.version, patch.at = rec.version, at
        patch.cols.update(cols)
        if upsert is not None:
            w.attempt_upserts.setdefault((tid, upsert[0]), {}).update(upsert[1])
        if claim_patch is not None:
            w.attempt_patches.setdefault((tid, claim_patch[0]), {}).update(claim_patch[1])
    return w


# Events after which the batcher may promote more: a task became ready, or room was made.
BATCHER_NEWS = frozenset({
    e.TaskReady, e.TaskQueued, e.TaskSucceeded, e.TaskFailed, e.TaskCancelled, e.TaskDeadLettered,
    e.TaskLeaseExpired, e.TaskReleased, e.TaskRetryScheduled, e.TaskReprioritized, e.TaskUnqueued,
})  # fmt: skip


def dead_letter_row(
    topic: str,
    partition: int,
    offset: int,
    log_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: dict[str, str],
) -> tuple[Any, ...]:
    src_part = headers.get("taskstream.source.partition")
    src_off = headers.get("taskstream.source.offset")
    return (
        topic, partition, offset, headers.get("taskstream.source.topic"),
        int(src_part) if src_part and src_part.lstrip("-").isdigit() else None,
        int(src_off) if src_off and src_off.lstrip("-").isdigit() else None,
        headers.get("taskstream.detected.by"), headers.get("taskstream.error", "(no reason given)"),
        key, value, ts(log_ms),
    )  # fmt: skip
