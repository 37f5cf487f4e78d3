"""The batcher's decision, pure: which ready tasks to promote to the queue this round.

Ready tasks wait in the database; each round promotes at most K of them, K being what the live workers
can take (each worker's slots and claim_ahead, plus `batch_ahead` so it never waits for a round) less
what is already queued, claimed or running. Candidates come in rank order (deadline = ready time +
delay tolerance, then priority, highest first). K is shared among the tenants with candidates by
weight (weighted fair queuing: the next place goes to the tenant with the fewest places per unit of
weight, counting what it already holds), never beyond a tenant's cap on tasks queued, claimed or
running at once; a tenant that cannot use its share leaves it to the others. Within a tenant, rank
order. A task that fits no live worker (cpu, memory, gpu, and the worker labels it needs) is not
promoted: it would only wait in the queue.

Each promoted task is routed to a queue lane (`route`). Every worker reads the default lane and may
read more; a task in a lane is claimed by whichever of the lane's workers holds its partition there, so
it goes to a lane all of whose live workers can run it, the least loaded of those (queued tasks per
place), which keeps a task out of the reach of a worker too small for it.

No I/O and no clock: streams/batcher.py reads the read model and sends the promotions.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

DEFAULT_LANE = "default"


@dataclass(frozen=True, slots=True)
class Offer:
    """A live worker, as it last advertised itself."""

    worker: str
    slots: int
    claim_ahead: int
    cpus: float
    memory_mb: int
    gpus: int
    lanes: tuple[str, ...] = (DEFAULT_LANE,)  # the queue lanes it reads
    labels: tuple[tuple[str, str], ...] = ()  # (key, value) pairs it advertises


@dataclass(frozen=True, slots=True)
class Candidate:
    task_id: str
    tenant: str
    cpu: float = 1.0
    memory_mb: int = 256
    gpu: int = 0
    labels: tuple[tuple[str, str], ...] = ()  # worker labels it needs

    def fits(self, offer: Offer) -> bool:
        return (self.cpu <= offer.cpus and self.memory_mb <= offer.memory_mb and self.gpu <= offer.gpus
                and all(pair in offer.labels for pair in self.labels))  # fmt: skip


# The read model's lag as the margin counts it: how long a promoted task still shows as queued, claimed
# or running after it left (projection, NOTIFY, the next round). At 72 places per worker the trip held
# the rate to ~290 tasks/s here, ~0.25 s a place; as a margin's lag, 1 s gave 463 tasks/s against 373 for
# 0.5 s (the margin also has to grow from batch_ahead first; docs/measurements.md, "What limits it now").
MARGIN_LAG_S = 1.0
MARGIN_STEP = 16  # the margin moves in steps: a gate that changed every round would be sent every round
RATE_WINDOW_S = 5.0  # promotions counted over this long for their rate
RATE_FLOOR_S = 1.0  # ... and over at least this long, so one round's promotions are not a rate of their own


def margin(rate_per_s: float, workers: int, least: int, most: int, lag_s: float = MARGIN_LAG_S) -> int:
    """Each live worker's margin (K beyond its slots and claim_ahead): what the workers finish while the
    read model catches up, that is the rate at which tasks are promoted (in a steady state, the rate at
    which they end) times the lag, shared among the workers; at least `least` (`batch_ahead`), at most
    `most` (`batch_ahead_max`, where it is the larger). Slow tasks keep the margin at `least`, so a later,
    more urgent task waits behind few; fast ones widen it, so the workers do not wait for the read model."""
    if workers <= 0 or most <= least:
        return least
    want = math.ceil(rate_per_s * lag_s / workers / MARGIN_STEP) * MARGIN_STEP
    return max(least, min(most, want))


class Promotions:
    """The tasks promoted over the last RATE_WINDOW_S, for their rate (times are the caller's, seconds).

    The rate is over the span the window has covered since promotions began or resumed (at least
    RATE_FLOOR_S), not over the whole window: a burst that begins after a quiet spell is seen at its
    own rate within a round or two, where counting the quiet part of the window would take the whole
    window to see it, and the margin it sizes would hold the burst back meanwhile."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self.seen: deque[tuple[float, int]] = deque()
        self.total = 0

    def add(self, at: float, n: int) -> None:
        if n > 0:
            self.seen.append((at, n))
            self.total += n

    def rate(self, now: float) -> float:
        while self.seen and self.seen[0][0] < now - self.window_s:
            self.total -= self.seen.popleft()[1]
        if not self.seen:
            return 0.0
        return self.total / max(RATE_FLOOR_S, now - self.seen[0][0])


class Departures:
    """The tasks seen leaving the working statuses (queued, claimed, running: ended, or back to ready) as
    their owners' events became durable, remembered for `keep_s`: long enough for the read model to
    show it, after which it speaks for them again. While the read model lags (its projector seconds
    behind in a flood of one-task submissions), it counts as taken tasks that have ended, and the
    rounds promoted a few dozen tasks at a time while the workers waited (docs/measurements.md, "A
    flood's promotions"). A task queued again (a retry) is working again. Times are the caller's."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self.left: dict[str, float] = {}  # task id -> when it was seen leaving
        self.order: deque[tuple[float, str]] = deque()

    def leave(self, task_id: str, at: float) -> None:
        self.left[task_id] = at
        self.order.append((at, task_id))

    def back(self, task_id: str) -> None:
        self.left.pop(task_id, None)

    def expire(self, now: float) -> None:
        while self.order and self.order[0][0] < now - self.keep_s:
            at, task_id = self.order.popleft()
            if self.left.get(task_id) == at:
                del self.left[task_id]

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.left

    def __len__(self) -> int:
        return len(self.left)


def room(offers: Iterable[Offer], batch_ahead: int, occupied: int) -> int:
    """K: what the live workers can take, less what is queued, claimed or running (or promoted and not
    yet seen queued)."""
    return max(0, sum(o.slots + o.claim_ahead + batch_ahead for o in offers) - occupied)


def plan(
    candidates: Sequence[Candidate],
    k: int,
    headroom: Mapping[str, int | None],
    weights: Mapping[str, float],
    offers: Sequence[Offer],
    holding: Mapping[str, int] | None = None,
) -> tuple[list[Candidate], list[Candidate]]:
    """(the candidates to promote, in rank order; those that fit no live worker). `headroom`: per tenant,
    how many more it may have queued, claimed or running (None or absent: no cap); `weights`: its
    share relative to the others (absent: 1); `holding`: what each already has queued, claimed or
    running, which counts towards its share (so the share is of the whole working set, and a round
    with room for one task gives it to the tenant furthest below its share, not to the first in rank)."""
    too_big = [c for c in candidates if not any(c.fits(o) for o in offers)]
    big = {c.task_id for c in too_big}
    queues: dict[str, list[int]] = {}  # tenant -> ranks of its candidates, in order
    for rank, c in enumerate(candidates):
        if c.task_id not in big:
            queues.setdefault(c.tenant, []).append(rank)
    taken: dict[str, int] = {}
    held = holding or {}
    heap: list[tuple[float, int, str]] = []  # (places per weight after one more, next rank, tenant)

    def push(tenant: str) -> None:
        n = taken.get(tenant, 0)
        cap = headroom.get(tenant)
        if n < len(queues[tenant]) and (cap is None or n < cap):
            share = (held.get(tenant, 0) + n + 1) / max(weights.get(tenant, 1.0), 1e-9)
            heapq.heappush(heap, (share, queues[tenant][n], tenant))

    for tenant in queues:
        push(tenant)
    chosen: list[int] = []
    while heap and len(chosen) < k:
        _, rank, tenant = heapq.heappop(heap)
        chosen.append(rank)
        taken[tenant] = taken.get(tenant, 0) + 1
        push(tenant)
    return [candidates[i] for i in sorted(chosen)], too_big


def route(chosen: Sequence[Candidate], offers: Sequence[Offer], queued: Mapping[str, int]) -> list[str]:
    """The lane of each chosen task, in order: among the lanes all of whose live workers fit it, the one
    with the fewest queued tasks per place (its workers' slots and claim_ahead), counting those routed
    before it in this round (ties: the default lane, then by name). A task no lane fits whole goes to
    the lane with the largest share of its workers that fit it. `queued`: tasks queued per lane now."""
    members: dict[str, list[Offer]] = {}
    for o in offers:
        for lane in o.lanes:
            members.setdefault(lane, []).append(o)
    if not members:
        return [DEFAULT_LANE] * len(chosen)
    places = {lane: max(1, sum(o.slots + o.claim_ahead for o in os)) for lane, os in members.items()}
    load = {lane: queued.get(lane, 0) for lane in members}
    out = []
    for c in chosen:
        fitting = {lane: sum(c.fits(o) for o in os) for lane, os in members.items()}
        whole = [lane for lane, n in fitting.items() if n == len(members[lane])]
        share = {lane: n / len(members[lane]) for lane, n in fitting.items()}
        pool = whole or [lane for lane in members if share[lane] == max(share.values())]
        lane = min(pool, key=lambda x: (load[x] / places[x], x != DEFAULT_LANE, x))
        load[lane] += 1
        out.append(lane)
    return out


# -- the gate: whether a task that becomes ready may skip the batcher's round --------------------------


@dataclass(frozen=True, slots=True)
class Gate:
    """What the batcher's last round says to the tasks' owners: whether it had room left over once it
    had promoted every candidate it could (`open`: nothing ready waits for room, so there is no rank to
    honour), the tenants it knows to have no cap (`uncapped`: the tasks of any other, capped or not
    known yet, always wait for a round, which counts what their tenant holds), and, per lane, the
    smallest of its live workers (`floors`: a task that fits it fits every one of the lane's workers, as
    `route` wants). While the gate is open, an owner whose own worker has room queues and claims a task
    for it the moment it becomes ready (streams/worker.LocalClaims), instead of leaving it READY for the
    next round."""

    open: bool
    uncapped: frozenset[str] = frozenset()
    floors: Mapping[str, Offer] | None = None
    # each worker's margin in that round (`margin`): how far a worker alone on its lane claims ahead
    # in-process (streams/worker.LocalClaims); 0: not said (its own batch_ahead)
    margin: int = 0

    def lane_for(self, tenant: str, need: Candidate, lanes: Sequence[str]) -> str | None:
        """The first of `lanes` every live worker of which fits `need`, if the gate lets a task of
        `tenant` past; else None (it waits READY for a round)."""
        if not self.open or tenant not in self.uncapped:
            return None
        floors = self.floors or {}
        return next((lane for lane in lanes if lane in floors and need.fits(floors[lane])), None)


def gate(offers: Sequence[Offer], k: int, chosen: int, uncapped: Iterable[str], margin: int = 0) -> Gate:
    """The gate after a round that had room for `k` and promoted `chosen`: open if room was left over."""
    return Gate(open=chosen < k, uncapped=frozenset(uncapped), floors=floors(offers), margin=margin)


def floors(offers: Sequence[Offer]) -> dict[str, Offer]:
    """Per lane, the least its live workers offer: the smallest cpus, memory and gpus, and the labels
    they all have (what a task must fit; its slots say nothing)."""
    out: dict[str, Offer] = {}
    for lane in sorted({lane for o in offers for lane in o.lanes}):
        os = [o for o in offers if lane in o.lanes]
        labels = set(os[0].labels).intersection(*(o.labels for o in os[1:]))
        out[lane] = Offer(f"floor:{lane}", 0, 0, min(o.cpus for o in os), min(o.memory_mb for o in os),
                          min(o.gpus for o in os), (lane,), tuple(sorted(labels)))  # fmt: skip
    return out
