"""Typed records for the Avro envelopes. Task event payloads are the core's own classes.

Avro record names map to Python classes through the tables at the bottom; a test checks every class
and every schema agree field by field.
"""

from __future__ import annotations

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


CommandBody = SubmitDag | CancelTaskRequest | ReprioritizeTaskRequest


@dataclass(frozen=True, slots=True)
class CommandRecord:
    command_id: str
    issued_ms: int
    body: CommandBody
    issuer: str = ""


# ---- events topic -------------------------------------------------------------------------------
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


Payload = ev.Event | SubmissionAccepted | SubmissionRejected


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


InputBody = (
    ClaimRequest
    | StartReport
    | FinishReport
    | WatchPrerequisite
    | PrerequisiteEnded
    | TimerFired
    | CancelRequest
    | ReprioritizeRequest
)


@dataclass(frozen=True, slots=True)
class InputRecord:
    input_id: str
    task_id: str
    sent_ms: int
    sender: str
    body: InputBody


# ---- queue topic --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class QueuedTask:
    task_id: str
    attempt: int
    lane: str
    queued_ms: int
    spec: TaskSpec


NS = "io.taskstream."
COMMAND_BODIES: dict[str, type] = {
    NS + "SubmitDag": SubmitDag,
    NS + "CancelTask": CancelTaskRequest,
    NS + "ReprioritizeTask": ReprioritizeTaskRequest,
}
EVENT_PAYLOADS: dict[str, type] = {NS + cls.__name__: cls for cls in ev.EVENT_TYPES} | {
    NS + "SubmissionAccepted": SubmissionAccepted,
    NS + "SubmissionRejected": SubmissionRejected,
}
INPUT_BODIES: dict[str, type] = {
    NS + cls.__name__: cls
    for cls in (
        ClaimRequest,
        StartReport,
        FinishReport,
        WatchPrerequisite,
        PrerequisiteEnded,
        TimerFired,
        CancelRequest,
        ReprioritizeRequest,
    )
}
