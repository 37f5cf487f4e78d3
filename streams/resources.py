"""The resource manager node that runs in every worker: watches its share of the workers' running tasks.

Each worker advertises, every heartbeat_ms on the `workers` topic, its running tasks' resident memory
and run time (streams/worker.py). Every worker process also follows that topic (streams/batcher.py
`Adverts`) and, every heartbeat_ms, works out from the live advertisements which workers it watches
(taskstream/core/resources.py: never itself while another node is live). For a watched worker's run over
a limit it sends LimitExceeded to the task's owner, who records TaskLimitExceeded (once per claim); the
run's worker sees that on the log and kills the run. A node that dies stops advertising; lease_ms later
the others no longer count it, and each worker it watched is watched by the node with the next-highest
score. It says in its own advertisement which workers it watches (`taskstream workers`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from taskstream.schemas import records as r
from taskstream.streams.batcher import Adverts
from taskstream.streams.context import Context

from taskstream.core.batcher import DEFAULT_LANE
from taskstream.core.resources import Over, over_limits, runs_of, watched_by

log = logging.getLogger(__name__)


class ResourceManager:
    def __init__(self, ctx: Context, node: str) -> None:
        self.ctx, self.node = ctx, node
        self.watching: list[str] = []  # advertised: the workers this node watches now
        self.ordered: dict[str, float] = {}  # claim id -> when its kill was last ordered (monotonic)
        self.sent = 0
        self.peers: dict[str, int] = {}  # lane -> how many other live workers read it (LocalClaims' room)
        self.adverts: Adverts | None = None  # what this node hears on the workers topic (the batcher's gate too)

    async def run(self) -> None:
        s = self.ctx.settings
        adverts = self.adverts = Adverts(s)
        await adverts.start()
        try:
            while True:
                await asyncio.sleep(s.heartbeat_ms / 1000)
                orders = self.step(adverts.heard(), time.monotonic())
                if orders:
                    await self.ctx.send_all(orders)
        finally:
            await adverts.stop()

    def step(self, heard: Mapping[str, Mapping[str, Any]], now: float) -> list[tuple[Any, str, Any]]:
        """The orders to send, given every worker's latest advertisement heard within lease_ms."""
        s = self.ctx.settings
        nodes = {w for w, ad in heard.items() if not ad.get("stopping")}
        peers: dict[str, int] = {}
        for w in nodes - {self.node}:
            lanes = heard[w].get("lanes")
            for lane in lanes if isinstance(lanes, list) else [DEFAULT_LANE]:
                peers[str(lane)] = peers.get(str(lane), 0) + 1
        self.peers = peers
        if not heard.get(self.node, {}).get("stopping"):
            nodes.add(self.node)  # a node counts itself before its first advert is read back
        self.watching = watched_by(self.node, nodes, set(heard) | {self.node})
        slack = s.kill_grace_ms + 2 * s.heartbeat_ms
        running: set[str] = set()
        out = []
        for worker in self.watching:
            for over in over_limits(runs_of(heard.get(worker, {})), s.memory_limit_ratio, slack):
                cid = over.run.claim_id
                running.add(cid)
                last = self.ordered.get(cid)
                if last is not None and now - last < s.lease_ms / 1000:
                    continue  # ordered a moment ago: its worker is killing it (sent again only if it goes on)
                self.ordered[cid] = now
                out.append(self._order(worker, over))
        for cid in [c for c in self.ordered if c not in running]:
            del self.ordered[cid]  # ended, or no longer this node's to watch
        return out

    def _order(self, worker: str, over: Over) -> tuple[Any, str, Any]:
        run = over.run
        log.warning("resource manager %s: task %s (claim %s) on worker %s: %s", self.node, run.task_id,
                    run.claim_id, worker, over.reason)  # fmt: skip
        self.sent += 1
        body = r.LimitExceeded(run.claim_id, over.limit, over.reason, self.node)
        at = self.ctx.now_ms()
        rec = self.ctx.input(run.task_id, at, body, f"{run.claim_id}:limit:{self.node}:{self.sent}")
        return (self.ctx.inputs, run.task_id, rec)
