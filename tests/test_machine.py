"""The task lifecycle: given a history, when a command arrives, then these events (or this rejection)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskstream.core import commands as c
from taskstream.core import events as e
from taskstream.core.backoff import compute_backoff
from taskstream.core.machine import TRANSITIONS, Rejection, decide, evolve, fold, run
from taskstream.core.model import TERMINAL, Backoff, Status, TaskSpec, TaskState

SPEC = TaskSpec(
    name="build",
    tenant="acme",
    argv=("make",),
    retry_limit=1,
    backoff=Backoff(initial_ms=1000, factor=2.0, max_ms=10_000),
)
T = "task-1"

SUBMITTED = [e.TaskSubmitted("sub-1", SPEC)]
WAITING = SUBMITTED + [e.TaskAdmitted("node-a")]
READY = WAITING + [e.TaskReady("no prerequisites")]
QUEUED = READY + [e.TaskQueued(1, "default")]
CLAIMED = QUEUED + [e.TaskClaimed(1, "w1", "claim-1")]
RUNNING = CLAIMED + [e.TaskStarted("claim-1", "w1", 4242)]


def given_(history: list[e.Event]) -> TaskState:
    return fold(T, history)


@pytest.mark.parametrize(
    ("history", "command", "expected"),
    [
        ([], c.SubmitTask("sub-1", SPEC, 0), [e.TaskSubmitted("sub-1", SPEC)]),
        (SUBMITTED, c.AdmitTask("node-a", 1), [e.TaskAdmitted("node-a")]),
        (SUBMITTED, c.RejectTask("closes a cycle", 1), [e.TaskRejected("closes a cycle")]),
        (WAITING, c.MarkReady("every prerequisite succeeded", 2), [e.TaskReady("every prerequisite succeeded")]),
        (READY, c.QueueTask("default", 3), [e.TaskQueued(1, "default")]),
        (QUEUED, c.ClaimTask(1, "w1", "claim-1", 4), [e.TaskClaimed(1, "w1", "claim-1")]),
        (
            QUEUED,
            c.ClaimTask(2, "w1", "claim-9", 4),
            [e.ClaimRejected(2, "w1", "claim-9", "attempt 2 is not current (1)")],
        ),
        (CLAIMED, c.StartTask("claim-1", 4242, 5), [e.TaskStarted("claim-1", "w1", 4242)]),
        (RUNNING, c.FinishTask("claim-1", 0, "ok\n", 120, "", 6), [e.TaskSucceeded("claim-1", 0, "ok\n", 120)]),
        (
            RUNNING,
            c.FinishTask("claim-1", 2, "boom", 50, "", 6_000),
            [e.TaskFailed("claim-1", 2, "boom", 50, "exit status 2"), e.TaskRetryScheduled(2, 7_000, 1_000)],
        ),
        (
            RUNNING,
            c.FinishTask("claim-0", 0, "", 1, "", 6),
            [e.CompletionRejected("claim-0", "claim claim-0 is fenced by claim-1")],
        ),
        (READY, c.CancelTask("not needed", 7), [e.TaskCancelled("not needed")]),
        (WAITING, c.ReprioritizeTask(9, 7), [e.TaskReprioritized(0, 9)]),
    ],
)
def test_decide(history: list[e.Event], command: c.Command, expected: list[e.Event]) -> None:
    assert decide(given_(history), command) == expected


def test_second_failure_past_the_retry_limit_dead_letters() -> None:
    history = RUNNING + [
        e.TaskFailed("claim-1", 1, "", 1, "exit status 1"),
        e.TaskRetryScheduled(2, 10, 1000),
        e.TaskReady("retry 2 due"),
        e.TaskQueued(2, "default"),
        e.TaskClaimed(2, "w1", "claim-2"),
        e.TaskStarted("claim-2", "w1", 1),
    ]
    state = given_(history)
    assert state.attempt == 2
    out = decide(state, c.FinishTask("claim-2", 1, "", 1, "", 20))
    assert isinstance(out, list) and isinstance(out[-1], e.TaskDeadLettered)
    assert out[-1].attempts == 2
    assert "retry limit reached" in out[-1].reason


@pytest.mark.parametrize(
    ("history", "command", "message"),
    [
        (
            RUNNING + [e.TaskSucceeded("claim-1", 0, "", 1)],
            c.CancelTask("", 9),
            "cannot cancel task task-1: it is succeeded",
        ),
        (RUNNING, c.ReprioritizeTask(3, 9), "cannot reprioritize task task-1: it is running"),
        (CLAIMED, c.ClaimTask(1, "w1", "claim-1", 9), "cannot claim task task-1: it is claimed"),
        ([], c.AdmitTask("n", 9), "cannot admit task task-1: it is new"),
    ],
)
def test_rejections_are_worded_by_one_template(history: list[e.Event], command: c.Command, message: str) -> None:
    out = decide(given_(history), command)
    assert isinstance(out, Rejection)
    assert out.message == message


def test_a_claim_that_cannot_be_granted_gets_a_recorded_verdict() -> None:
    """A stale or late claimer loses, in the log, so it learns it lost (a duplicate of the winner's
    request is refused silently: the winner already has its TaskClaimed)."""
    assert decide(given_(READY), c.ClaimTask(1, "w", "x", 9)) == [e.ClaimRejected(1, "w", "x", "task is ready")]
    assert decide(given_(CLAIMED), c.ClaimTask(1, "w2", "claim-2", 9)) == [
        e.ClaimRejected(1, "w2", "claim-2", "task is claimed")
    ]


LEASED = CLAIMED + [e.TaskStarted("claim-1", "w1", 77)]
EXPIRED = LEASED + [
    e.TaskLeaseExpired("claim-1", "w1", 1, "the lease of claim claim-1 (worker w1, attempt 1) expired"),
    e.TaskReady("the lease of claim claim-1 (worker w1, attempt 1) expired: run again", handed_back=True),
]


def test_an_expired_lease_makes_the_task_visible_again_with_the_attempt_raised() -> None:
    out = decide(given_(LEASED), c.ExpireLease("claim-1", 50, limit=3))
    assert out == EXPIRED[len(LEASED) :]
    state = given_(EXPIRED)
    assert state.status is Status.READY and state.claim is None and state.lease_expiries == 1
    queued = decide(state, c.QueueTask("default", 51))
    assert queued == [e.TaskQueued(2, "default")]


def test_reports_under_an_expired_lease_are_refused_and_recorded() -> None:
    state = given_(EXPIRED + [e.TaskQueued(2, "default"), e.TaskClaimed(2, "w2", "claim-2")])
    for late in (c.FinishTask("claim-1", 0, "", 1, "", 60), c.StartTask("claim-1", 78, 60)):
        out = decide(state, late)
        assert isinstance(out, list) and len(out) == 1 and isinstance(out[0], e.CompletionRejected)
        assert "lease of claim claim-1 expired" in out[0].reason
    done = given_(
        [*EXPIRED, e.TaskQueued(2, "d"), e.TaskClaimed(2, "w2", "claim-2"), e.TaskSucceeded("claim-2", 0, "", 1)]
    )
    late = decide(done, c.FinishTask("claim-1", 0, "", 1, "", 70))  # even after the task ended
    assert isinstance(late, list) and isinstance(late[0], e.CompletionRejected)


def test_a_released_task_runs_again_without_using_a_retry() -> None:
    out = decide(given_(LEASED), c.ReleaseTask("claim-1", "worker stopping", 40))
    assert out == [
        e.TaskReleased("claim-1", "w1", "worker stopping"),
        e.TaskReady("released by its worker: worker stopping", handed_back=True),
    ]
    state = given_([*LEASED, *out])
    assert state.claim is None and state.lease_expiries == 0 and "claim-1" in state.fenced_claims
    assert isinstance(decide(state, c.FinishTask("claim-1", 0, "", 1, "", 41))[0], e.CompletionRejected)  # type: ignore[index]


def test_cancelling_a_running_task_records_how_its_killed_run_ended_and_nothing_else() -> None:
    cancelled = [*RUNNING, e.TaskCancelled("not needed")]
    state = given_(cancelled)
    assert state.status is Status.CANCELLED and state.cancelled_claim == "claim-1" and state.claim is None
    kill = c.FinishTask("claim-1", -15, "bye", 30, "killed: cancelled (not needed)", 50)
    out = decide(state, kill)
    assert out == [e.TaskFailed("claim-1", -15, "bye", 30, "killed: cancelled (not needed)")]
    after = given_([*cancelled, *out])
    assert after.status is Status.CANCELLED and after.reason == "not needed" and after.cancelled_claim is None
    assert isinstance(decide(after, kill), Rejection)  # reported once
    assert decide(state, c.StartTask("claim-1", 7, 50)) == [e.CompletionRejected("claim-1", "the task was cancelled")]
    assert isinstance(decide(state, c.FinishTask("claim-0", 0, "", 1, "", 50)), Rejection)  # not its claim
    # a task cancelled before it was claimed has no run to kill
    assert given_([*READY, e.TaskCancelled("early")]).cancelled_claim is None


def test_a_queued_task_reprioritized_is_taken_back_and_its_old_queue_record_is_refused() -> None:
    """Reprioritizing a queued, unclaimed task takes it back (TaskUnqueued): ready again, the attempt's
    number given back. A claim from the old queue record is refused while it is ready; queued again,
    the attempt has the same number and either record's claim may win, once."""
    out = decide(given_(QUEUED), c.ReprioritizeTask(5, 9))
    assert out == [e.TaskReprioritized(0, 5), e.TaskUnqueued(1, "reprioritized from 0 to 5 while queued: ranked again")]
    back = given_([*QUEUED, *out])
    assert (back.status, back.priority, back.attempt) == (Status.READY, 5, 0)
    stale = decide(back, c.ClaimTask(1, "w1", "claim-1", 10))
    assert stale == [e.ClaimRejected(1, "w1", "claim-1", "task is ready")]
    requeued = decide(back, c.QueueTask("default", 11))
    assert requeued == [e.TaskQueued(1, "default")]
    again = given_([*QUEUED, *out, *requeued])
    won = decide(again, c.ClaimTask(1, "w2", "claim-2", 12))
    assert won == [e.TaskClaimed(1, "w2", "claim-2")]
    loser = decide(given_([*QUEUED, *out, *requeued, *won]), c.ClaimTask(1, "w1", "claim-1", 13))
    assert loser == [e.ClaimRejected(1, "w1", "claim-1", "task is claimed")]
    # the same priority again changes nothing, and it stays queued
    assert decide(given_(QUEUED), c.ReprioritizeTask(0, 9)) == [e.TaskReprioritized(0, 0)]


