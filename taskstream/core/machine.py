"""The task lifecycle: one transition table, `decide` (command -> events or rejection) and `evolve`.

Agents and projections import this module and nothing else decides a task's status. `decide` never
mutates; `evolve` is the only place state changes, and replaying the log through it rebuilds any state.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, fields
from functools import singledispatch
from typing import Any

from taskstream.core import commands as c
from taskstream.core import events as e
from taskstream.core.backoff import compute_backoff
from taskstream.core.model import TERMINAL, Claim, Status, TaskState

S = Status
_LIVE = frozenset(Status) - TERMINAL - {S.NEW}

# Which statuses each command may be decided from. Anything else is a rejection.
TRANSITIONS: dict[type, frozenset[Status]] = {
    c.SubmitTask: frozenset({S.NEW}),
    c.AdmitTask: frozenset({S.SUBMITTED}),
    c.RejectTask: frozenset({S.SUBMITTED}),
    c.MarkReady: frozenset({S.WAITING}),
    c.QueueTask: frozenset({S.READY}),
    c.ClaimTask: frozenset({S.QUEUED}),
    c.StartTask: frozenset({S.CLAIMED}),
    c.FinishTask: frozenset({S.CLAIMED, S.RUNNING}),
    c.RetryTask: frozenset({S.RETRY_WAIT}),
    c.CancelTask: _LIVE,
    c.ReprioritizeTask: frozenset({S.SUBMITTED, S.WAITING, S.READY, S.QUEUED, S.RETRY_WAIT}),
    c.ExpireLease: frozenset({S.CLAIMED, S.RUNNING}),
    c.ReleaseTask: frozenset({S.CLAIMED, S.RUNNING}),
    c.EnforceLimit: frozenset({S.CLAIMED, S.RUNNING}),
    c.UnqueueTask: frozenset({S.QUEUED}),
}
FENCED_KEPT = 8  # how many expired claims a task remembers (to refuse their late reports by name)

_VERBS: dict[type, str] = {
    c.SubmitTask: "submit",
    c.AdmitTask: "admit",
    c.RejectTask: "reject",
    c.MarkReady: "mark ready",
    c.QueueTask: "queue",
    c.ClaimTask: "claim",
    c.StartTask: "start",
    c.FinishTask: "finish",
    c.RetryTask: "retry",
    c.CancelTask: "cancel",
    c.ReprioritizeTask: "reprioritize",
    c.ExpireLease: "expire the lease of",
    c.ReleaseTask: "release",
    c.EnforceLimit: "enforce a limit on",
    c.UnqueueTask: "unqueue",
}


@dataclass(frozen=True, slots=True)
class Rejection:
    """A command that may not happen. Worded by one template; agents record it, never raise it."""

    task_id: str
    command: str
    status: Status
    detail: str = ""

    @property
    def message(self) -> str:
        base = f"cannot {self.command} task {self.task_id}: it is {self.status.value.lower()}"
        return f"{base} ({self.detail})" if self.detail else base


def _reject(state: TaskState, command: c.Command, detail: str = "") -> Rejection:
    return Rejection(state.task_id, _VERBS[type(command)], state.status, detail)


def decide(state: TaskState, command: c.Command, rand: float = 0.0) -> list[e.Event] | Rejection:
    """Return the events `command` causes on `state`, or why it may not happen.

    `rand` in [0, 1) is the injected randomness for retry jitter.
    """
    killed = _kill_report(state, command)
    if killed is not None:
        return killed
    refused = _refused_report(state, command)
    if refused is not None:
        return refused
    if state.status not in TRANSITIONS[type(command)]:
        if isinstance(command, c.ClaimTask) and (state.claim is None or state.claim.claim_id != command.claim_id):
            # a claimer always gets a verdict it can read from the log (a duplicate of the winner does not)
            why = f"task is {state.status.value.lower()}"
            return [e.ClaimRejected(command.attempt, command.worker, command.claim_id, why)]
        return _reject(state, command)
    match command:
        case c.SubmitTask(submission_id=sid, spec=spec):
            return [e.TaskSubmitted(submission_id=sid, spec=spec)]
        case c.AdmitTask(node=node):
            return [e.TaskAdmitted(node=node)]
        case c.RejectTask(reason=reason):
            return [e.TaskRejected(reason=reason)]
        case c.MarkReady(reason=reason, at_ms=at):
            nb = state.spec.not_before_ms if state.spec else None
            if nb is not None and at < nb:
                return _reject(state, command, f"not before {nb}")
            return [e.TaskReady(reason=reason)]
        case c.QueueTask(lane=lane):
            return [e.TaskQueued(attempt=state.attempt + 1, lane=lane)]
        case c.ClaimTask(attempt=attempt, worker=worker, claim_id=cid):
            if attempt != state.attempt:
                return [e.ClaimRejected(attempt, worker, cid, f"attempt {attempt} is not current ({state.attempt})")]
            return [e.TaskClaimed(attempt=attempt, worker=worker, claim_id=cid)]
        case c.StartTask(claim_id=cid, pid=pid):
            assert state.claim is not None
            if cid != state.claim.claim_id:
                return [e.CompletionRejected(cid, f"claim {cid} is fenced by {state.claim.claim_id}")]
            return [e.TaskStarted(claim_id=cid, worker=state.claim.worker, pid=pid)]
        case c.FinishTask(claim_id=cid, exit_code=code, output_tail=tail, duration_ms=dur, reason=why, at_ms=at):
            return _finish(state, cid, code, tail, dur, why, at, rand)
        case c.RetryTask(at_ms=at):
            if state.retry_due_ms is not None and at < state.retry_due_ms:
                return _reject(state, command, f"retry is due at {state.retry_due_ms}")
            return [e.TaskReady(reason=f"retry {state.attempt + 1} due")]
        case c.CancelTask(reason=reason):
            return [e.TaskCancelled(reason=reason)]
        case c.ReprioritizeTask(priority=p):
            changed = e.TaskReprioritized(old_priority=state.priority, new_priority=p)
            if state.status is S.QUEUED and p != state.priority:  # taken back, to be ranked again
                why = f"reprioritized from {state.priority} to {p} while queued: ranked again"
                return [changed, e.TaskUnqueued(attempt=state.attempt, reason=why)]
            return [changed]
        case c.UnqueueTask(reason=why):
            return [e.TaskUnqueued(attempt=state.attempt, reason=why)]
        case c.ExpireLease(claim_id=cid, limit=limit):
            return _expire(state, command, cid, limit)
        case c.ReleaseTask(claim_id=cid, reason=why):
            if state.claim is None or state.claim.claim_id != cid:
                return _reject(state, command, f"its claim is {state.claim.claim_id if state.claim else 'none'}")
            back = e.TaskReady(f"released by its worker: {why}", handed_back=True)
            return [e.TaskReleased(cid, state.claim.worker, why), back]
        case c.EnforceLimit(claim_id=cid, limit=limit, reason=why, watcher=watcher):
            if state.claim is None or state.claim.claim_id != cid:
                return _reject(state, command, f"its claim is {state.claim.claim_id if state.claim else 'none'}")
            if state.limited_claim == cid:
                return _reject(state, command, f"the kill of claim {cid} was ordered already")
            return [e.TaskLimitExceeded(cid, state.claim.worker, watcher, limit, why)]
    raise TypeError(f"unknown command {command!r}")  # pragma: no cover


def _kill_report(state: TaskState, command: c.Command) -> list[e.Event] | None:
    """The end of the run a cancellation interrupted: its worker killed it and says how it ended. Recorded
    as the attempt's failure; the task stays cancelled. Any other report on a cancelled task is refused."""
    if state.status is not S.CANCELLED or state.cancelled_claim is None:
        return None
    if not isinstance(command, c.FinishTask | c.StartTask | c.ReleaseTask) or command.claim_id != state.cancelled_claim:
        return None
    if not isinstance(command, c.FinishTask):
        return [e.CompletionRejected(command.claim_id, "the task was cancelled")]
    why = command.reason or f"ended after the task was cancelled (exit status {command.exit_code})"
    return [e.TaskFailed(command.claim_id, command.exit_code, command.output_tail, command.duration_ms, why)]


