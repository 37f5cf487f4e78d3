"""Task commands: requests to change one task, named in the imperative.

Each is decided by the single owner of the task's partition (see machine.decide). `at_ms` is the
command's time, given by the caller: the core never reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from taskstream.core.model import TaskSpec


@dataclass(frozen=True, slots=True)
class SubmitTask:
    submission_id: str
    spec: TaskSpec
    at_ms: int


@dataclass(frozen=True, slots=True)
class AdmitTask:
    node: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class RejectTask:
    reason: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class MarkReady:
    reason: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class QueueTask:
    lane: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class ClaimTask:
    attempt: int
    worker: str
    claim_id: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class StartTask:
    claim_id: str
    pid: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class FinishTask:
    """A worker's report that the claimed attempt ended. exit_code None: it never ran (spawn error)."""

    claim_id: str
    exit_code: int | None
    output_tail: str
    duration_ms: int
    reason: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class RetryTask:
    at_ms: int


@dataclass(frozen=True, slots=True)
class CancelTask:
    reason: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class ReprioritizeTask:
    priority: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class ExpireLease:
    """The owner saw the lease of `claim_id` run out (time is the input's: the core reads no clock).
    `limit`: how many expiries a task may have before it is dead-lettered instead of run again."""

    claim_id: str
    at_ms: int
    limit: int


@dataclass(frozen=True, slots=True)
class ReleaseTask:
    """The claim's worker gives the task back (it is draining); it runs again elsewhere."""

    claim_id: str
    reason: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class EnforceLimit:
    """A resource manager node found the claim's run over a limit (taskstream/core/resources.py): its
    worker is told to kill it. The run's end still comes from the worker, as a finish report."""

    claim_id: str
    limit: str
    reason: str
    watcher: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class UnqueueTask:
    """Take a queued, unclaimed task back to READY (its attempt's number given back), e.g. to queue it
    in another lane: the lane it is queued in has no live reader."""

    reason: str
    at_ms: int


Command = (
    SubmitTask
    | AdmitTask
    | RejectTask
    | MarkReady
    | QueueTask
    | ClaimTask
    | StartTask
    | FinishTask
    | RetryTask
    | CancelTask
    | ReprioritizeTask
    | ExpireLease
    | ReleaseTask
    | EnforceLimit
    | UnqueueTask
)