def test_a_queued_task_is_unqueued_only_while_unclaimed_and_queued_again_with_its_number() -> None:
    """UnqueueTask (a move out of a lane nobody reads) takes a queued task back to READY with its
    attempt's number given back; queued again in another lane it keeps that number. A claimed task is
    not taken back."""
    out = decide(given_(QUEUED), c.UnqueueTask("moved from lane big to default", 9))
    assert out == [e.TaskUnqueued(1, "moved from lane big to default")]
    back = given_([*QUEUED, *out])
    assert (back.status, back.attempt) == (Status.READY, 0)
    assert decide(back, c.QueueTask("default", 10)) == [e.TaskQueued(1, "default")]
    assert isinstance(decide(given_(RUNNING), c.UnqueueTask("moved", 9)), Rejection)
    assert isinstance(decide(back, c.UnqueueTask("moved", 9)), Rejection)


def test_a_run_over_a_limit_is_ordered_killed_once_and_its_end_comes_from_its_worker() -> None:
    """The resource manager's order is recorded once per claim (a second watcher's is refused); the task
    stays running until its worker reports how the killed run ended, which fails the attempt as usual."""
    order = c.EnforceLimit("claim-1", "memory", "over its memory limit", "node-b", 40)
    out = decide(given_(RUNNING), order)
    assert out == [e.TaskLimitExceeded("claim-1", "w1", "node-b", "memory", "over its memory limit")]
    state = given_([*RUNNING, *out])
    assert state.status is Status.RUNNING and state.limited_claim == "claim-1"
    again = decide(state, replace(order, watcher="node-c"))
    assert isinstance(again, Rejection) and "ordered already" in again.message
    stale = decide(state, replace(order, claim_id="claim-0"))
    assert isinstance(stale, Rejection) and "its claim is claim-1" in stale.message
    assert isinstance(decide(given_(QUEUED), order), Rejection)  # nothing runs: nothing to kill
    ended = decide(state, c.FinishTask("claim-1", -9, "", 30, "killed: over its memory limit", 50))
    assert isinstance(ended, list) and ended[0] == e.TaskFailed("claim-1", -9, "", 30, "killed: over its memory limit")
    assert isinstance(ended[1], e.TaskRetryScheduled)


