"""When a worker's own lifecycle claims a task for it in-process (streams/worker.LocalClaims), and what
it does with one handed over: room, lane, fit, readiness and stopping decide; an empty-handed stop
leaves nothing running."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from taskstream.schemas import records as r
from taskstream.streams.worker import Capacity, LocalClaims, claim_id_of

from taskstream.core.model import Resources, TaskSpec


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
