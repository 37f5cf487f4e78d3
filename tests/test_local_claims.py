"""When a worker's own lifecycle claims a task for it in-process (streams/worker.LocalClaims), and what
it does with one handed over: room, lane, fit, readiness and stopping decide; an empty-handed stop
leaves nothing running. And when a task that becomes ready skips the batcher's round (the gate,
taskstream/core/batcher.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from taskstream.schemas import records as r
from taskstream.streams.batcher import gate_of, gate_record, offer_of
from taskstream.streams.worker import Capacity, ClaimWaiter, Executor, LocalClaims, claim_id_of

from taskstream.core import events as e
from taskstream.core.batcher import Candidate, Gate, Offer, floors, gate
from taskstream.core.model import Call, Resources, TaskSpec
from taskstream.settings import Settings


def queued(tid: str, lane: str = "default", **need: Any) -> r.QueuedTask:
    return r.QueuedTask(tid, 1, lane, 0, TaskSpec(tid, "acme", ("true",), resources=Resources(**need)))


class _Executor:
    def __init__(self) -> None:
        self.waiter = SimpleNamespace(ready=asyncio.Event(), watch=lambda _tid: asyncio.Future())
        self.ran: list[str] = []
        self.release = asyncio.Event()

    async def run_claimed(self, qt: r.QueuedTask, claim_id: str, cancelled: Any) -> None:
        self.ran.append(claim_id)
        await self.release.wait()


def test_a_claim_is_reserved_only_with_room_a_lane_read_a_fit_and_a_ready_worker() -> None:
    async def go() -> None:
        cap = Capacity(slots=1, cpus=1.0, memory_mb=1024, gpus=0)
        ex = _Executor()
        local = LocalClaims("w1", cap, budget=2, lanes=lambda: {"default"}, executor=lambda: ex)
        assert local.reserve(queued("a")) is None  # the worker is not following the log yet
        ex.waiter.ready.set()
        assert local.reserve(queued("a", lane="big")) is None  # a lane it does not read
        assert local.reserve(queued("a", cpu=2.0)) is None  # could never run here
        first = local.reserve(queued("a"))
        assert first == claim_id_of(queued("a"), "w1")
        assert local.reserve(queued("b")) is not None
        assert local.reserve(queued("c")) is None  # two reserved: the budget is full
        local.release(1)  # b's batch was not written
        local.hand(queued("a"), first)  # a's write is durable: it runs, and counts as a held claim
        assert cap.claims == 1 and local.reserved == 0
        assert local.reserve(queued("c")) is not None  # one held, one reserved: full
        assert local.reserve(queued("d")) is None
        await asyncio.sleep(0)
        assert ex.ran == [first]
        await local.close()  # stopping: the run is cancelled, nothing more is reserved
        assert not local.runs and local.reserve(queued("e")) is None

    asyncio.run(go())


def test_a_worker_alone_on_its_lane_claims_as_far_as_the_batcher_s_margin_and_shares_once_a_peer_is_live() -> None:
    async def go() -> None:
        cap = Capacity(slots=1, cpus=1.0, memory_mb=1024, gpus=0)
        ex = _Executor()
        ex.waiter.ready.set()
        peers = {"default": 0}
        others = lambda lane: peers.get(lane, 0)  # noqa: E731
        local = LocalClaims("w1", cap, 2, lambda: {"default"}, lambda: ex, alone_budget=5, peers=others)
        got = [local.reserve(queued(f"t{i}")) for i in range(6)]
        assert sum(x is not None for x in got) == 5  # nobody else reads the lane: up to the alone budget
        local.release(5)
        peers["default"] = 1  # another live worker reads it: the rest goes to the queue for both
        got = [local.reserve(queued(f"u{i}")) for i in range(3)]
        assert sum(x is not None for x in got) == 2
        cap.claims = 5  # five held from while it was alone: beyond its room of 2, with a peer on the lane
        assert local.excess("default") and not local.excess("big")
        peers["default"] = 0
        assert not local.excess("default")  # alone again: nothing to give back

    asyncio.run(go())


def test_a_worker_alone_claims_as_far_as_the_margin_the_batcher_s_gate_last_said_and_never_less_than_its_own() -> None:
    async def go() -> None:
        cap = Capacity(slots=1, cpus=1.0, memory_mb=1024, gpus=0)
        ex = _Executor()
        ex.waiter.ready.set()
        said: list[Gate | None] = [None]
        local = LocalClaims(
            "w1", cap, 2, lambda: {"default"}, lambda: ex, alone_budget=5, peers=lambda _lane: 0, gate=lambda: said[0]
        )

        def reserved(n: int) -> int:
            got = sum(local.reserve(queued(f"t{i}")) is not None for i in range(n))
            local.release(got)
            return got

        assert reserved(20) == 5  # no gate heard: room + its own batch_ahead
        said[0] = Gate(open=False, margin=12)  # widened by the batcher: room 2 + 12
        assert reserved(20) == 14
        said[0] = Gate(open=False, margin=1)  # narrower than its own: its own
        assert reserved(20) == 5
        said[0] = Gate(open=False)  # a gate from a batcher that says no margin
        assert reserved(20) == 5

    asyncio.run(go())


# -- the batcher's gate: a task that becomes ready skips the round while nothing waits for room -------
def offer(worker: str, cpus: float, lanes: tuple[str, ...] = ("default",), gpus: int = 0, **labels: str) -> Offer:
    return Offer(worker, 2, 1, cpus, 4096, gpus, lanes, tuple(sorted(labels.items())))


def test_the_gate_opens_only_after_a_round_that_left_room_unused_and_only_to_tenants_known_uncapped() -> None:
    offers = [offer("a", 2.0)]
    assert not gate(offers, k=5, chosen=5, uncapped=()).open  # room all taken: what is ready ranks first
    assert not gate(offers, k=0, chosen=0, uncapped=()).open  # no room at all
    g = gate(offers, k=5, chosen=3, uncapped=["acme"])
    assert g.open and g.uncapped == {"acme"}
    need = Candidate("t", "acme", 1.0, 256)
    assert g.lane_for("acme", need, ["default"]) == "default"
    assert g.lane_for("free-tier", need, ["default"]) is None  # capped, or not known yet: waits for a round
    assert gate(offers, k=5, chosen=5, uncapped=["acme"]).lane_for("acme", need, ["default"]) is None


def test_a_lane_s_floor_is_the_least_each_of_its_workers_offers_and_a_task_goes_where_every_worker_fits_it() -> None:
    offers = [offer("small", 1.0, zone="a"), offer("big", 8.0, ("default", "big"), gpus=1, zone="a", disk="ssd")]
    fl = floors(offers)
    assert (fl["default"].cpus, fl["default"].gpus, fl["default"].labels) == (1.0, 0, (("zone", "a"),))
    assert (fl["big"].cpus, fl["big"].gpus, fl["big"].labels) == (8.0, 1, (("disk", "ssd"), ("zone", "a")))
    g = gate(offers, k=9, chosen=0, uncapped=["acme"])
    lanes = ["default", "big"]
    assert g.lane_for("acme", Candidate("t", "acme", 0.5, 256, 0, (("zone", "a"),)), lanes) == "default"
    assert g.lane_for("acme", Candidate("t", "acme", 4.0, 256), lanes) == "big"  # the small worker cannot
    assert g.lane_for("acme", Candidate("t", "acme", 0.5, 256, 0, (("disk", "ssd"),)), lanes) == "big"
    assert g.lane_for("acme", Candidate("t", "acme", 16.0, 256), lanes) is None  # no lane fits it whole
    assert g.lane_for("acme", Candidate("t", "acme", 4.0, 256), ["default"]) is None  # not a lane read here


def test_the_gate_survives_its_trip_through_the_workers_topic_and_is_told_from_an_advertisement() -> None:
    g = gate([offer("a", 2.0, ("default", "gpu"), gpus=2, zone="[red]x")], 4, 1, ["t1", "t2"], margin=96)
    body = json.loads(gate_record(g, "node-1", 123))
    assert gate_of(body) == g and gate_of(body).margin == 96
    del body["gate"]["margin"]  # from a batcher before the margin was told: none said
    assert gate_of(body).margin == 0
    with pytest.raises(KeyError):
        offer_of(body)  # the workers topic's readers skip it as an advertisement
    with pytest.raises((KeyError, TypeError, ValueError)):
        gate_of({"gate": {"open": True}})  # no floors: not a gate


def spec(tenant: str = "acme", **need: Any) -> TaskSpec:
    return TaskSpec("t", tenant, ("true",), resources=Resources(**need))


def test_a_ready_task_gets_a_lane_at_once_only_with_an_open_gate_its_tenant_uncapped_and_room_here() -> None:
    async def go() -> None:
        cap = Capacity(slots=1, cpus=2.0, memory_mb=1024, gpus=0)
        ex = _Executor()
        ex.waiter.ready.set()
        said: list[Any] = [None]
        peers = [1]
        local = LocalClaims(
            "w1", cap, 2, lambda: {"big", "default"}, lambda: ex, alone_budget=5, peers=lambda _lane: peers[0],
            gate=lambda: said[0],
        )  # fmt: skip
        assert local.ready_lane(spec()) is None  # no gate heard (yet, or from a batcher gone since)
        offers = [offer("w1", 2.0, ("default", "big")), offer("w2", 1.0)]
        said[0] = gate(offers, k=6, chosen=6, uncapped=["acme"])
        assert local.ready_lane(spec()) is None  # closed: what is ready waits for its rank
        said[0] = gate(offers, k=6, chosen=2, uncapped=["acme"])
        assert local.ready_lane(spec("free-tier")) is None
        assert local.ready_lane(spec()) == "default"  # the default lane first
        assert local.ready_lane(spec(cpu=2.0)) == "big"  # w2 reads the default lane and could not run it
        assert local.ready_lane(spec(cpu=4.0)) is None  # could run nowhere
        assert local.reserve(queued("a"))
        assert local.ready_lane(spec()) == "default"  # its one slot is taken, one more may be claimed ahead
        assert local.reserve(queued("b"))
        assert local.ready_lane(spec()) is None  # slots + claim_ahead held: it waits for the round
        assert local.reserve(queued("c")) is None  # as a promoted one would, another worker reading the lane
        peers[0] = 0
        assert local.reserve(queued("c"))  # alone on the lane a promoted one is claimed further ahead ...
        assert local.ready_lane(spec()) is None  # ... one just ready never past slots + claim_ahead

    asyncio.run(go())


def test_the_claim_waiter_decodes_only_records_that_may_hold_what_it_waits_for() -> None:
    """The worker's verdict reader skips, undecoded, the owners' records whose kinds (their header) it
    waits for nothing of: a verdict with no claim pending, a cancellation or limit with no run watched."""

    async def go() -> None:
        waiter = ClaimWaiter(SimpleNamespace(), "w1")
        claimed, cancelled = [b"TaskQueued", b"TaskClaimed"], [b"TaskCancelled"]
        assert not waiter.awaits(claimed) and not waiter.awaits(cancelled)  # claims decided in-process
        verdict = waiter.expect("c1")
        assert waiter.awaits(claimed) and waiter.awaits([b"ClaimRejected"]) and not waiter.awaits(cancelled)
        waiter._see_one(r.EventRecord("ev1", "t1", "s1", 1, 0, "n1", e.TaskClaimed(1, "w1", "c1")))
        assert verdict.done() and not waiter.awaits(claimed)
        watch = waiter.watch("t2")
        assert waiter.awaits(cancelled) and waiter.awaits([b"TaskLimitExceeded"]) and not waiter.awaits(claimed)
        waiter.unwatch("t2", watch)
        assert not waiter.awaits(cancelled + [b"TaskSucceeded"])

    asyncio.run(go())


def test_a_run_that_ends_leaves_the_watch_of_the_next_run_of_its_task_alone() -> None:
    """Two runs of one task overlap on a worker: the first (its claim refused, or handed back) ends as
    the next attempt, claimed in-process, begins. The first's end must not cancel the second's watch:
    a cancelled watch read as the worker stopping, and the second run was killed and handed back, its
    next attempt the same, for as long as the worker lived (seen after a SIGKILL in test_dispatch)."""

    async def go() -> None:
        waiter = ClaimWaiter(SimpleNamespace(), "w1")
        first, second = waiter.watch("t1"), waiter.watch("t1")
        waiter.won(first, "c1")
        waiter.won(second, "c2")
        waiter.unwatch("t1", first)
        assert first.cancelled() and not second.done()
        assert waiter.awaits([b"TaskLimitExceeded"])
        # a limit on the first claim is not the second run's; one on the second claim is
        for version, claim in ((7, "c1"), (8, "c2")):
            over = e.TaskLimitExceeded(claim, "w1", "rm1", "memory", "over")
            waiter._see_one(r.EventRecord(f"ev{version}", "t1", "s1", version, 0, "n1", over))
            assert second.done() == (claim == "c2")
        assert second.result() == "over (resource manager rm1)"
        third = waiter.watch("t1")
        waiter._see_one(r.EventRecord("ev9", "t1", "s1", 9, 0, "n1", e.TaskCancelled("by its submitter")))
        assert third.result() == "cancelled (by its submitter)"
        waiter.unwatch("t1", second)
        waiter.unwatch("t1", third)
        assert not waiter.awaits([b"TaskCancelled", b"TaskLimitExceeded"])

    asyncio.run(go())


@pytest.mark.parametrize("kind", ["argv", "call"])
def test_a_run_gives_its_claim_and_slot_back_once_it_has_ended_while_its_report_is_on_its_way(
    tmp_path: Path, kind: str
) -> None:
    """A real process runs (a program, or a call in a runner, whose answer frees the slot at once); its
    finish report is held (the lifecycle busy with another batch). The slot and the claim are free
    meanwhile, so the worker can take its next task; the heartbeats go on until the report is durable
    (the lease covers the report on its way)."""

    class Held:
        def __init__(self) -> None:
            self.sent: list[Any] = []
            self.durable = asyncio.Event()

        async def send(self, rec: Any) -> None:
            self.sent.append(rec)
            if type(rec.body) is r.FinishReport:  # a start report, sent alone if the run took over 50 ms, is not held
                await self.durable.wait()

        def finishes(self) -> list[Any]:
            return [rec for rec in self.sent if type(rec.body) is r.FinishReport]

    async def go() -> None:
        ctx = SimpleNamespace(
            settings=Settings(state_dir=tmp_path),
            now_ms=lambda: int(time.time() * 1000),
            input=lambda task_id, at, body, input_id: SimpleNamespace(task_id=task_id, body=body, input_id=input_id),
        )
        beating: set[str] = set()
        beats = SimpleNamespace(hold=lambda _tid, cid: beating.add(cid), drop=beating.discard)
        cap = Capacity(slots=1, cpus=1.0, memory_mb=1024, gpus=0)
        reports = Held()
        ex = Executor(ctx, "w1", ClaimWaiter(ctx, "w1"), capacity=cap, reports=reports, heartbeats=beats)
        qt = queued("t1")
        if kind == "call":
            qt = dataclasses.replace(qt, spec=dataclasses.replace(qt.spec, call=Call("os:getpid", "[]", "{}")))
        cap.claims += 1  # as the caller counts a won claim
        held = asyncio.ensure_future(ex.hold(qt, "c1", ex.waiter.watch("t1")))
        for _ in range(1000):
            if reports.finishes():
                break
            await asyncio.sleep(0.01)
        assert len(reports.finishes()) == 1 and reports.finishes()[0].body.exit_code == 0
        assert cap.used[0] == 0 and cap.claims == 0 and cap.try_take(qt.spec.resources)  # free for the next
        cap.give(qt.spec.resources)
        assert beating == {"c1"} and not held.done()  # the lease runs on while the report is on its way
        reports.durable.set()
        await held
        assert beating == set() and cap.used[0] == 0 and cap.claims == 0  # given back once, not twice
        assert len(ex.runners.idle) == (kind == "call")  # its runner back for the next call, not a new one
        await ex.runners.close()

    asyncio.run(go())


def test_room_that_frees_goes_to_the_first_waiting_claim_it_fits_never_to_one_that_came_later() -> None:
    """A task claimed ahead waits for a slot; one claimed later must not take the slot it frees (seen in
    CI: a flood ranked after the busy tasks ran before the last of them)."""

    async def go() -> None:
        cap = Capacity(slots=1, cpus=4.0, memory_mb=1024, gpus=0)
        small, big = Resources(cpu=1.0), Resources(cpu=4.0)
        assert cap.try_take(small)  # running
        first = cap.join(small)
        waiting = asyncio.ensure_future(cap.take(small, first))
        await asyncio.sleep(0)
        cap.give(small)  # the run ends ...
        assert not cap.try_take(small)  # ... and a later claim does not barge in
        await waiting
        assert cap.used[0] == 1 and not cap.line
        # a head of the line that does not fit leaves the room to the next that does
        cap.give(small)
        assert cap.try_take(Resources(cpu=1.0))  # 1 of 4 cpus taken, slot taken
        cap.slots = 2
        wide = cap.join(big)
        narrow = cap.join(small)
        got = asyncio.ensure_future(cap.take(small, narrow))
        await asyncio.sleep(0)
        assert got.done() and cap.used[0] == 2  # the big one (first) does not fit 3 cpus left; the small one does
        cap.leave(wide)
        assert not cap.line

    asyncio.run(go())


def test_room_that_frees_wakes_only_the_claim_it_goes_to() -> None:
    """With hundreds of claims waiting for a slot, each freed slot woke every one of them to look again
    (a tenth of the worker's CPU at a few hundred tasks/s); only the one the room goes to is woken now,
    and each still gets its turn in order."""

    async def go() -> None:
        cap = Capacity(slots=1, cpus=4.0, memory_mb=1024, gpus=0)
        need = Resources(cpu=1.0)
        assert cap.try_take(need)
        tickets = [cap.join(need) for _ in range(200)]
        order: list[int] = []

        async def wait(i: int) -> None:
            await cap.take(need, tickets[i])
            order.append(i)

        waiting = [asyncio.ensure_future(wait(i)) for i in range(200)]
        await asyncio.sleep(0)
        woken = 0
        for _ in range(200):
            cap.give(need)
            woken += sum(1 for _, fut in cap.line.values() if fut is not None and fut.done())
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        await asyncio.gather(*waiting)
        assert order == list(range(200))
        assert woken == 200  # one a freed slot
        assert cap.used[0] == 1 and not cap.line

    asyncio.run(go())