def test_a_stale_expiry_is_refused_and_expiries_past_the_limit_dead_letter() -> None:
    claimed = EXPIRED + [e.TaskQueued(2, "default"), e.TaskClaimed(2, "w2", "claim-2")]
    fresh = given_(claimed + [e.TaskStarted("claim-2", "w2", 78)])
    assert isinstance(decide(fresh, c.ExpireLease("claim-1", 80, limit=3)), Rejection)  # an old timer
    out = decide(fresh, c.ExpireLease("claim-2", 80, limit=1))
    assert isinstance(out, list) and isinstance(out[-1], e.TaskDeadLettered)
    assert "2 lease(s) expired, the limit is 1" in out[-1].reason


def test_a_lease_that_expires_before_its_task_started_is_not_held_against_the_task() -> None:
    """A worker that dies with claims waiting for a slot leaves them to expire: the task never ran, so
    however often that happens it runs again, and only runs count towards the limit."""
    history = list(CLAIMED)
    for n in range(1, 5):
        out = decide(given_(history), c.ExpireLease(f"claim-{n}", 10 * n, limit=1))
        assert isinstance(out, list) and isinstance(out[-1], e.TaskReady), out
        history += [*out, e.TaskQueued(n + 1, "default"), e.TaskClaimed(n + 1, "w1", f"claim-{n + 1}")]
    state = given_(history)
    assert state.lease_expiries == 0 and state.attempt == 5
    ran = given_([*history, e.TaskStarted("claim-5", "w1", 9)])
    out = decide(ran, c.ExpireLease("claim-5", 90, limit=1))
    assert isinstance(out, list) and isinstance(out[-1], e.TaskReady)  # the first run lost: within the limit
    assert given_([*history, e.TaskStarted("claim-5", "w1", 9), *out]).lease_expiries == 1


