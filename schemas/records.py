"""Typed records for the Avro envelopes. Task event payloads are the core's own classes.

Avro record names map to Python classes through the tables at the bottom; a test checks every class
and every schema agree field by field.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from taskstream.core import events as ev
from taskstream.core.model import TaskSpec


# ---- commands topic -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SubmitDag:
    tenant: str
    tasks: tuple[TaskSpec, ...]
    idempotency_key: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CancelTaskRequest:
    task_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ReprioritizeTaskRequest:
    task_id: str
    priority: int


@dataclass(frozen=True, slots=True)
class Schedule:
    """A DAG submitted at every time `cron` names in `timezone` (io.taskstream.Schedule.avsc): a command
    to set or stop it, and, forwarded by admission, an input to the schedule's owner."""

    tenant: str
    name: str
    cron: str
    timezone: str = "UTC"
    enabled: bool = True
    labels: dict[str, str] = field(default_factory=dict)
    tasks: tuple[TaskSpec, ...] = ()

    @property
    def key(self) -> str:
        """Where its owner keeps it: the key of its inputs and timer."""
        return f"{SCHEDULE_KEY}{self.tenant}/{self.name}"


@dataclass(frozen=True, slots=True)
class SetTenant:
    """Create or change a tenant (taskstream/core/tenants.py): its tier, and a cap or weight other than
    the tier's (None: the tier's; no_cap: no cap whatever the tier's)."""

    tenant: str
    tier: str
    max_running: int | None = None
    no_cap: bool = False
    weight: float | None = None


SCHEDULE_KEY = "schedule:"  # the task-inputs keys of schedules start with this; task ids never do
CommandBody = SubmitDag | CancelTaskRequest | ReprioritizeTaskRequest | Schedule | SetTenant


@dataclass(frozen=True, slots=True)
class CommandRecord:
    command_id: str
    issued_ms: int
    body: CommandBody
    issuer: str = ""


# ---- events topic -------------------------------------------------------------------------------
EVENT_HEADER = "taskstream.event"  # every event carries its kind (payload class name) in this header
KINDS_HEADER = "taskstream.kinds"  # and a packed TaskEvents its members' kinds, comma-separated


@dataclass(frozen=True, slots=True)
class FieldProblem:
    task: str | None
    field: str
    reason: str


@dataclass(frozen=True, slots=True)
class SubmissionAccepted:
    tenant: str
    idempotency_key: str | None
    command_id: str
    task_ids: dict[str, str]


@dataclass(frozen=True, slots=True)
class SubmissionRejected:
    tenant: str
    command_id: str
    errors: tuple[FieldProblem, ...]


@dataclass(frozen=True, slots=True)
class AdmittedTask:
    task_id: str
    spec: TaskSpec
    dependents: tuple[str, ...] = ()  # tasks of the same submission that depend on this one
    references: tuple[str, ...] = ()  # dependencies on tasks of other submissions
    submission_id: str | None = None  # its submission, when not the record's (see `TasksAdmitted`)

    def submission(self, rec: EventRecord) -> str:
        """The id of the submission this task came with, in the record `rec` that carries it."""
        return self.submission_id or rec.submission_id


@dataclass(frozen=True, slots=True)
class TasksAdmitted:
    """Several tasks' TaskSubmitted and TaskAdmitted in one record (see `task_events`).

    Admission writes a submission's tasks packed, one record per events partition (and per few hundred
    tasks), instead of two records per task: every reader decodes and every agent handles one record
    for hundreds of tasks, which is what let a 10,000-task admission be decided and projected in
    seconds (docs/measurements.md). The per-task events stay the model everyone folds."""

    node: str
    tasks: tuple[AdmittedTask, ...]


@dataclass(frozen=True, slots=True)
class PackedEvent:
    task_id: str
    submission_id: str
    version: int
    event_ms: int
    payload: ev.Event


@dataclass(frozen=True, slots=True)
class TaskEvents:
    """Several tasks' events in one record (see `task_events`): what the task owner decided in one batch
    for one partition, in order.

    A task's run is five events (ready, queued, claimed, started, succeeded); one record each made the
    broker, the owner's own reading and every consumer handle five records per task. Packed, a batch of
    hundreds of tasks is one record per partition. The per-task events stay the model everyone folds."""

    events: tuple[PackedEvent, ...]


