"""Admission (the seed's task submitter): one command in, one set of records out. Pure: no I/O.

A SubmitDag is checked whole; if any rule fails nothing is admitted and a SubmissionRejected names every
problem. Otherwise every task gets a system id derived from the submission, so a redelivered or
replayed command reproduces the same ids and events (downstream skips what it has seen).

A large accepted submission is written in two steps (streams/admitter.py): the decision first, the tasks
(`Admitted.records`) right after; `carry_out` rebuilds the tasks from the command alone, so whoever owns
the partition after a crash in between writes them without deciding again.

Submissions whose tasks depend on tasks of other submissions ("linked") are decided only on their
tenant's partition of the commands topic, against `LinkIndex`: the linked part of every submission that
partition admitted before. One owner per partition decides them one at a time, so two linked submissions
can never both pass the cycle check with a cycle between them, whichever partitions they were sent to.
A submission with no such dependency cannot be on a cycle with others (nothing leaves it) and is decided
wherever it lands. streams/admitter.py runs this inside a Kafka transaction.
"""

from __future__ import annotations

import json
from collections import ChainMap
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from taskstream.schemas import records as r

from taskstream.core.model import TaskSpec
from taskstream.core.schedule import problems as schedule_problems
from taskstream.core.submission import (
    Submission,
    check_submission,
    external_dependencies,
    find_cycle,
    linked_edges,
    reference_id,
    resolve_dependencies,
    split_reference,
    submission_id_for,
    task_ids,
)
from taskstream.core.tenants import TenantTerms, resolve, unknown

Send = tuple[str, str, Any]  # (topic key: "events" | "task-inputs", record key, record)
CHUNK_TASKS = 500  # tasks per TasksAdmitted record (the admitter splits further if one is too big)