def test_releases_and_expired_leases_do_not_use_up_the_retries() -> None:
    """retry_limit counts failed runs: a task handed back by a stopping worker, or whose lease expired,
    still gets every retry it was given, and one past them is dead-lettered."""
    released = decide(given_(LEASED), c.ReleaseTask("claim-1", "worker stopping", 40))
    expired = [e.TaskLeaseExpired("claim-2", "w2", 2, "expired"), e.TaskReady("expired: run again", handed_back=True)]
    history = [*LEASED, *released, e.TaskQueued(2, "d"), e.TaskClaimed(2, "w2", "claim-2"),
               e.TaskStarted("claim-2", "w2", 5), *expired, e.TaskQueued(3, "d"), e.TaskClaimed(3, "w3", "claim-3"),
               e.TaskStarted("claim-3", "w3", 6)]  # fmt: skip
    out = decide(given_(history), c.FinishTask("claim-3", 2, "boom", 5, "", 60))
    assert isinstance(out, list) and out[-1] == e.TaskRetryScheduled(4, 60 + 1_000, 1_000)  # the first backoff
    history += [*out, e.TaskReady("retry 4 due"), e.TaskQueued(4, "d"), e.TaskClaimed(4, "w3", "claim-4"),
                e.TaskStarted("claim-4", "w3", 7)]  # fmt: skip
    out = decide(given_(history), c.FinishTask("claim-4", 2, "boom", 5, "", 70))
    assert isinstance(out, list) and isinstance(out[-1], e.TaskDeadLettered)
    assert out[-1].reason == "exit status 2; 2 attempt(s) failed, retry limit reached" and out[-1].attempts == 4


def test_not_before_holds_a_task_back_until_its_time() -> None:
    state = given_([e.TaskSubmitted("s", replace(SPEC, not_before_ms=5_000)), e.TaskAdmitted("n")])
    early = decide(state, c.MarkReady("no prerequisites", 4_999))
    assert isinstance(early, Rejection) and "not before 5000" in early.message
    assert decide(state, c.MarkReady("no prerequisites", 5_000)) == [e.TaskReady("no prerequisites")]


def test_retry_is_not_taken_before_it_is_due() -> None:
    state = given_(RUNNING + [e.TaskFailed("claim-1", 1, "", 1, "x"), e.TaskRetryScheduled(2, 9_000, 1_000)])
    assert isinstance(decide(state, c.RetryTask(8_999)), Rejection)
    assert decide(state, c.RetryTask(9_000)) == [e.TaskReady("retry 2 due")]


def test_every_command_has_a_transition_row() -> None:
    assert set(TRANSITIONS) == set(c.Command.__args__)  # type: ignore[attr-defined]


def test_backoff_grows_by_factor_and_is_capped() -> None:
    policy = Backoff(initial_ms=100, factor=3.0, max_ms=1_000, jitter=0.5)
    assert [compute_backoff(n, policy) for n in (1, 2, 3, 4)] == [100, 300, 900, 1000]
    assert compute_backoff(2, policy, rand=0.999) == 449
    with pytest.raises(ValueError):
        compute_backoff(0, policy)


# ---- properties -------------------------------------------------------------------------------------