@dataclass(frozen=True, slots=True)
class TenantSet:
    """A tenant as a SetTenant made it: its tier, cap (None: none) and weight, resolved."""

    tenant: str
    tier: str
    max_running: int | None
    weight: float


TENANT_KEY = "tenant:"  # the events key of a tenant's TenantSet records (one partition per tenant)
Payload = ev.Event | SubmissionAccepted | SubmissionRejected | TasksAdmitted | TaskEvents | TenantSet
PACKED_KINDS = frozenset({"TasksAdmitted", "TaskEvents"})  # payloads that stand for several tasks' events


@dataclass(frozen=True, slots=True)
class EventRecord:
    event_id: str
    task_id: str | None
    submission_id: str
    version: int
    event_ms: int
    node: str
    payload: Payload

    @property
    def kind(self) -> str:
        return type(self.payload).__name__


def pack(records: list[EventRecord], node: str) -> EventRecord:
    """Task events (of one partition, in order) as one TaskEvents record, keyed by the first one's task."""
    first = records[0]
    members = tuple(PackedEvent(x.task_id, x.submission_id, x.version, x.event_ms, x.payload) for x in records)  # type: ignore[arg-type]
    return EventRecord(f"{first.event_id}+{len(records)}", None, "", 0, first.event_ms, node, TaskEvents(members))


def unpacked(records: Iterable[EventRecord]) -> Iterator[EventRecord]:
    """The records with every TaskEvents among them unpacked (TasksAdmitted stay packed: the projections
    fold those whole)."""
    for rec in records:
        if type(rec.payload) is TaskEvents:
            yield from task_events(rec)
        else:
            yield rec


def task_events(rec: EventRecord) -> list[EventRecord]:
    """The per-task events a record stands for: a TasksAdmitted unpacked into each task's TaskSubmitted
    (version 1) and TaskAdmitted (version 2), a TaskEvents into its members, each with the id it would
    have had on its own; any other record as it is."""
    p = rec.payload
    if type(p) is TaskEvents:
        return [EventRecord(f"{m.task_id}:{m.version}", m.task_id, m.submission_id, m.version, m.event_ms, rec.node,
                            m.payload) for m in p.events]  # fmt: skip
    if type(p) is not TasksAdmitted:
        return [rec]
    at, node = rec.event_ms, rec.node
    admitted = ev.TaskAdmitted(node=p.node)
    out: list[EventRecord] = []
    for t in p.tasks:
        tid, sid = t.task_id, t.submission(rec)
        out.append(EventRecord(f"{tid}:1", tid, sid, 1, at, node, ev.TaskSubmitted(submission_id=sid, spec=t.spec)))
        out.append(EventRecord(f"{tid}:2", tid, sid, 2, at, node, admitted))
    return out


# ---- internal task inputs -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ClaimRequest:
    attempt: int
    worker: str
    claim_id: str


@dataclass(frozen=True, slots=True)
class StartReport:
    claim_id: str
    pid: int


@dataclass(frozen=True, slots=True)
class FinishReport:
    claim_id: str
    exit_code: int | None
    output_tail: str
    duration_ms: int
    reason: str
    # A run shorter than the worker's start-report delay: its start, not reported on its own, comes with
    # its end (the owner decides the start first, at started_ms). None: the start was reported before.
    started_ms: int | None = None
    pid: int | None = None


@dataclass(frozen=True, slots=True)
class WatchPrerequisite:
    dependent: str


@dataclass(frozen=True, slots=True)
class PrerequisiteEnded:
    prerequisite: str
    succeeded: bool
    outcome: str


@dataclass(frozen=True, slots=True)
class TimerFired:
    purpose: str


@dataclass(frozen=True, slots=True)
class CancelRequest:
    reason: str


@dataclass(frozen=True, slots=True)
class ReprioritizeRequest:
    priority: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    claim_id: str


@dataclass(frozen=True, slots=True)
class ReleaseClaim:
    claim_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Promote:
    """From the batcher: the task is among the top K ready ones; its owner queues it in `lane` if it is
    still READY, and ignores it otherwise (a second promotion, a task cancelled since)."""

    lane: str