def _refused_report(state: TaskState, command: c.Command) -> list[e.Event] | None:
    """A start or finish report under a claim whose lease expired, or that another claim superseded:
    refused and recorded, whatever the task's status (it is never applied)."""
    if not isinstance(command, c.StartTask | c.FinishTask | c.ReleaseTask):
        return None
    cid = command.claim_id
    if cid in state.fenced_claims:
        return [e.CompletionRejected(cid, f"the lease of claim {cid} expired; the task went on without it")]
    if state.claim is not None and cid != state.claim.claim_id:
        return [e.CompletionRejected(cid, f"claim {cid} is fenced by {state.claim.claim_id}")]
    return None


def _expire(state: TaskState, command: c.Command, cid: str, limit: int) -> list[e.Event] | Rejection:
    claim = state.claim
    if claim is None or claim.claim_id != cid:
        return _reject(state, command, f"its claim is {claim.claim_id if claim else 'none'}, not {cid}")
    why = f"the lease of claim {cid} (worker {claim.worker}, attempt {claim.attempt}) expired"
    expired = e.TaskLeaseExpired(claim_id=cid, worker=claim.worker, attempt=claim.attempt, reason=why)
    # Only a run counts towards the limit (a task whose runs take their workers down): a claim that never
    # started expires when its worker dies with claims waiting for a slot, through no fault of the task.
    if state.status is S.RUNNING and state.lease_expiries + 1 > limit:
        gone = f"{why}; {state.lease_expiries + 1} lease(s) expired, the limit is {limit}"
        return [expired, e.TaskDeadLettered(reason=gone, attempts=state.attempt)]
    return [expired, e.TaskReady(f"{why}: run again", handed_back=True)]


