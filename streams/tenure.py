"""Whether this worker still holds the partitions it decides for: the fence against a zombie owner.

Faust at least once does not fence an owner the group has let go on. A worker frozen past its session
(SIGSTOP, a stalled host) is expelled and its partitions go to another member; thawed, it goes on
deciding from its table, now stale, until its next heartbeat tells it it was let go, and what it writes
meanwhile (events, its table's changelog) lands after the new owner's. Measured: the thawed owner fired
a lease timer, decided again what the new owner had already decided, and saved its stale record last,
so the next owner restored it from the changelog and the task sat queued for the requeue timer.

A worker therefore writes only while the group has confirmed its membership recently: a successful
heartbeat sent within half the session timeout, or a rebalance just completed (the coordinator expires
a member a session timeout after the last heartbeat it received, which was sent no earlier). Between
those it holds its writes (`settled`), and a batch decided across a rebalance is decided again for the
partitions it still holds. Heartbeats are timed by `connectors.faust_patches.track_heartbeats`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class Tenure:
    def __init__(self, session_timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = session_timeout_s / 2
        self.clock = clock
        self.confirmed = self._now()  # a worker starts inside its first rebalance
        self.revoked = 0  # rebalances begun
        self.completed = 0  # rebalances completed

    def _now(self) -> float:
        return self.clock()

    def heard(self, sent_at: float) -> None:
        """A heartbeat sent at `sent_at` (monotonic) was answered: still a member then."""
        self.confirmed = max(self.confirmed, sent_at)

    def rebalance_begun(self) -> None:
        self.revoked += 1

    def rebalance_completed(self) -> None:
        self.completed = self.revoked
        self.confirmed = max(self.confirmed, self._now())

    def current(self) -> bool:
        return self.completed == self.revoked and self._now() - self.confirmed <= self.limit_s

    async def settled(self, poll_s: float = 0.02) -> int:
        """Wait until the membership is confirmed and no rebalance is going on; the rebalances completed
        so far. (A broker out of reach holds the writes until the group has settled without it.)"""
        while not self.current():
            await asyncio.sleep(poll_s)
        return self.completed
