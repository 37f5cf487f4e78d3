"""JSON for what the lifecycle agent keeps in its table: the task's state plus dependency bookkeeping.

Written and read with orjson: the standard library's json was a twentieth of the worker's CPU per task
(every transition writes the task's record). Either reads what the other wrote.

A task's spec never changes once it is submitted, yet every save wrote it out from the TaskSpec again
and every load built a TaskSpec from it again: a fifth of the owner's CPU per task (bench/owner_bench.py).
The specs of recent tasks are kept with their plain form (`_SPECS`): a save of the same spec reuses the
plain form, and a load whose stored spec equals the kept plain form (compared in C) reuses the spec.

Likewise the last record saved of each recent task is kept with its bytes (`_RECORDS`): a task is saved
at every step of its life and loaded again at the next, and a load whose stored bytes are the ones kept
(compared in C, so a record written meanwhile by anyone else, such as the changelog a partition was
recovered from, is never mistaken for it) gets a copy of the kept record instead of decoding the JSON
and building the state anew.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from taskstream.schemas.codec import _plain, _spec_avro, spec_from

from taskstream.core.model import Claim, Status, TaskSpec, TaskState

SPECS_KEPT = 16_384  # tasks whose spec is kept with its plain form (all dropped at once when full)
_SPECS: dict[str, tuple[TaskSpec, dict[str, Any]]] = {}  # task id -> (spec, its plain form)
RECORDS_KEPT = 16_384  # tasks whose last record is kept with its bytes (all dropped at once when full)
_RECORDS: dict[str, tuple[bytes, TaskRecord]] = {}  # task id -> (its record's bytes, a copy of the record)


def _keep(task_id: str, spec: TaskSpec, plain: dict[str, Any]) -> None:
    if len(_SPECS) >= SPECS_KEPT:
        _SPECS.clear()
    _SPECS[task_id] = (spec, plain)


def _spec_plain(task_id: str, spec: TaskSpec) -> dict[str, Any]:
    kept = _SPECS.get(task_id)
    if kept is not None and kept[0] is spec:
        return kept[1]
    # the codec's written-out walk (0.8 us against 4.6 for _plain): the same JSON, with tuples for lists
    # and records shared between specs, which only orjson reads here
    plain = _spec_avro(spec)
    _keep(task_id, spec, plain)
    return plain


def _spec_of(task_id: str, plain: dict[str, Any]) -> TaskSpec:
    kept = _SPECS.get(task_id)
    if kept is not None and kept[1] == plain:
        return kept[0]
    spec = spec_from(plain)
    _keep(task_id, spec, plain)
    return spec


@dataclass
class TaskRecord:
    state: TaskState
    dependents: list[str] = field(default_factory=list)  # tasks to tell when this one ends
    ended: dict[str, str] = field(default_factory=dict)  # prerequisite id -> how it ended
    not_admitted: bool = False  # its dependents waited reference_wait_ms and were told it never came
    lease_until_ms: int | None = None  # the current claim's lease, moved on by the worker's heartbeats
    rechecks: int = 0  # times it asked its prerequisites again (while waiting)


def _copy(rec: TaskRecord) -> TaskRecord:
    """A record nobody else holds: its state is immutable, its lists and dicts are copied."""
    return TaskRecord(
        rec.state, list(rec.dependents), dict(rec.ended), rec.not_admitted, rec.lease_until_ms, rec.rechecks
    )


def save(rec: TaskRecord) -> bytes:
    """`dumps`, and the record kept with its bytes for the next `load` of the task."""
    raw = dumps(rec)
    if len(_RECORDS) >= RECORDS_KEPT:
        _RECORDS.clear()
    _RECORDS[rec.state.task_id] = (raw, _copy(rec))
    return raw


def load(task_id: str, raw: bytes) -> TaskRecord:
    """`loads(raw)`: a copy of the record kept for `task_id` if `raw` is the bytes it was saved as."""
    kept = _RECORDS.get(task_id)
    if kept is not None and kept[0] == raw:
        return _copy(kept[1])
    return loads(raw)


def dumps(rec: TaskRecord) -> bytes:
    s = rec.state
    d: dict[str, Any] = {
        "task_id": s.task_id,
        "status": s.status.value,
        "version": s.version,
        "spec": _spec_plain(s.task_id, s.spec) if s.spec else None,
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
        "failures": s.failures,
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


def _failures_before(d: dict[str, Any]) -> int:
    """A record saved before `failures` was kept: the failed runs as that code counted them, every
    attempt before the current one (and the current one too, while it waits to be retried)."""
    return max(0, int(d["attempt"]) - 1) + (d["status"] == Status.RETRY_WAIT.value)


def loads(raw: bytes) -> TaskRecord:
    obj = orjson.loads(raw)
    d = obj["state"]
    state = TaskState(
        task_id=d["task_id"],
        status=Status(d["status"]),
        version=d["version"],
        spec=_spec_of(d["task_id"], d["spec"]) if d["spec"] else None,
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
        failures=int(d["failures"]) if "failures" in d else _failures_before(d),
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
