"""JSON for what the lifecycle agent keeps in its table: the task's state plus dependency bookkeeping.

Written and read with orjson: the standard library's json was a twentieth of the worker's CPU per task
(every transition writes the task's record). Either reads what the other wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from taskstream.schemas.codec import _plain, spec_from

from taskstream.core.model import Claim, Status, TaskState


@dataclass
class TaskRecord:
    state: TaskState
    dependents: list[str] = field(default_factory=list)  # tasks to tell when this one ends
    ended: dict[str, str] = field(default_factory=dict)  # prerequisite id -> how it ended
    not_admitted: bool = False  # its dependents waited reference_wait_ms and were told it never came
    lease_until_ms: int | None = None  # the current claim's lease, moved on by the worker's heartbeats
    rechecks: int = 0  # times it asked its prerequisites again (while waiting)


def dumps(rec: TaskRecord) -> bytes:
    s = rec.state
    d: dict[str, Any] = {
        "task_id": s.task_id,
        "status": s.status.value,
        "version": s.version,
        "spec": _plain(s.spec) if s.spec else None,
        "submission_id": s.submission_id,
        "priority": s.priority,
        "attempt": s.attempt,
        "claim": _plain(s.claim) if s.claim else None,
        "retry_due_ms": s.retry_due_ms,
        "exit_code": s.exit_code,
        "reason": s.reason,
        "updated_ms": s.updated_ms,
        "fenced_claims": list(s.fenced_claims),
        "lease_expiries": s.lease_expiries,
        "cancelled_claim": s.cancelled_claim,
        "lane": s.lane,
        "limited_claim": s.limited_claim,
    }
    return orjson.dumps(
        {
            "state": d,
            "dependents": rec.dependents,
            "ended": rec.ended,
            "not_admitted": rec.not_admitted,
            "lease_until_ms": rec.lease_until_ms,
            "rechecks": rec.rechecks,
        }
    )


def loads(raw: bytes) -> TaskRecord:
    obj = orjson.loads(raw)
    d = obj["state"]
    state = TaskState(
        task_id=d["task_id"],
        status=Status(d["status"]),
        version=d["version"],
        spec=spec_from(d["spec"]) if d["spec"] else None,
        submission_id=d["submission_id"],
        priority=d["priority"],
        attempt=d["attempt"],
        claim=Claim(**d["claim"]) if d["claim"] else None,
        retry_due_ms=d["retry_due_ms"],
        exit_code=d["exit_code"],
        reason=d["reason"],
        updated_ms=d["updated_ms"],
        fenced_claims=tuple(d.get("fenced_claims", ())),
        lease_expiries=int(d.get("lease_expiries", 0)),
        cancelled_claim=d.get("cancelled_claim"),
        lane=d.get("lane", "default"),
        limited_claim=d.get("limited_claim"),
    )
    return TaskRecord(
        state,
        list(obj["dependents"]),
        dict(obj["ended"]),
        bool(obj.get("not_admitted", False)),
        obj.get("lease_until_ms"),
        int(obj.get("rechecks", 0)),
    )
