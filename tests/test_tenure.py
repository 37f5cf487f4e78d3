"""The fence against a zombie owner (streams/tenure.py): a worker writes what it decided only while the
group has confirmed its membership, and a batch decided across a rebalance is decided again for the
partitions still held (pure parts: a fake clock, a lifecycle over dicts)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from taskstream.connectors.table_state import MemoryState
from taskstream.schemas import records as r
from taskstream.streams.lifecycle import Lifecycle
from taskstream.streams.state_codec import TaskRecord, dumps, loads
from taskstream.streams.tenure import Tenure

from taskstream.core import events as e
from taskstream.core.model import Status, TaskSpec, TaskState
from tests.test_context import make_context


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_membership_is_current_within_half_a_session_of_the_last_answered_heartbeat() -> None:
    clock = Clock()
    t = Tenure(6.0, clock)
    assert t.current()
    clock.now += 3.1
    assert not t.current(), "3.1 s without a confirmed heartbeat, with a 6 s session"
    t.heard(clock.now - 0.5)
    assert t.current()
    t.heard(clock.now - 10)  # an older heartbeat answered late does not move it back
    assert t.current()
    t.rebalance_begun()
    assert not t.current(), "no writes while a rebalance is going on"
    clock.now += 10
    t.rebalance_completed()
    assert t.current() and t.completed == 1, "a completed rebalance confirms the membership"


def test_a_frozen_worker_holds_its_writes_until_a_heartbeat_is_answered() -> None:
    clock = Clock()
    t = Tenure(6.0, clock)
    clock.now += 60  # thawed after a minute

    async def scenario() -> tuple[bool, int]:
        waiting = asyncio.ensure_future(t.settled(poll_s=0.001))
        await asyncio.sleep(0.02)
        held = not waiting.done()
        t.heard(clock.now)
        return held, await asyncio.wait_for(waiting, 1)

    held, completed = asyncio.run(scenario())
    assert held and completed == 0


SPEC = TaskSpec("job", "acme", ("true",))


def queued(task_id: str) -> bytes:
    return dumps(TaskRecord(TaskState(task_id, Status.QUEUED, 4, SPEC, "sub", attempt=1)))


class Recording:
    """A Context that keeps what it would send."""

    def __init__(self) -> None:
        self.ctx = make_context(partitions=4)
        self.sent: list[tuple[Any, str, Any]] = []

        async def send_all(sends: list[tuple[Any, str, Any]], changelog: Any = None) -> None:
            self.sent.extend(sends)

        self.ctx.send_all = send_all  # type: ignore[method-assign]

    def message(self, task_id: str, body: Any, input_id: str) -> Any:
        rec = self.ctx.input(task_id, 5_000, body, input_id)
        value = self.ctx.codec.encode(rec)
        return SimpleNamespace(topic=self.ctx.settings.topic("task-inputs"), partition=0, value=value, task_id=task_id)


async def _guard(_message: Any, handling: Any) -> None:
    await handling


def test_a_batch_decided_across_a_rebalance_is_written_only_for_the_partitions_still_held() -> None:
    """The partitions held are asked once as each batch begins; the batch decided again after the
    rebalance asks anew."""
    rec = Recording()
    tasks = MemoryState({b"kept": queued("kept"), b"lost": queued("lost")})
    timers = MemoryState()
    tenure = Tenure(6.0)
    held = {"kept", "lost"}
    asks: list[frozenset[str]] = []

    def holding() -> Any:
        asks.append(now := frozenset(held))
        return lambda m: m.task_id in now

    lc = Lifecycle(rec.ctx, tasks, timers, tenure=tenure, holding=holding)
    messages = [
        rec.message("kept", r.ClaimRequest(1, "w0", "c-kept"), "claim-kept"),
        rec.message("lost", r.ClaimRequest(1, "w0", "c-lost"), "claim-lost"),
    ]

    async def rebalancing_guard(message: Any, handling: Any) -> None:
        await handling
        if message.task_id == "lost":  # the group moves "lost" away while the batch is decided
            tenure.rebalance_begun()
            held.discard("lost")
            asyncio.get_running_loop().call_later(0.05, tenure.rebalance_completed)

    asyncio.run(lc.on_batch(messages, rec.ctx.settings.topic("events"), rebalancing_guard))

    members = [m for _, _, x in rec.sent if isinstance(x, r.EventRecord) for m in r.task_events(x)]
    assert {m.task_id for m in members} == {"kept"}, "nothing written for the partition given away"
    claimed = [m for m in members if isinstance(m.payload, e.TaskClaimed)]
    assert [m.payload.claim_id for m in claimed] == ["c-kept"]
    assert loads(tasks[b"kept"]).state.status is Status.CLAIMED
    assert tasks[b"lost"] == queued("lost"), "the record given away is left as the group found it"
    assert b"lost" not in timers and b"kept" in timers
    assert asks == [frozenset({"kept", "lost"}), frozenset({"kept"})], "asked as each batch began"


def test_without_a_rebalance_the_batch_is_written_once() -> None:
    rec = Recording()
    tasks = MemoryState({b"a": queued("a")})
    lc = Lifecycle(rec.ctx, tasks, MemoryState(), tenure=Tenure(6.0), holding=lambda: lambda m: True)
    asyncio.run(lc.on_batch([rec.message("a", r.ClaimRequest(1, "w0", "c"), "i")], "events", _guard))
    members = [m for _, _, x in rec.sent if isinstance(x, r.EventRecord) for m in r.task_events(x)]
    assert [type(m.payload) for m in members] == [e.TaskClaimed]
    assert loads(tasks[b"a"]).state.claim is not None


def test_a_batch_that_begins_after_its_partition_was_given_away_decides_nothing_of_it() -> None:
    """Measured: a zombie's batch taken before the rebalance that expelled it waited for the lifecycle
    behind another batch, began after the rebalance, and wrote a second TaskClaimed under a version the
    new owner had written. Now an input of a partition not held when its batch begins is not decided:
    one from the log is left to the new owner (it reads it again from the last commit), one handed over
    in-process and never written goes to it through the broker."""
    from taskstream.streams.inbox import LocalInput

    rec = Recording()
    tasks = MemoryState({b"kept": queued("kept"), b"lost": queued("lost"), b"gone": queued("gone")})
    tenure = Tenure(6.0)
    lc = Lifecycle(rec.ctx, tasks, MemoryState(), tenure=tenure, holding=lambda: lambda m: m.task_id == "kept")
    inputs = rec.ctx.settings.topic("task-inputs")
    handed = LocalInput(rec.ctx.input("gone", 5_000, r.ClaimRequest(1, "w0", "c-gone"), "claim-gone"), inputs, 1)
    handed.task_id = "gone"  # type: ignore[attr-defined]  # what this test's `holding` looks at
    messages = [
        rec.message("lost", r.ClaimRequest(1, "w0", "c-lost"), "claim-lost"),
        rec.message("kept", r.ClaimRequest(1, "w0", "c-kept"), "claim-kept"),
        handed,
    ]
    asyncio.run(lc.on_batch(messages, rec.ctx.settings.topic("events"), _guard))

    members = [m for _, _, x in rec.sent if isinstance(x, r.EventRecord) for m in r.task_events(x)]
    assert [(m.task_id, type(m.payload)) for m in members] == [("kept", e.TaskClaimed)]
    assert tasks[b"lost"] == queued("lost") and tasks[b"gone"] == queued("gone"), "nothing decided for them"
    rerouted = [x for topic, _, x in rec.sent if topic is rec.ctx.inputs]
    inner = [i for x in rerouted for i in (x.body.items if type(x.body) is r.Inputs else [x])]
    assert [i.input_id for i in inner] == ["claim-gone"], "only the input never written goes through the broker"


class _App:
    """What HeldPartitions reads of a Faust app: its rebalance flag and count, its consumer's assignment
    (counted), and a hook run as the assignment is read (a rebalance beginning just then)."""

    def __init__(self, assigned: set[tuple[str, int]]) -> None:
        self.rebalancing, self.rebalancing_count = False, 0
        self.assigned, self.asked = assigned, 0
        self.during: Any = None
        self.consumer = self

    def assignment(self) -> list[Any]:
        self.asked += 1
        read = [SimpleNamespace(topic=t, partition=p) for t, p in self.assigned]
        if self.during is not None:  # a rebalance begins just after the read
            self.during()
        return read

    def begin(self) -> None:  # as Faust's on_rebalance_start, from the consumer's rebalance callback
        self.rebalancing, self.rebalancing_count = True, self.rebalancing_count + 1


def test_the_partitions_held_are_read_once_per_rebalance_and_never_across_one() -> None:
    from taskstream.streams.app import HeldPartitions

    app = _App({("in", 0), ("in", 2), ("ev", 1)})
    held = HeldPartitions(app)
    assert held("in") == {0, 2} and held("in") == {0, 2} and held("ev") == {1}
    assert app.asked == 2, "the assignment asked once per topic until a rebalance"
    app.begin()
    assert held("in") == frozenset(), "nothing is handed over in-process while a rebalance runs"
    app.assigned = {("in", 2), ("ev", 1)}
    app.rebalancing = False  # as on_rebalance_end
    assert held("in") == {2}, "read anew after a rebalance"
    app.during = lambda: (app.begin(), app.assigned.discard(("ev", 1)))  # one begins while it is read
    assert held("ev") == frozenset(), "an assignment read across a rebalance's start is not believed"
    app.during, app.rebalancing = None, False
    assert held("ev") == frozenset() and app.asked == 5, "read anew, without the partition that moved"
    app.assigned.add(("in", 3))
    assert held("in") == {2, 3}
    asked = app.asked
    assert held("in") == {2, 3} and app.asked == asked, "kept again once a rebalance is over"