def _finish(
    state: TaskState, cid: str, code: int | None, tail: str, dur: int, why: str, at: int, rand: float
) -> list[e.Event]:
    assert state.claim is not None and state.spec is not None
    if cid != state.claim.claim_id:
        return [e.CompletionRejected(cid, f"claim {cid} is fenced by {state.claim.claim_id}")]
    if code == 0:
        return [e.TaskSucceeded(claim_id=cid, exit_code=0, output_tail=tail, duration_ms=dur)]
    reason = why or (f"exit status {code}" if code is not None else "did not start")
    failed = e.TaskFailed(claim_id=cid, exit_code=code, output_tail=tail, duration_ms=dur, reason=reason)
    # retries count failed runs, not attempts: a release or an expired lease also raises the attempt
    failures = state.failures + 1
    if failures <= state.spec.retry_limit:
        delay = compute_backoff(failures, state.spec.backoff, rand)
        return [failed, e.TaskRetryScheduled(next_attempt=state.attempt + 1, due_ms=at + delay, backoff_ms=delay)]
    why = f"{reason}; {failures} attempt(s) failed, retry limit reached"
    return [failed, e.TaskDeadLettered(reason=why, attempts=state.attempt)]


@singledispatch
def _changes(event: object, state: TaskState) -> dict[str, Any]:
    """The fields an event changes (evolve applies them in one copy, with the version)."""
    raise TypeError(f"unknown event {event!r}")


@_changes.register
def _(ev: e.TaskSubmitted, s: TaskState) -> dict[str, Any]:
    return dict(status=S.SUBMITTED, spec=ev.spec, submission_id=ev.submission_id, priority=ev.spec.priority)


@_changes.register
def _(ev: e.TaskAdmitted, s: TaskState) -> dict[str, Any]:
    return dict(status=S.WAITING, reason="")


@_changes.register
def _(ev: e.TaskRejected, s: TaskState) -> dict[str, Any]:
    return dict(status=S.REJECTED, reason=ev.reason)


@_changes.register
def _(ev: e.TaskReady, s: TaskState) -> dict[str, Any]:
    return dict(status=S.READY, reason=ev.reason, claim=None, retry_due_ms=None)


@_changes.register
def _(ev: e.TaskQueued, s: TaskState) -> dict[str, Any]:
    return dict(status=S.QUEUED, attempt=ev.attempt, lane=ev.lane)


@_changes.register
def _(ev: e.TaskClaimed, s: TaskState) -> dict[str, Any]:
    return dict(status=S.CLAIMED, claim=Claim(ev.attempt, ev.worker, ev.claim_id))


@_changes.register
def _(ev: e.TaskStarted, s: TaskState) -> dict[str, Any]:
    return dict(status=S.RUNNING)


