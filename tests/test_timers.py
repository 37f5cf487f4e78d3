"""The timer index, and a waiting task asking its silent prerequisites again (pure parts)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from taskstream.connectors.table_state import MemoryState
from taskstream.schemas import records as r
from taskstream.streams.lifecycle import Lifecycle, _Batch
from taskstream.streams.state_codec import TaskRecord, dumps, loads
from taskstream.streams.timers import TimerIndex

from taskstream.core import commands as c
from taskstream.core.model import Claim, Status, TaskSpec, TaskState
from taskstream.settings import Settings, SettingsError


@given(
    st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c", b"d"]), st.integers(0, 100)), max_size=30),
    st.integers(0, 100),
)
def test_the_index_yields_each_key_noted_due_by_now_once(noted: list[tuple[bytes, int]], now: int) -> None:
    index = TimerIndex()
    for key, due in noted:
        index.note(key, due)
    got = index.due(now)
    assert got == sorted({k for k, d in noted if d <= now})
    assert index.due(now) == []  # popped
    later = index.due(10**9)
    assert set(later) == {k for k, d in noted if d > now}


def test_a_rebuild_replaces_what_was_noted() -> None:
    index = TimerIndex()
    index.note(b"gone", 5)
    index.rebuild([(b"x", 7), (b"y", 3)])
    assert index.due(6) == [b"y"] and index.due(7) == [b"x"] and len(index) == 0


def lifecycle(**settings: Any) -> Lifecycle:
    def make_input(task_id: str, at: int, body: Any, input_id: str) -> r.InputRecord:
        return r.InputRecord(input_id, task_id, at, "test", body)

    ctx = SimpleNamespace(
        settings=Settings(**settings), inputs="inputs", input=make_input, queue_for=lambda lane: f"queue:{lane}"
    )
    return Lifecycle(ctx, MemoryState(), MemoryState())  # type: ignore[arg-type]


def batching_lifecycle(sent: list[Any], event: Any) -> Lifecycle:
    """A lifecycle for on_batch: each write lands in `sent` (one list per write, unpacked: packing is
    tests/test_context.py's), events are made by `event(task, submission, version, at, payload)`, and
    messages carry their inputs decoded."""

    async def send_all(sends: list[Any], changelog: Any = None) -> None:
        sent.append(list(sends))

    lc = lifecycle(requeue_ms=90_000)
    ctx = lc.ctx
    ctx.events, ctx.queue, ctx.send_all = "events", "queue", send_all  # type: ignore[attr-defined]
    ctx.packed = lambda sends: sends  # type: ignore[attr-defined]
    ctx.event = event  # type: ignore[attr-defined]
    ctx.codec = SimpleNamespace(decode=lambda _kind, value: value)  # type: ignore[attr-defined]
    return lc


def waiting(deps: tuple[str, ...], ended: dict[str, str]) -> TaskRecord:
    spec = TaskSpec("t", "acme", ("true",), dependencies=deps)
    return TaskRecord(TaskState("t1", Status.WAITING, 2, spec, "s"), ended=dict(ended))


def test_a_waiting_task_asks_again_only_the_prerequisites_that_have_not_answered() -> None:
    lc = lifecycle(recheck_ms=1000, recheck_max_ms=8000)
    rec = waiting(("p1", "p2", "p3"), {"p2": "SUCCEEDED"})
    sends = lc._recheck(rec, at=50)
    assert [(key, body.body) for _, key, body in sends] == [
        ("p1", r.WatchPrerequisite("t1")),
        ("p3", r.WatchPrerequisite("t1")),
    ]
    assert len({body.input_id for _, _, body in sends}) == 2  # a new id each round, so none is deduplicated away
    assert lc._recheck(rec, at=60)[0][2].input_id != sends[0][2].input_id


def test_rechecks_back_off_to_a_ceiling_and_stop_once_the_task_is_not_waiting() -> None:
    lc = lifecycle(recheck_ms=1000, recheck_max_ms=8000)
    rec = waiting(("p1",), {})
    dues = []
    for _ in range(6):
        timer = lc._recheck_timer(rec, at=0)
        assert timer is not None and timer["purpose"] == "recheck"
        dues.append(timer["due"])
        lc._recheck(rec, at=0)
    assert dues == [1000, 2000, 4000, 8000, 8000, 8000]
    assert loads(dumps(rec)).rechecks == 6
    ready = TaskRecord(TaskState("t1", Status.READY, 3, rec.state.spec, "s"))
    assert lc._recheck_timer(ready, at=0) is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"TASKSTREAM_HEARTBEAT_MS": "10000"},
            "TASKSTREAM_HEARTBEAT_MS=10000 must be above 0 and below TASKSTREAM_LEASE_MS",
        ),
        (
            {"TASKSTREAM_LEASE_MS": "1000"},
            "TASKSTREAM_HEARTBEAT_MS=2000 must be above 0 and below TASKSTREAM_LEASE_MS=1000",
        ),
        ({"TASKSTREAM_KILL_GRACE_MS": "-1"}, "TASKSTREAM_KILL_GRACE_MS=-1 must not be negative"),
        ({"TASKSTREAM_LEASE_EXPIRY_LIMIT": "0"}, "TASKSTREAM_LEASE_EXPIRY_LIMIT=0 must be at least 1"),
        ({"TASKSTREAM_RECHECK_MS": "0"}, "TASKSTREAM_RECHECK_MS=0 must be above 0"),
        ({"TASKSTREAM_TABLE_STANDBY_REPLICAS": "-1"}, "TASKSTREAM_TABLE_STANDBY_REPLICAS=-1 must not be negative"),
        ({"TASKSTREAM_GRAPH_LINGER_MS": "-5"}, "TASKSTREAM_GRAPH_LINGER_MS=-5 must be between 0 and 60000"),
        ({"TASKSTREAM_LOCAL_CLAIMS": "2"}, "TASKSTREAM_LOCAL_CLAIMS=2 must be 0 or 1"),
        ({"TASKSTREAM_READY_AT_ONCE": "-1"}, "TASKSTREAM_READY_AT_ONCE=-1 must be 0 or 1"),
        ({"TASKSTREAM_LEASE_MS": "ten"}, "TASKSTREAM_LEASE_MS='ten': expected an integer"),
        (
            {"TASKSTREAM_CLOCK_OFFSET_MS": "-10000"},
            "TASKSTREAM_CLOCK_OFFSET_MS=-10000 must stay below TASKSTREAM_LEASE_MS + TASKSTREAM_LEASE_GRACE_MS",
        ),
    ],
)
def test_lease_and_timer_settings_that_cannot_work_are_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env(env)
    assert str(err.value).startswith(message), err.value


def test_the_default_lease_settings_are_accepted() -> None:
    s = Settings.from_env({})
    assert s.heartbeat_ms < s.lease_ms and s.lease_expiry_limit >= 1


def test_a_queued_task_gets_a_requeue_timer_that_its_claim_replaces() -> None:
    lc = lifecycle(requeue_ms=90_000, lease_ms=10_000, lease_grace_ms=2_000)
    lc.ctx.events, lc.ctx.queue = "events", "queue"  # type: ignore[attr-defined]
    lc.ctx.event = lambda tid, sid, version, at, ev: (version, ev)  # type: ignore[attr-defined]
    spec = TaskSpec("t", "acme", ("true",))
    rec = TaskRecord(TaskState("t1", Status.READY, 3, spec, "s"))
    events, timer = lc._decide(rec, [c.QueueTask("default", 100)], 100, 0.0, [])
    assert rec.state.status is Status.QUEUED and timer == {"due": 90_100, "purpose": "requeue"}
    events, timer = lc._decide(rec, [c.ClaimTask(rec.state.attempt, "w1", "claim-1", 200)], 200, 0.0, [])
    assert rec.state.status is Status.CLAIMED and timer == {"due": 12_200, "purpose": "lease"}


class _Tables(MemoryState):
    """A table that notes every write, and whether the batch's records had been sent by then."""

    def __init__(self, sent: list[Any]) -> None:
        super().__init__()
        self.sent, self.writes = sent, []  # type: ignore[var-annotated]

    def __setitem__(self, key: Any, value: Any) -> None:
        self.writes.append((key, bool(self.sent)))
        super().__setitem__(key, value)


def test_a_batch_decides_each_input_on_what_the_one_before_left_and_saves_once_after_sending() -> None:
    sent: list[Any] = []
    lc = batching_lifecycle(sent, lambda tid, sid, version, at, ev: (version, ev))
    lc.tasks, lc.timers = _Tables(sent), _Tables(sent)
    spec = TaskSpec("t", "acme", ("true",))
    lc.tasks[b"t1"] = dumps(TaskRecord(TaskState("t1", Status.QUEUED, 4, spec, "s", attempt=1)))
    lc.tasks.writes.clear()

    def msg(offset: int, body: Any) -> Any:
        value = r.InputRecord(f"i{offset}", "t1", 100 + offset, "w", body)
        return SimpleNamespace(topic="inputs", partition=0, offset=offset, key=b"t1", value=value, headers={})

    failed: list[int] = []

    async def guard(message: Any, handling: Any) -> None:
        try:
            await handling
        except Exception:
            failed.append(message.offset)

    batch = [
        msg(1, r.ClaimRequest(1, "w", "c1")),
        msg(2, r.StartReport("c1", 42)),
        msg(3, r.FinishReport("c1", 0, "ok", 5, "")),
    ]
    import asyncio

    asyncio.run(lc.on_batch(batch, "events", guard))
    assert failed == []
    assert len(sent) == 1, "one write for the whole batch"
    assert [(v, type(ev).__name__) for _, _, (v, ev) in sent[0]] == [
        (5, "TaskClaimed"),
        (6, "TaskStarted"),
        (7, "TaskSucceeded"),
    ]
    assert lc.tasks.writes == [(b"t1", True)], "saved once, after the send"
    assert loads(lc.tasks[b"t1"]).state.status is Status.SUCCEEDED
    assert b"t1" not in lc.timers  # the lease timer the claim set is cleared by the success in the same batch


def test_a_start_that_came_with_its_finish_is_decided_first_at_its_own_time_and_only_once() -> None:
    """A short run's start travels in its finish report (started_ms, pid): the owner decides TaskStarted
    at the start's time, then the end; a start reported before on its own is not decided again."""
    sent: list[Any] = []
    lc = batching_lifecycle(sent, lambda tid, sid, version, at, ev: (version, at, ev))
    spec = TaskSpec("t", "acme", ("true",))
    for tid in ("t1", "t2"):
        lc.tasks[tid.encode()] = dumps(TaskRecord(TaskState(tid, Status.QUEUED, 4, spec, "s", attempt=1)))

    def msg(offset: int, tid: str, at: int, body: Any) -> Any:
        value = r.InputRecord(f"i{offset}", tid, at, "w", body)
        return SimpleNamespace(topic="inputs", partition=0, offset=offset, key=tid.encode(), value=value, headers={})

    async def guard(_message: Any, handling: Any) -> None:
        await handling

    import asyncio

    batch = [
        msg(1, "t1", 100, r.ClaimRequest(1, "w", "c1")),
        msg(2, "t1", 140, r.FinishReport("c1", 0, "ok", 5, "", started_ms=120, pid=42)),
        msg(3, "t2", 100, r.ClaimRequest(1, "w", "c2")),
        msg(4, "t2", 110, r.StartReport("c2", 43)),
        msg(5, "t2", 150, r.FinishReport("c2", 0, "ok", 5, "", started_ms=110, pid=43)),  # started already
    ]
    asyncio.run(lc.on_batch(batch, "events", guard))
    events = [(v, at, type(ev).__name__) for _, _, (v, at, ev) in sent[0]]
    assert events == [
        (5, 100, "TaskClaimed"),
        (6, 120, "TaskStarted"),
        (7, 140, "TaskSucceeded"),
        (5, 100, "TaskClaimed"),
        (6, 110, "TaskStarted"),
        (7, 150, "TaskSucceeded"),
    ]
    started = next(ev for _, _, (_, _, ev) in sent[0] if type(ev).__name__ == "TaskStarted")
    assert started.pid == 42
    assert loads(lc.tasks[b"t1"]).state.status is Status.SUCCEEDED


def test_inputs_packed_in_one_record_are_decided_each_as_its_own_and_one_that_raises_holds_up_none() -> None:
    """A worker's inputs sent together come as one record (records.Inputs): each is decided as if it came
    alone, in order; those whose handling raises have the record dead-lettered once (by the batch's
    guard), naming each of them, and the inputs after them are still decided."""
    sent: list[Any] = []
    lc = batching_lifecycle(sent, lambda tid, sid, version, at, ev: (tid, version, ev))
    spec = TaskSpec("t", "acme", ("true",))
    for tid in ("t1", "t2", "t3", "t4"):
        lc.tasks[tid.encode()] = dumps(TaskRecord(TaskState(tid, Status.QUEUED, 4, spec, "s", attempt=1)))
    real_load = lc.load

    def load(task_id: str) -> TaskRecord:
        if task_id in ("t2", "t4"):
            raise RuntimeError(f"a bug on {task_id}")
        return real_load(task_id)

    lc.load = load  # type: ignore[method-assign]
    claims = [
        r.InputRecord(f"i{n}", tid, 100, "w", r.ClaimRequest(1, "w", f"c{n}"))
        for n, tid in enumerate(("t1", "t2", "t3", "t4"))
    ]
    packed = r.pack_inputs(claims, "w")
    message = SimpleNamespace(topic="inputs", partition=0, offset=7, key=b"t1", value=packed, headers={})
    failed: list[tuple[int, str]] = []

    async def guard(msg: Any, handling: Any) -> None:
        try:
            await handling
        except Exception as exc:
            failed.append((msg.offset, str(exc)))

    import asyncio

    asyncio.run(lc.on_batch([message], "events", guard))
    assert failed == [
        (7, "2 of 4 inputs: t2 ClaimRequest: RuntimeError: a bug on t2; t4 ClaimRequest: RuntimeError: a bug on t4")
    ]
    assert [(tid, type(ev).__name__) for _, _, (tid, _, ev) in sent[0]] == [
        ("t1", "TaskClaimed"),
        ("t3", "TaskClaimed"),
    ]
    assert loads(lc.tasks[b"t3"]).state.status is Status.CLAIMED


class _Local:
    """A LocalClaims stand-in: room for `room` claims; notes what is handed over and when."""

    worker_id = "w-local"

    def __init__(self, room: int, sent: list[Any]) -> None:
        self.room, self.sent = room, sent
        self.reserved = 0
        self.handed: list[tuple[str, str, bool]] = []  # (task, claim, whether the batch was sent by then)

    def reserve(self, qt: r.QueuedTask) -> str | None:
        if self.reserved >= self.room:
            return None
        self.reserved += 1
        return f"local-{qt.task_id}"

    def release(self, n: int) -> None:
        self.reserved -= n

    def hand(self, qt: r.QueuedTask, claim_id: str) -> None:
        self.reserved -= 1
        self.handed.append((qt.task_id, claim_id, bool(self.sent)))


def test_a_task_queued_while_its_own_worker_has_room_is_claimed_in_the_same_write_and_handed_over_after() -> None:
    """Two READY tasks promoted in one batch, room for one local claim: the first is claimed for this
    worker in the same write as its TaskQueued (no queue record) and handed over once that write was
    sent; the second goes to the queue. A batch that a rebalance throws away hands nothing over and
    gives its reservations back."""
    import asyncio

    sent: list[Any] = []
    lc = batching_lifecycle(sent, lambda tid, sid, version, at, ev: (tid, version, ev))
    local = lc.local = _Local(1, sent)
    spec = TaskSpec("t", "acme", ("true",))
    for tid in ("t1", "t2"):
        lc.tasks[tid.encode()] = dumps(TaskRecord(TaskState(tid, Status.READY, 3, spec, "s")))

    def msg(offset: int, tid: str) -> Any:
        value = r.InputRecord(f"i{offset}", tid, 100 + offset, "batcher", r.Promote("default"))
        return SimpleNamespace(topic="inputs", partition=0, offset=offset, key=tid.encode(), value=value, headers={})

    async def guard(message: Any, handling: Any) -> None:
        await handling

    asyncio.run(lc.on_batch([msg(1, "t1"), msg(2, "t2")], "events", guard))
    assert len(sent) == 1
    events = [(x[2][0], type(x[2][2]).__name__) for x in sent[0] if x[0] == "events"]
    queued = [x[1] for x in sent[0] if x[0] == "queue:default"]
    assert events == [("t1", "TaskQueued"), ("t1", "TaskClaimed"), ("t2", "TaskQueued")], events
    assert queued == ["t2"]
    claimed = next(x[2][2] for x in sent[0] if x[0] == "events" and type(x[2][2]).__name__ == "TaskClaimed")
    assert (claimed.worker, claimed.claim_id, claimed.attempt) == ("w-local", "local-t1", 1)
    assert local.handed == [("t1", "local-t1", True)] and local.reserved == 0
    assert loads(lc.tasks[b"t1"]).state.status is Status.CLAIMED
    assert loads(lc.tasks[b"t2"]).state.status is Status.QUEUED

    # a rebalance between deciding and writing: nothing written, nothing handed over, the room given back
    lc.tasks[b"t3"] = dumps(TaskRecord(TaskState("t3", Status.READY, 3, spec, "s")))
    lc.tenure = SimpleNamespace(completed=0, settled=_settled_to(1))  # type: ignore[assignment]
    lc.holding = lambda: lambda _m: False
    before = len(sent)
    asyncio.run(lc.on_batch([msg(3, "t3")], "events", guard))
    assert len(sent) == before and local.handed == [("t1", "local-t1", True)] and local.reserved == 0


def _settled_to(n: int) -> Any:
    async def settled() -> int:
        return n

    return settled


def test_a_task_made_ready_while_the_gate_is_open_is_queued_and_claimed_in_that_write_and_others_wait() -> None:
    """Three waiting tasks whose one prerequisite ends in one batch. The batcher's gate is open to
    tenant `acme` (not to `free`, which has a cap); the worker has room for one: t1 is ready, queued and
    claimed in the same write and handed over after it; t2 (capped tenant) and t3 (no room left) stay
    READY for the batcher's round."""
    import asyncio

    from taskstream.streams.worker import Capacity, LocalClaims

    from taskstream.core.batcher import Offer, gate

    sent: list[Any] = []
    lc = batching_lifecycle(sent, lambda tid, sid, version, at, ev: (tid, version, ev))
    ex = SimpleNamespace(waiter=SimpleNamespace(ready=asyncio.Event(), watch=lambda _tid: asyncio.Future()))
    handed: list[tuple[str, str]] = []
    open_gate = gate([Offer("w-local", 1, 0, 4.0, 4096, 0)], k=5, chosen=0, uncapped=["acme"])
    local = LocalClaims("w-local", Capacity(1, 4.0, 4096, 0), 1, lambda: {"default"}, lambda: ex,
                        gate=lambda: open_gate)  # fmt: skip
    local.hand = lambda qt, cid: handed.append((qt.task_id, cid))  # type: ignore[method-assign]
    lc.local = local
    for tid, tenant in (("t1", "acme"), ("t2", "free"), ("t3", "acme")):
        spec = TaskSpec(tid, tenant, ("true",), dependencies=("p",))
        lc.tasks[tid.encode()] = dumps(TaskRecord(TaskState(tid, Status.WAITING, 2, spec, "s")))

    def ended(offset: int, tid: str) -> Any:
        body = r.PrerequisiteEnded(prerequisite="p", succeeded=True, outcome="SUCCEEDED")
        value = r.InputRecord(f"i{offset}", tid, 100 + offset, "p-owner", body)
        return SimpleNamespace(topic="inputs", partition=0, offset=offset, key=tid.encode(), value=value, headers={})

    async def go() -> None:
        ex.waiter.ready.set()

        async def guard(message: Any, handling: Any) -> None:
            await handling

        await lc.on_batch([ended(1, "t1"), ended(2, "t2"), ended(3, "t3")], "events", guard)

    asyncio.run(go())
    assert len(sent) == 1
    events = [(x[2][0], type(x[2][2]).__name__) for x in sent[0] if x[0] == "events"]
    assert events == [("t1", "TaskReady"), ("t1", "TaskQueued"), ("t1", "TaskClaimed"), ("t2", "TaskReady"),
                      ("t3", "TaskReady")], events  # fmt: skip
    assert not [x for x in sent[0] if str(x[0]).startswith("queue")]  # no queue record for any of them
    assert [tid for tid, _ in handed] == ["t1"]
    assert [loads(lc.tasks[t.encode()]).state.status for t in ("t1", "t2", "t3")] == [
        Status.CLAIMED, Status.READY, Status.READY]  # fmt: skip


def test_a_promote_into_another_lane_moves_a_queued_task_and_one_into_its_own_lane_changes_nothing() -> None:
    """The batcher moves a task queued in a lane no live worker reads with a Promote into a live lane:
    the owner takes it back and queues it there, with the same attempt's number, in one write (a queue
    record to the new lane). A Promote into the lane it is already in is a duplicate: nothing."""
    import asyncio

    sent: list[Any] = []
    lc = batching_lifecycle(sent, lambda tid, sid, version, at, ev: (tid, version, ev))
    lc.ctx.queue_for = lambda lane: f"queue:{lane}"  # type: ignore[attr-defined]
    spec = TaskSpec("t", "acme", ("true",))
    lc.tasks[b"t1"] = dumps(TaskRecord(TaskState("t1", Status.QUEUED, 4, spec, "s", attempt=1, lane="big")))

    def promote(offset: int, lane: str) -> Any:
        value = r.InputRecord(f"i{offset}", "t1", 100 + offset, "batcher", r.Promote(lane))
        return SimpleNamespace(topic="inputs", partition=0, offset=offset, key=b"t1", value=value, headers={})

    async def guard(message: Any, handling: Any) -> None:
        await handling

    asyncio.run(lc.on_batch([promote(1, "default"), promote(2, "default")], "events", guard))
    assert len(sent) == 1
    events = [x[2][2] for x in sent[0] if x[0] == "events"]
    assert [type(ev).__name__ for ev in events] == ["TaskUnqueued", "TaskQueued"]
    assert "moved from lane big to default" in events[0].reason
    assert (events[1].attempt, events[1].lane) == (1, "default")
    assert [(x[0], x[2].lane, x[2].attempt) for x in sent[0] if x[0] != "events"] == [("queue:default", "default", 1)]
    state = loads(lc.tasks[b"t1"]).state
    assert (state.status, state.lane, state.attempt) == (Status.QUEUED, "default", 1)


def test_a_finish_handed_over_in_process_ends_the_task_and_its_dependent_hears_in_the_same_write() -> None:
    """streams/inbox.py: the worker's finish report on a task it owns comes in-process (never written);
    the task's end is decided, its PrerequisiteEnded to a dependent held here is written and decided in
    the same batch (the dependent ready in the same write), and the signal's copy from the log, later,
    changes nothing and saves nothing."""
    import asyncio

    from taskstream.streams.inbox import Inbox, LocalInput

    sent: list[Any] = []
    lc = batching_lifecycle(sent, lambda tid, sid, version, at, ev: (tid, version, ev))
    lc.tasks, lc.timers = _Tables(sent), _Tables(sent)
    lc.inbox = Inbox("inputs", lambda _task: 0, lambda: {0}, None)
    first = TaskSpec("a", "acme", ("true",))
    then = TaskSpec("b", "acme", ("true",), dependencies=("t1",))
    claim = Claim(1, "w", "c1")
    running = TaskState("t1", Status.RUNNING, 6, first, "s", attempt=1, claim=claim)
    lc.tasks.write(0, {b"t1": dumps(TaskRecord(running, dependents=["t2"]))})
    lc.tasks.write(0, {b"t2": dumps(TaskRecord(TaskState("t2", Status.WAITING, 2, then, "s")))})
    lc.tasks.writes.clear()

    async def guard(_message: Any, handling: Any) -> None:
        await handling

    finish = r.InputRecord("f1", "t1", 200, "w", r.FinishReport("c1", 0, "ok", 5, ""))
    asyncio.run(lc.on_batch([LocalInput(finish, "inputs", 0)], "events", guard))
    assert len(sent) == 1, "one write"
    written = [(key, type(x[2]).__name__ if isinstance(x, tuple) else type(x.body).__name__) for _, key, x in sent[0]]
    assert written == [("t1", "TaskSucceeded"), ("t2", "PrerequisiteEnded"), ("t2", "TaskReady")]
    assert loads(lc.tasks[b"t2"]).state.status is Status.READY
    assert loads(lc.tasks[b"t2"]).ended == {"t1": "SUCCEEDED"}

    signal = sent[0][1][2]  # the PrerequisiteEnded as written: its copy comes back from the log
    lc.tasks.writes.clear()
    copy = SimpleNamespace(topic="inputs", partition=0, offset=9, key=b"t2", value=signal, headers={})
    asyncio.run(lc.on_batch([copy], "events", guard))
    assert sent[1] == [], "nothing decided"
    assert lc.tasks.writes == [], "nothing saved"
    assert loads(lc.tasks[b"t2"]).state.status is Status.READY


class _Changelogged(MemoryState):
    """A table whose changelog records are kept, as a Faust table's would be produced."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[bytes, bytes | None]] = []

    def changelog(self, partition: int, items: Any) -> list[Any]:
        self.records.extend(items.items())
        return []


def test_a_timer_is_cleared_in_the_changelog_only_where_one_was_saved() -> None:
    """A task that ends clears its lease timer (a tombstone in the timers' changelog); its dependent,
    made ready in the same batch, had no timer, and clearing it writes nothing: a tombstone for a timer
    never saved was a changelog record and a store write per task for nothing. A timer set and cleared
    within one batch is not written at all."""
    import asyncio

    from taskstream.streams.inbox import Inbox, LocalInput

    sent: list[Any] = []
    lc = batching_lifecycle(sent, lambda tid, sid, version, at, ev: (tid, version, ev))
    lc.timers = _Changelogged()
    lc.inbox = Inbox("inputs", lambda _task: 0, lambda: {0}, None)
    running = TaskState(
        "t1", Status.RUNNING, 6, TaskSpec("a", "acme", ("true",)), "s", attempt=1, claim=Claim(1, "w", "c1")
    )
    then = TaskSpec("b", "acme", ("true",), dependencies=("t1",))
    lc.tasks.write(0, {b"t1": dumps(TaskRecord(running, dependents=["t2"]))})
    lc.tasks.write(0, {b"t2": dumps(TaskRecord(TaskState("t2", Status.WAITING, 2, then, "s")))})
    lease = b'{"due":1,"purpose":"lease"}'
    lc.timers.write(0, {b"t1": lease})

    async def guard(_message: Any, handling: Any) -> None:
        await handling

    finish = r.InputRecord("f1", "t1", 200, "w", r.FinishReport("c1", 0, "ok", 5, ""))
    asyncio.run(lc.on_batch([LocalInput(finish, "inputs", 0)], "events", guard))
    assert loads(lc.tasks[b"t2"]).state.status is Status.READY, "the dependent was made ready in the batch"
    assert lc.timers.records == [(b"t1", None)], "one tombstone: the ended task's lease timer"
    assert lc.timers.read(0, b"t1") is None and lc.timers.read(0, b"t2") is None

    lc.timers.records.clear()
    lc._batch = _Batch()
    lc._set_timer("t3", {"due": 5, "purpose": "requeue"})
    lc._clear_timer(b"t3")
    assert lc._batch.timers == {} and lc._timer(b"t3") is None, "set and cleared in one batch: nothing to write"


def test_the_inbox_gives_what_arrived_in_order_once_and_its_wait_ends_only_when_something_is_undrained() -> None:
    """streams/inbox.py: the owner drains what was handed over into its next batch; `wait` (the task
    that decides when no batch comes from the broker) returns only while something is left to drain."""
    import asyncio

    from taskstream.streams.inbox import Inbox

    async def scenario() -> None:
        box = Inbox("inputs", lambda task: int(task[1:]) % 2, lambda: {0}, None)
        records = [r.InputRecord(f"i{n}", f"t{n}", n, "w", r.Heartbeat("c")) for n in range(4)]
        local = box.local(records)
        assert [x is not None for x in local] == [True, False, True, False], "only partition 0 is held here"
        futures = [box.put(x) for x in local if x is not None]
        await asyncio.wait_for(box.wait(), 1)
        taken = box.drain()
        assert [item.record.task_id for item, _ in taken] == ["t0", "t2"]
        assert [fut for _, fut in taken] == futures
        assert box.drain() == [], "drained once"
        waiting = asyncio.ensure_future(box.wait())
        await asyncio.sleep(0.05)
        assert not waiting.done(), "nothing to drain: the wait goes on"
        box.put(local[0])  # type: ignore[arg-type]
        await asyncio.wait_for(waiting, 1)
        assert [item.record.task_id for item, _ in box.drain()] == ["t0"]

    asyncio.run(scenario())


class _Logged(MemoryState):
    """A store with a changelog: what a batch writes here, after its changelog records are durable."""

    changelog_topic = "tasks-changelog"

    def __init__(self, calls: list[Any]) -> None:
        super().__init__()
        self.calls, self.persisted_at = calls, {}  # type: ignore[var-annotated]

    def changelog(self, partition: int, items: Any) -> list[Any]:
        return [(self.changelog_topic, partition, key, value) for key, value in items.items()]

    def write(self, partition: int, items: Any) -> list[Any]:
        self.calls.append(("write", sorted(items)))
        return super().write(partition, items)

    def persisted(self, partition: int, offset: int) -> None:
        self.persisted_at[partition] = offset


def test_a_batch_s_events_and_its_state_s_changelog_go_out_in_one_write_before_the_store_is_written() -> None:
    """A worker killed between its events and its state's changelog left events no next owner's state
    knew of: it decided the same inputs again, and a claim it took for its own worker differed (a fork
    seen in CI). Both go in one write now, and the store is written once they are durable."""
    import asyncio

    calls: list[Any] = []

    async def send_all(sends: list[Any], changelog: Any = None) -> dict[str, dict[int, int]]:
        calls.append(("send", [type(ev).__name__ for _, _, (_, ev) in sends], [(t, p, k) for t, p, k, _ in changelog]))
        return {"tasks-changelog": {0: 41}}

    lc = batching_lifecycle([], lambda tid, sid, version, at, ev: (version, ev))
    lc.ctx.send_all = send_all  # type: ignore[attr-defined]
    lc.tasks = _Logged(calls)
    spec = TaskSpec("t", "acme", ("true",))
    dict.__setitem__(lc.tasks, b"t1", dumps(TaskRecord(TaskState("t1", Status.QUEUED, 4, spec, "s", attempt=1))))
    value = r.InputRecord("i1", "t1", 101, "w", r.ClaimRequest(1, "w", "c1"))
    message = SimpleNamespace(topic="inputs", partition=0, offset=1, key=b"t1", value=value, headers={})

    async def guard(_message: Any, handling: Any) -> None:
        await handling

    asyncio.run(lc.on_batch([message], "events", guard))
    assert calls == [("send", ["TaskClaimed"], [("tasks-changelog", 0, b"t1")]), ("write", [b"t1"])]
    assert lc.tasks.persisted_at == {0: 41}
    assert loads(lc.tasks[b"t1"]).state.status is Status.CLAIMED


def test_the_owner_bench_runs_every_task_to_success_with_two_state_records_each() -> None:
    """bench/owner_bench.py (the lifecycle alone, in one process) takes a small DAG from its packed
    admission to success: each task's record and timer are written twice (admitted and claimed in one
    batch, then ended), and its events go out packed, far fewer than one record per task."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "owner_bench.py"
    spec = importlib.util.spec_from_file_location("owner_bench", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    took, records = bench.one_round(300, 32, seed=0)  # raises unless all 300 were claimed and succeeded
    assert took > 0
    assert records["tasks-changelog"] == 2.0 and records["timers-changelog"] == 2.0
    assert 0 < records["taskstream.events"] < 0.2