ALL_COMMANDS = st.one_of(
    st.builds(c.SubmitTask, st.just("s"), st.just(SPEC), st.integers(0, 100)),
    st.builds(c.AdmitTask, st.just("n"), st.integers(0, 100)),
    st.builds(c.RejectTask, st.just("why"), st.integers(0, 100)),
    st.builds(c.MarkReady, st.just("ready"), st.integers(0, 100)),
    st.builds(c.QueueTask, st.just("default"), st.integers(0, 100)),
    st.builds(
        c.ClaimTask,
        st.integers(0, 3),
        st.sampled_from(["w1", "w2"]),
        st.sampled_from(["c1", "c2"]),
        st.integers(0, 100),
    ),
    st.builds(c.StartTask, st.sampled_from(["c1", "c2"]), st.integers(1, 9), st.integers(0, 100)),
    st.builds(
        c.FinishTask,
        st.sampled_from(["c1", "c2"]),
        st.sampled_from([0, 1, None]),
        st.just(""),
        st.integers(0, 9),
        st.just(""),
        st.integers(0, 100),
    ),
    st.builds(c.RetryTask, st.integers(0, 100_000)),
    st.builds(c.CancelTask, st.just("stop"), st.integers(0, 100)),
    st.builds(c.ReprioritizeTask, st.integers(-5, 5), st.integers(0, 100)),
    st.builds(c.ExpireLease, st.sampled_from(["c1", "c2"]), st.integers(0, 100), st.integers(0, 3)),
    st.builds(c.ReleaseTask, st.sampled_from(["c1", "c2"]), st.just("draining"), st.integers(0, 100)),
    st.builds(
        c.EnforceLimit,
        st.sampled_from(["c1", "c2"]),
        st.sampled_from(["memory", "execution_cap"]),
        st.just("over"),
        st.sampled_from(["n1", "n2"]),
        st.integers(0, 100),
    ),
)


def _drive(commands: list[c.Command]) -> tuple[TaskState, list[e.Event], list[TaskState]]:
    state = TaskState(task_id=T)
    history: list[e.Event] = []
    seen = [state]
    for cmd in commands:
        state, out = run(state, cmd, rand=0.5)
        if not isinstance(out, Rejection):
            history.extend(out)
        seen.append(state)
    return state, history, seen


@settings(max_examples=400)
@given(st.lists(ALL_COMMANDS, max_size=40))
def test_replaying_the_history_equals_the_state_built_live(commands: list[c.Command]) -> None:
    live, history, _ = _drive(commands)
    replayed = fold(T, history)
    assert replace(replayed, updated_ms=0) == replace(live, updated_ms=0)
    assert live.version == len(history)


@settings(max_examples=400)
@given(st.lists(ALL_COMMANDS, max_size=40))
def test_terminal_states_are_final(commands: list[c.Command]) -> None:
    _, _, states = _drive(commands)
    for i, s in enumerate(states):
        if s.status in TERMINAL:
            assert all(later.status == s.status for later in states[i:]), f"left {s.status} at step {i}"


@settings(max_examples=300)
@given(st.lists(ALL_COMMANDS, max_size=40))
def test_a_task_never_starts_without_a_claim_and_attempts_never_exceed_the_limit(commands: list[c.Command]) -> None:
    _, history, _ = _drive(commands)
    state = TaskState(task_id=T)
    failed = 0  # runs that failed, not counting the kill of a cancelled one
    for ev in history:
        failed += isinstance(ev, e.TaskFailed) and state.status is not Status.CANCELLED
        if isinstance(ev, e.TaskStarted):
            assert state.status is Status.CLAIMED and state.claim is not None
            assert ev.claim_id == state.claim.claim_id
        if isinstance(ev, e.TaskFailed) and state.status is Status.CANCELLED:  # the kill of a cancelled run
            assert ev.claim_id == state.cancelled_claim
        elif isinstance(ev, e.TaskStarted | e.TaskSucceeded | e.TaskFailed):  # only ever under the live claim
            assert state.claim is not None and ev.claim_id == state.claim.claim_id
            assert ev.claim_id not in state.fenced_claims, f"a report applied under the expired {ev.claim_id}"
        state = evolve(state, ev)
    # an expired lease or a release raises the attempt count without using up the task's retries
    lost = sum(isinstance(ev, e.TaskLeaseExpired | e.TaskReleased) for ev in history)
    assert state.attempt <= SPEC.retry_limit + 1 + lost
    assert failed <= SPEC.retry_limit + 1 and state.failures == failed
    if any(isinstance(ev, e.TaskDeadLettered) and "retry limit" in ev.reason for ev in history):
        assert failed == SPEC.retry_limit + 1  # dead-lettered for its failures only once they ran out