@_changes.register
def _(ev: e.TaskSucceeded, s: TaskState) -> dict[str, Any]:
    return dict(status=S.SUCCEEDED, exit_code=ev.exit_code, reason="")


@_changes.register
def _(ev: e.TaskFailed, s: TaskState) -> dict[str, Any]:
    if s.status is S.CANCELLED:  # the cancelled run's end: the task stays cancelled, for the same reason
        return dict(exit_code=ev.exit_code, cancelled_claim=None)
    return dict(exit_code=ev.exit_code, reason=ev.reason, failures=s.failures + 1)


@_changes.register
def _(ev: e.TaskRetryScheduled, s: TaskState) -> dict[str, Any]:
    return dict(status=S.RETRY_WAIT, retry_due_ms=ev.due_ms, claim=None)


@_changes.register
def _(ev: e.TaskDeadLettered, s: TaskState) -> dict[str, Any]:
    return dict(status=S.DEAD_LETTERED, reason=ev.reason, claim=None)


@_changes.register
def _(ev: e.TaskCancelled, s: TaskState) -> dict[str, Any]:
    running = s.claim.claim_id if s.claim is not None and s.status in (S.CLAIMED, S.RUNNING) else None
    return dict(status=S.CANCELLED, reason=ev.reason, claim=None, cancelled_claim=running)


@_changes.register
def _(ev: e.TaskReprioritized, s: TaskState) -> dict[str, Any]:
    return dict(priority=ev.new_priority)


@_changes.register
def _(ev: e.TaskLeaseExpired, s: TaskState) -> dict[str, Any]:
    fenced = (*s.fenced_claims, ev.claim_id)[-FENCED_KEPT:]
    ran = s.status is S.RUNNING
    return dict(claim=None, fenced_claims=fenced, lease_expiries=s.lease_expiries + ran, reason=ev.reason)


@_changes.register
def _(ev: e.TaskReleased, s: TaskState) -> dict[str, Any]:
    return dict(claim=None, fenced_claims=(*s.fenced_claims, ev.claim_id)[-FENCED_KEPT:], reason=ev.reason)


@_changes.register
def _(ev: e.TaskLimitExceeded, s: TaskState) -> dict[str, Any]:
    return dict(limited_claim=ev.claim_id)


@_changes.register
def _(ev: e.TaskUnqueued, s: TaskState) -> dict[str, Any]:
    return dict(status=S.READY, attempt=ev.attempt - 1, reason=ev.reason)


@_changes.register(e.TaskTimedOut)
@_changes.register(e.TaskHeartbeat)
@_changes.register(e.ClaimRejected)
@_changes.register(e.CompletionRejected)
def _(ev: object, s: TaskState) -> dict[str, Any]:
    # Recorded for auditors; the consequence (failure, retry) arrives as its own event.
    return {}


# A state's fields in order, read in one call: a new state is built from them positionally. This is
# dataclasses.replace without its walk over the fields' definitions on every call (a third of the cost
# of an evolve, and every agent folds ~7 events per task).
_FIELDS = tuple(f.name for f in fields(TaskState))
_AT = {name: i for i, name in enumerate(_FIELDS)}
_VALUES = operator.attrgetter(*_FIELDS)
_VERSION, _UPDATED = _AT["version"], _AT["updated_ms"]


def evolve(state: TaskState, event: e.Event, at_ms: int = 0) -> TaskState:
    """Fold one event into the state. Every event, recorded refusals included, advances the version."""
    values = list(_VALUES(state))
    for name, value in _changes(event, state).items():
        values[_AT[name]] = value
    values[_VERSION] = state.version + 1
    values[_UPDATED] = max(state.updated_ms, at_ms)
    return TaskState(*values)


def fold(task_id: str, history: list[e.Event]) -> TaskState:
    """Rebuild a task's state from its history (replay)."""
    state = TaskState(task_id=task_id)
    for ev in history:
        state = evolve(state, ev)
    return state


def run(state: TaskState, command: c.Command, rand: float = 0.0) -> tuple[TaskState, list[e.Event] | Rejection]:
    """decide then evolve: the new state and what was decided. The convenience every agent uses."""
    decided = decide(state, command, rand)
    if isinstance(decided, Rejection):
        return state, decided
    for ev in decided:
        state = evolve(state, ev, getattr(command, "at_ms", 0))
    return state, decided
