"""Event payloads: immutable facts about one task, named in the past tense.

The envelope (event id, task id, version, time, node) is added by whoever writes the event to the
log; the payload is what the state machine decides and folds. Field names match schemas/avro.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskstream.core.model import TaskSpec


@dataclass(frozen=True, slots=True)
class TaskSubmitted:
    submission_id: str
    spec: TaskSpec


@dataclass(frozen=True, slots=True)
class TaskAdmitted:
    node: str


@dataclass(frozen=True, slots=True)
class TaskRejected:
    reason: str


@dataclass(frozen=True, slots=True)
class TaskReady:
    reason: str
    # Ready again because its claim ended without a run's outcome (a lease expired, a worker handed it
    # back): it keeps its place among the ready, its deadline as before, rather than going behind every
    # task that became ready while it was out. A retry after a failure is ranked anew.
    handed_back: bool = False


@dataclass(frozen=True, slots=True)
class TaskQueued:
    attempt: int
    lane: str


@dataclass(frozen=True, slots=True)
class TaskClaimed:
    attempt: int
    worker: str
    claim_id: str


@dataclass(frozen=True, slots=True)
class ClaimRejected:
    attempt: int
    worker: str
    claim_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class TaskStarted:
    claim_id: str
    worker: str
    pid: int


@dataclass(frozen=True, slots=True)
class TaskHeartbeat:
    claim_id: str


@dataclass(frozen=True, slots=True)
class TaskSucceeded:
    claim_id: str
    exit_code: int
    output_tail: str
    duration_ms: int


@dataclass(frozen=True, slots=True)
class TaskFailed:
    claim_id: str
    exit_code: int | None
    output_tail: str
    duration_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class CompletionRejected:
    claim_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class TaskRetryScheduled:
    next_attempt: int
    due_ms: int
    backoff_ms: int


@dataclass(frozen=True, slots=True)
class TaskTimedOut:
    claim_id: str
    cap_ms: int


@dataclass(frozen=True, slots=True)
class TaskCancelled:
    reason: str


@dataclass(frozen=True, slots=True)
class TaskReprioritized:
    old_priority: int
    new_priority: int


@dataclass(frozen=True, slots=True)
class TaskDeadLettered:
    reason: str
    attempts: int


@dataclass(frozen=True, slots=True)
class TaskLeaseExpired:
    """The claim's lease ran out without a report or heartbeat (its worker died, hung or lost the
    network): the claim is fenced, and anything reported under it later is refused."""

    claim_id: str
    worker: str
    attempt: int
    reason: str


@dataclass(frozen=True, slots=True)
class TaskReleased:
    """The worker holding the claim gave the task back unfinished (it is stopping): the claim is
    fenced and the task runs again, without using up a retry."""

    claim_id: str
    worker: str
    reason: str


@dataclass(frozen=True, slots=True)
class TaskLimitExceeded:
    """The resource manager node `watcher` found the run of the claim over a limit (memory, or its
    execution cap with the run still going): its worker kills it, and reports how it ended."""

    claim_id: str
    worker: str
    watcher: str
    limit: str
    reason: str


@dataclass(frozen=True, slots=True)
class TaskUnqueued:
    """A queued attempt nobody had claimed was taken back (the task was reprioritized while queued): the
    task is ready again, ranked by its new priority and its deadline as before, and the attempt's number
    is given back (the next queuing has it again). The queue record still out there is refused when it
    is claimed, unless the task is queued again by then, when either record's claim may win."""

    attempt: int
    reason: str


Event = (
    TaskSubmitted
    | TaskAdmitted
    | TaskRejected
    | TaskReady
    | TaskQueued
    | TaskClaimed
    | ClaimRejected
    | TaskStarted
    | TaskHeartbeat
    | TaskSucceeded
    | TaskFailed
    | CompletionRejected
    | TaskRetryScheduled
    | TaskTimedOut
    | TaskCancelled
    | TaskReprioritized
    | TaskDeadLettered
    | TaskLeaseExpired
    | TaskReleased
    | TaskLimitExceeded
    | TaskUnqueued
)

EVENT_TYPES: tuple[type, ...] = Event.__args__  # type: ignore[attr-defined]