@dataclass
class LinkIndex:
    """What one commands partition's owner admitted of linked submissions: task id -> the task ids it
    depends on, and a readable label per task id ("<idempotency key>/<name>") to name cycles with."""

    edges: dict[str, list[str]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    def add(self, entry: dict[str, Any]) -> None:
        self.edges.update(entry["edges"])
        self.labels.update(entry["labels"])

    @staticmethod
    def entry_bytes(entry: dict[str, Any]) -> bytes:
        return json.dumps(entry, separators=(",", ":"), sort_keys=True).encode()


@dataclass
class Admitted:
    """The tasks an accepted submission admits, with the ids the decision gave them. Their records are
    made by `records`, after the decision or with it: the decision does not wait for them."""

    node: str
    submission_id: str
    at_ms: int
    submission: Submission
    ids: dict[str, str]  # task name -> id, as in SubmissionAccepted
    specs: tuple[TaskSpec, ...] | None = None  # dependencies as ids; made when first needed

    def resolved(self) -> tuple[TaskSpec, ...]:
        if self.specs is None:
            self.specs = resolve_dependencies(self.submission, self.ids)
        return self.specs

    def records(self, task_partition: Callable[[str], int]) -> list[Send]:
        """Packed TasksAdmitted records: one per events partition and CHUNK_TASKS tasks."""
        return packed_admissions([self], task_partition)


_Piece = tuple[Admitted, str, tuple[r.AdmittedTask, ...]]  # (its submission, its own event id, its tasks)


def packed_admissions(admissions: list[Admitted], task_partition: Callable[[str], int]) -> list[Send]:
    """The TasksAdmitted records of several accepted submissions, in order: each submission's tasks split
    by events partition and in pieces of CHUNK_TASKS as it would be alone, and the pieces of one
    partition put together while they fit in CHUNK_TASKS tasks. A submission alone gets the records (and
    ids) it always had; a flood of one-task submissions gets one record per partition and transaction,
    not one per task. A record holding several pieces is named after its first piece (`+` their count):
    every piece is in one record, so the name is unique and the same on every reprocessing of the batch."""
    open_: dict[int, list[_Piece]] = {}  # events partition -> the pieces of its record being filled
    filled: dict[int, int] = {}  # events partition -> tasks in those pieces
    sends: list[Send] = []

    def close(part: int) -> None:
        pieces = open_.pop(part)
        del filled[part]
        first, eid, _ = pieces[0]
        sid = first.submission_id
        tasks = tuple(t if a is first or a.submission_id == sid else replace(t, submission_id=a.submission_id)
                      for a, _, ts in pieces for t in ts)  # fmt: skip
        if len(pieces) > 1:
            eid = f"{eid}+{len(pieces)}"
        rec = _event(first.node, None, sid, 0, first.at_ms, r.TasksAdmitted(node=first.node, tasks=tasks), event_id=eid)
        # keyed by its first task's id, so the key's partition is the one its tasks belong to
        sends.append(("events", tasks[0].task_id, rec))

    for adm in admissions:
        for part, tasks in _by_partition(adm.resolved(), adm.ids, task_partition):
            for i in range(0, len(tasks), CHUNK_TASKS):
                chunk = tuple(tasks[i : i + CHUNK_TASKS])
                if filled.get(part, 0) + len(chunk) > CHUNK_TASKS:
                    close(part)
                piece = (adm, f"{adm.submission_id}:admitted:{part}:{i // CHUNK_TASKS}", chunk)
                open_.setdefault(part, []).append(piece)
                filled[part] = filled.get(part, 0) + len(chunk)
    for part in sorted(open_):
        close(part)
    return sends


@dataclass
class Decision:
    sends: list[Send]  # the decision's own records (SubmissionAccepted, a rejection, a cancel request...)
    accepted: bool = False
    link_entry: dict[str, Any] | None = None  # to record in the index (and its topic) once committed
    tenant: TenantTerms | None = None  # a tenant set: to record in the tenants topic with the decision
    forward_to: int | None = None  # decide on this partition instead (a linked submission's tenant's)
    admitted: Admitted | None = None  # an accepted submission's tasks, to write with or after `sends`


@dataclass(frozen=True)
class Placement:
    """Where things go, as the deciding worker sees it: the commands partition the command was read
    from, the commands partition where a tenant's linked submissions are decided, and the events
    partition of a task id."""

    partition: int
    tenant_partition: Callable[[str], int]
    task_partition: Callable[[str], int]
    tenant_known: Callable[[str], bool] = lambda tenant: True  # TASKSTREAM_TENANTS=open: every tenant


def decide_command(node: str, cmd: r.CommandRecord, at_ms: int, *, where: Placement, index: LinkIndex) -> Decision:
    """The records that carry out one decoded command."""
    body = cmd.body
    if isinstance(body, r.SubmitDag):
        return decide_submission(node, cmd, body, at_ms, where=where, index=index)
    if isinstance(body, r.CancelTaskRequest):
        why = body.reason or f"cancelled by {cmd.issuer or 'a user'}"
        return Decision([_input(node, body.task_id, at_ms, r.CancelRequest(why), f"{cmd.command_id}:cancel")])
    if isinstance(body, r.ReprioritizeTaskRequest):
        req = r.ReprioritizeRequest(body.priority)
        return Decision([_input(node, body.task_id, at_ms, req, f"{cmd.command_id}:reprioritize")])
    if isinstance(body, r.Schedule):
        return decide_schedule(node, cmd, body, at_ms, where.tenant_known)
    if isinstance(body, r.SetTenant):
        return decide_tenant(node, cmd, body, at_ms)
    raise TypeError(f"no admission rule for {type(body).__name__}")  # the codec only yields known bodies


def decide_tenant(node: str, cmd: r.CommandRecord, body: r.SetTenant, at_ms: int) -> Decision:
    """Creating or changing a tenant is decided like a submission without tasks (the SDK waits for it the
    same way); accepted, a TenantSet event (keyed by the tenant, so its changes stay in order) and an
    entry in the tenants topic, which every admission worker reads (`Decision.tenant`)."""
    sid = submission_id_for(body.tenant, None, cmd.command_id)
    terms, problems = resolve(body.tenant, body.tier, body.max_running, body.no_cap, body.weight)
    if terms is None:
        found = tuple(r.FieldProblem(None, f, why) for f, why in problems)
        rejected = r.SubmissionRejected(tenant=body.tenant, command_id=cmd.command_id, errors=found)
        return Decision([("events", sid, _event(node, None, sid, 0, at_ms, rejected, event_id=f"{sid}:rejected"))])
    accepted = r.SubmissionAccepted(tenant=body.tenant, idempotency_key=None, command_id=cmd.command_id, task_ids={})
    key = r.TENANT_KEY + body.tenant
    tenant_set = r.TenantSet(terms.tenant, terms.tier, terms.max_running, terms.weight)
    return Decision(
        [
            ("events", sid, _event(node, None, sid, 0, at_ms, accepted, event_id=f"{sid}:accepted")),
            ("events", key, _event(node, None, sid, 0, at_ms, tenant_set, event_id=f"{sid}:tenant")),
        ],
        accepted=True,
        tenant=terms,
    )


def _unknown_tenants(tenants: list[str], known: Callable[[str], bool]) -> list[r.FieldProblem]:
    return [r.FieldProblem(None, "tenant", unknown(t)) for t in dict.fromkeys(tenants) if not known(t)]


def decide_schedule(
    node: str, cmd: r.CommandRecord, body: r.Schedule, at_ms: int, known: Callable[[str], bool] = lambda t: True
) -> Decision:
    """Setting a schedule is decided like a submission that has no tasks yet: the same outcome events
    under a submission id of its command (so the SDK waits for it the same way), the DAG checked as a
    submission would be; accepted, it goes on to the schedule's owner (its key's task-inputs partition).
    Stopping one (enabled false) needs no DAG."""
    sid = submission_id_for(body.tenant, None, cmd.command_id)
    found = [
        r.FieldProblem(None, f, why) for f, why in schedule_problems(body.tenant, body.name, body.cron, body.timezone)
    ]
    if body.enabled:
        sub = Submission(tenant=body.tenant, tasks=body.tasks, labels=body.labels)
        found += [r.FieldProblem(e.task, e.field, e.reason) for e in check_submission(sub)]
        if not found:
            found += _unknown_tenants([body.tenant, *(s.tenant for s in body.tasks)], known)
    if found:
        rejected = r.SubmissionRejected(tenant=body.tenant, command_id=cmd.command_id, errors=tuple(found))
        return Decision([("events", sid, _event(node, None, sid, 0, at_ms, rejected, event_id=f"{sid}:rejected"))])
    accepted = r.SubmissionAccepted(tenant=body.tenant, idempotency_key=None, command_id=cmd.command_id, task_ids={})
    return Decision(
        [
            ("events", sid, _event(node, None, sid, 0, at_ms, accepted, event_id=f"{sid}:accepted")),
            _input(node, body.key, at_ms, body, f"{cmd.command_id}:schedule"),
        ],
        accepted=True,
    )


def decide_submission(
    node: str, cmd: r.CommandRecord, body: r.SubmitDag, at_ms: int, *, where: Placement, index: LinkIndex
) -> Decision:
    sid = submission_id_for(body.tenant, body.idempotency_key, cmd.command_id)
    sub = Submission(tenant=body.tenant, tasks=body.tasks, idempotency_key=body.idempotency_key, labels=body.labels)
    errors = check_submission(sub)
    if errors:
        return _rejected(node, cmd, body, sid, at_ms, [r.FieldProblem(x.task, x.field, x.reason) for x in errors])
    strangers = _unknown_tenants([body.tenant, *(s.tenant for s in body.tasks)], where.tenant_known)
    if strangers:
        return _rejected(node, cmd, body, sid, at_ms, strangers)
    linked = external_dependencies(sub)
    if linked:
        home = where.tenant_partition(body.tenant)
        if home != where.partition:
            return Decision([], forward_to=home)
    ids = task_ids(sub, sid)
    admitted = Admitted(node, sid, at_ms, sub, ids)
    entry = None
    if linked:
        specs = admitted.resolved()
        new = {ids[s.name]: s.dependencies for s in specs}
        refs = {
            reference_id(body.tenant, *ref): d
            for s in sub.tasks
            for d in s.dependencies
            if (ref := split_reference(d)) is not None
        }
        cycle = find_cycle(ChainMap(new, index.edges), roots=list(new))  # type: ignore[arg-type]
        if cycle:
            names = {v: k for k, v in ids.items()}
            label = {**index.labels, **refs, **names}
            path = " -> ".join(label.get(t, t) for t in cycle)
            first = names.get(cycle[0], label.get(cycle[0], cycle[0]))
            problem = r.FieldProblem(first, "dependencies", f"closes a cycle through other submissions: {path}")
            return _rejected(node, cmd, body, sid, at_ms, [problem])
        kept = linked_edges(specs, ids, external=set(refs))
        key = body.idempotency_key or sid
        entry = {
            "submission_id": sid,
            "tenant": body.tenant,
            "edges": kept,
            "labels": {ids[s.name]: f"{key}/{s.name}" for s in specs if ids[s.name] in kept},
        }
    accepted = r.SubmissionAccepted(
        tenant=body.tenant, idempotency_key=body.idempotency_key, command_id=cmd.command_id, task_ids=ids
    )
    sends: list[Send] = [("events", sid, _event(node, None, sid, 0, at_ms, accepted, event_id=f"{sid}:accepted"))]
    return Decision(sends, accepted=True, link_entry=entry, admitted=admitted)


def carry_out(node: str, cmd: r.CommandRecord, at_ms: int) -> Admitted:
    """The tasks of a submission already accepted, from its command alone: no rule is checked again (a
    newer version of a rule must not undo a decision already published)."""
    body = cmd.body
    if not isinstance(body, r.SubmitDag):
        raise TypeError(f"only a SubmitDag admits tasks, not a {type(body).__name__}")
    sid = submission_id_for(body.tenant, body.idempotency_key, cmd.command_id)
    sub = Submission(tenant=body.tenant, tasks=body.tasks, idempotency_key=body.idempotency_key, labels=body.labels)
    return Admitted(node, sid, at_ms, sub, task_ids(sub, sid))


def _by_partition(
    specs: tuple[TaskSpec, ...], ids: dict[str, str], task_partition: Callable[[str], int]
) -> list[tuple[int, list[r.AdmittedTask]]]:
    """The admitted tasks grouped by the events partition of their ids, each with its dependents inside
    the submission (so a prerequisite knows who waits for it without a message per edge)."""
    own = set(ids.values())
    dependents: dict[str, list[str]] = {}
    for spec in specs:
        tid = ids[spec.name]
        for d in spec.dependencies:
            if d in own:
                dependents.setdefault(d, []).append(tid)
    groups: dict[int, list[r.AdmittedTask]] = {}
    for spec in specs:
        tid = ids[spec.name]
        refs = tuple(d for d in spec.dependencies if d not in own)
        admitted = r.AdmittedTask(tid, spec, tuple(dependents.get(tid, ())), refs)
        groups.setdefault(task_partition(tid), []).append(admitted)
    return sorted(groups.items())


def _rejected(
    node: str, cmd: r.CommandRecord, body: r.SubmitDag, sid: str, at_ms: int, problems: list[r.FieldProblem]
) -> Decision:
    rejected = r.SubmissionRejected(tenant=body.tenant, command_id=cmd.command_id, errors=tuple(problems))
    return Decision(
        [("events", sid, _event(node, None, sid, 0, at_ms, rejected, event_id=f"{sid}:rejected:{cmd.command_id}"))]
    )


def _event(
    node: str, task_id: str | None, sid: str, version: int, at_ms: int, payload: Any, event_id: str | None = None
) -> r.EventRecord:
    return r.EventRecord(
        event_id=event_id or f"{task_id}:{version}",
        task_id=task_id,
        submission_id=sid,
        version=version,
        event_ms=at_ms,
        node=node,
        payload=payload,
    )


def _input(node: str, task_id: str, at_ms: int, body: Any, input_id: str) -> Send:
    return (
        "task-inputs",
        task_id,
        r.InputRecord(input_id=input_id, task_id=task_id, sent_ms=at_ms, sender=node, body=body),
    )