@dataclass(frozen=True, slots=True)
class LimitExceeded:
    """From a resource manager node (streams/resources.py): the claim's run is over a limit; the task's
    owner records it (TaskLimitExceeded) and the claim's worker kills the run."""

    claim_id: str
    limit: str
    reason: str
    watcher: str


@dataclass(frozen=True, slots=True)
class HolderGone:
    """From a worker started again under the index of one whose process is gone (streams/worker.py
    release_predecessor): `worker`, the dead holder, held this claim. Its owner expires the lease now, as the
    lease timer would have once it ran out (a running task's expiry counts towards the limit), if the
    claim is still the task's and `worker`'s."""

    claim_id: str
    worker: str
    reason: str


@dataclass(frozen=True, slots=True)
class Inputs:
    """Several inputs of one partition in one record, in order: what one worker sent at the same moment
    (claims, reports, heartbeats of its tasks). Members are never packs themselves."""

    items: tuple[InputRecord, ...]


InputBody = (
    Inputs
    | ClaimRequest
    | StartReport
    | FinishReport
    | WatchPrerequisite
    | PrerequisiteEnded
    | TimerFired
    | CancelRequest
    | ReprioritizeRequest
    | Heartbeat
    | ReleaseClaim
    | Schedule
    | Promote
    | LimitExceeded
    | HolderGone
)


@dataclass(frozen=True, slots=True)
class InputRecord:
    input_id: str
    task_id: str
    sent_ms: int
    sender: str
    body: InputBody


def task_inputs(rec: InputRecord) -> list[InputRecord]:
    """The inputs a task-inputs record stands for, in order."""
    return list(rec.body.items) if type(rec.body) is Inputs else [rec]


def pack_inputs(recs: list[InputRecord], sender: str) -> InputRecord:
    """Inputs of one partition as one record, keyed by the first one's task."""
    first = recs[0]
    return InputRecord(f"{first.input_id}+{len(recs)}", first.task_id, first.sent_ms, sender, Inputs(tuple(recs)))


# ---- queue topic --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class QueuedTask:
    task_id: str
    attempt: int
    lane: str
    queued_ms: int
    spec: TaskSpec
    # Further tasks of the same partition queued in the same step, in order: one record stands for all
    # of them (the queue's records per task were a cost of the hot path). Members have none of their own.
    also: tuple[QueuedTask, ...] = ()


def queued_tasks(rec: QueuedTask) -> list[QueuedTask]:
    """The tasks a queue record stands for, in order."""
    if not rec.also:
        return [rec]
    return [QueuedTask(rec.task_id, rec.attempt, rec.lane, rec.queued_ms, rec.spec), *rec.also]


def pack_queued(recs: list[QueuedTask]) -> QueuedTask:
    """Queue records of one partition as one, keyed by the first one's task."""
    first = recs[0]
    return QueuedTask(first.task_id, first.attempt, first.lane, first.queued_ms, first.spec, tuple(recs[1:]))


NS = "io.taskstream."
COMMAND_BODIES: dict[str, type] = {
    NS + "SubmitDag": SubmitDag,
    NS + "CancelTask": CancelTaskRequest,
    NS + "ReprioritizeTask": ReprioritizeTaskRequest,
    NS + "Schedule": Schedule,
    NS + "SetTenant": SetTenant,
}
EVENT_PAYLOADS: dict[str, type] = {NS + cls.__name__: cls for cls in ev.EVENT_TYPES} | {
    NS + "SubmissionAccepted": SubmissionAccepted,
    NS + "SubmissionRejected": SubmissionRejected,
    NS + "TasksAdmitted": TasksAdmitted,
    NS + "TaskEvents": TaskEvents,
    NS + "TenantSet": TenantSet,
}
INPUT_BODIES: dict[str, type] = {
    NS + cls.__name__: cls
    for cls in (
        Inputs,
        ClaimRequest,
        StartReport,
        FinishReport,
        WatchPrerequisite,
        PrerequisiteEnded,
        TimerFired,
        CancelRequest,
        ReprioritizeRequest,
        Heartbeat,
        ReleaseClaim,
        Schedule,
        Promote,
        LimitExceeded,
        HolderGone,
    )
}
