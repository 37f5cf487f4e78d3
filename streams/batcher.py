"""The batcher: keeps the queue short by promoting only the top K ready tasks (taskstream/core/batcher.py).

Ready tasks wait in PostgreSQL (the read model), where they can still be reprioritized or cancelled at
the cost of one row. A round takes what the live workers advertised (on the `workers` topic, followed
here), reads what is queued, claimed or running per tenant, each tenant's cap and weight, and the best
ready candidates by deadline and priority; the pure plan picks at most K; each pick is sent to its
task's owner as a Promote input (those of one partition in one record), and the owner queues it if it
is still READY. A round runs when the PG
projector says something it counts changed (NOTIFY in the transaction that changed it: a task ready,
queued or ended), and at least every batcher_interval_ms (a worker that comes or goes). A notice finds
nothing to do while the gate is open and nothing is READY (the owners claim each task as it becomes
ready, and one that ends frees room nobody waits for): then one cheap query stands for the round
(`idle`).

One batcher runs at a time: the Faust worker that is the group's leader. Its successor after a crash or
rebalance starts from the read model alone. A promotion the read model does not show yet is counted
as taken from the moment it is sent until the row says the task is no longer READY (or PROMOTED_KEPT_S
passes, after which the task may be promoted again: its owner ignores a second promotion).

The read model lags its owners, by seconds in a flood. What the owners on the batcher's own worker
decide reaches it fresher, as their events become durable (`heard`): a task they saw end, or go back to
ready, is not counted as taken although its row still says so (core/batcher.py Departures), and a
promotion it saw end is no longer counted either. The promotions of tasks whose partition that worker
holds are also handed to its owners in-process (streams/inbox.py), as the owners' signals to each
other are: through the broker alone they waited seconds behind a flood of admissions in the worker's
consumer. They are written all the same (the log keeps every promotion), and the copy from the log
changes nothing (a task no longer READY is not queued again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from taskstream.projections.pg import BATCHER_CHANNEL
from taskstream.schemas import records as r
from taskstream.streams.context import Context
from taskstream.streams.inbox import Inbox

from taskstream.core import events as e
from taskstream.core.batcher import (
    DEFAULT_LANE,
    Candidate,
    Departures,
    Gate,
    Offer,
    Promotions,
    gate,
    margin,
    plan,
    room,
    route,
)
from taskstream.settings import Settings

log = logging.getLogger(__name__)
PROMOTED_KEPT_S = 30.0
TOO_BIG_KEPT = 10_000  # tasks reported as fitting no live worker, remembered so each is logged once
NOT_LEADER_WAIT_S = 0.5

TAKEN = "SELECT task_id::text, tenant FROM tasks WHERE status IN ('QUEUED', 'CLAIMED', 'RUNNING')"
# The events by which a task leaves QUEUED, CLAIMED and RUNNING (core/machine.py evolve); TaskQueued is
# the one by which it enters them again (`Batcher.heard`).
LEAVING = (e.TaskSucceeded, e.TaskRetryScheduled, e.TaskDeadLettered, e.TaskCancelled, e.TaskReady, e.TaskUnqueued)
TENANTS = "SELECT tenant, max_running, weight FROM tenants ORDER BY last_submission DESC NULLS LAST"
GATE_TENANTS = 10_000  # uncapped tenants named in the gate at most (the most recent submitters): the others wait
QUEUED_BY_LANE = "SELECT lane, count(*) FROM tasks WHERE status = 'QUEUED' GROUP BY lane"
NOTHING_READY = "SELECT NOT EXISTS (SELECT 1 FROM tasks WHERE status = 'READY')"  # the partial index answers
STILL_READY = "SELECT task_id::text FROM tasks WHERE task_id = ANY(%s::uuid[]) AND status = 'READY'"
# Tasks queued in a lane no live worker reads (its only reader died after they were routed to it).
STRANDED = (
    "SELECT task_id::text, tenant, cpu, memory_mb, gpu, needs_labels, lane FROM tasks"
    " WHERE status = 'QUEUED' AND lane <> ALL(%s) ORDER BY queued_at LIMIT %s"
)
MOVED_AT_ONCE = 1_000  # stranded tasks moved per round at most
# Each tenant's best n (the index tasks_ready_by_deadline), merged in rank order.
CANDIDATES = (
    "SELECT c.task_id::text, c.tenant, c.cpu, c.memory_mb, c.gpu, c.needs_labels FROM tenants n CROSS JOIN LATERAL ("
    " SELECT task_id, tenant, cpu, memory_mb, gpu, needs_labels, promote_by, priority FROM tasks"
    " WHERE status = 'READY' AND tenant = n.tenant AND task_id <> ALL(%s::uuid[])"
    " ORDER BY promote_by, priority DESC LIMIT %s) c "
    "ORDER BY c.promote_by, c.priority DESC, c.task_id"
)


class Batcher:
    def __init__(self, ctx: Context, is_leader: Callable[[], bool], inbox: Inbox | None = None) -> None:
        self.ctx = ctx
        self.is_leader = is_leader
        self.inbox = inbox  # this worker's owners' inbox: promotions of the partitions they hold go there
        # task id -> (tenant, lane, when sent), not yet seen queued
        self.promoted: dict[str, tuple[str, str, float]] = {}
        self.too_big: OrderedDict[str, None] = OrderedDict()
        self.rounds = 0
        self.promotions = Promotions()  # their rate sizes the margin (core/batcher.py margin)
        self.gate = Gate(open=False)  # what the last round says to the owners (core/batcher.py Gate)
        self._said: tuple[Gate, float] | None = None  # the gate last published, and when (monotonic)
        self.moved: dict[str, float] = {}  # stranded task id -> when its move was sent (monotonic)
        self.departed = Departures(PROMOTED_KEPT_S)  # seen leaving the working statuses, fresher than the rows

    async def run(self) -> None:
        s = self.ctx.settings
        while True:
            if not self.is_leader():
                self.promoted.clear()  # a later tenure starts from the read model
                await asyncio.sleep(NOT_LEADER_WAIT_S)
                continue
            adverts = Adverts(s)
            try:
                await adverts.start()
                async with await psycopg.AsyncConnection.connect(s.dsn, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {BATCHER_CHANNEL}".encode())
                    log.info("batcher: promoting ready tasks on this worker (the group's leader)")
                    interval = s.batcher_interval_ms / 1000
                    noticed, last = False, 0.0
                    while self.is_leader():
                        # a notice while nothing waits makes no round; one round every interval at least
                        recent = time.monotonic() - last < interval
                        if not (noticed and recent and await self.idle(conn)):
                            last = time.monotonic()
                            await self.round(conn, adverts.live())
                        await self.say_gate()
                        noticed = await _news(conn, interval)
            except (psycopg.OperationalError, psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
                log.warning("batcher: the read model is not reachable (%s); trying again in 1s", exc)
                await asyncio.sleep(1.0)
            except (KafkaError, OSError) as exc:
                log.warning("batcher: the workers topic is not readable (%s); trying again in 1s", exc)
                await asyncio.sleep(1.0)
            finally:
                await adverts.stop()

    async def round(self, conn: psycopg.AsyncConnection[Any], offers: list[Offer]) -> list[str]:
        """One promotion round; returns the ids promoted."""
        chosen = await self.choose(conn, offers)
        if chosen:
            lanes = await self.route(conn, chosen, offers)
            await self.promote(chosen, lanes)
        if offers:
            await self.rescue(conn, offers)
        return [c.task_id for c in chosen]

    async def idle(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Whether a round now would leave everything as it is: the last round left the gate open (it had
        room for every candidate), no promotion is on its way, and no task is READY. At 100 one-task
        submissions/s a round per notice was 6% of the worker's busy event loop, and every one of them
        found nothing (each task was claimed as it became ready). The rounds every
        batcher_interval_ms still run (workers that come or go, lanes to rescue, the margin)."""
        if not self.gate.open or self.promoted:
            return False
        row = await (await conn.execute(NOTHING_READY)).fetchone()
        return bool(row and row[0])

    async def rescue(self, conn: psycopg.AsyncConnection[Any], offers: list[Offer]) -> list[str]:
        """Move the tasks queued in a lane that no live worker reads (its only reader died within the
        lease in which it still counted as live, and the tasks routed there meanwhile would wait until a
        reader came back) to a live lane that fits them: a Promote into that lane, which the owner takes
        as a move (TaskUnqueued, then TaskQueued). A task that fits no live worker stays where it is.
        Returns the ids moved."""
        live = sorted({lane for o in offers for lane in o.lanes})
        rows = await (await conn.execute(STRANDED, (live, MOVED_AT_ONCE))).fetchall()
        now = time.monotonic()
        for tid in [t for t, sent in self.moved.items() if now - sent > PROMOTED_KEPT_S]:
            del self.moved[tid]
        stranded = [Candidate(tid, tenant, cpu, mem, gpu, tuple(sorted((needs or {}).items())))
                    for tid, tenant, cpu, mem, gpu, needs, _ in rows if tid not in self.moved]  # fmt: skip
        stranded = [c for c in stranded if any(c.fits(o) for o in offers)]
        if not stranded:
            return []
        lanes = await self.route(conn, stranded, offers)
        at = self.ctx.now_ms()
        log.warning("batcher: %d task(s) queued in lanes no live worker reads (%s): moved to %s", len(stranded),
                    ", ".join(sorted({lane for *_, lane in rows})), ", ".join(sorted(set(lanes))))  # fmt: skip
        recs = [self.ctx.input(c.task_id, at, r.Promote(lane), f"{c.task_id}:move:{lane}:{at}")
                for c, lane in zip(stranded, lanes, strict=True)]  # fmt: skip
        await self.ctx.send_all(self.ctx.inputs_packed(recs))
        for c in stranded:
            self.moved[c.task_id] = now
        return [c.task_id for c in stranded]

    async def choose(self, conn: psycopg.AsyncConnection[Any], offers: list[Offer]) -> list[Candidate]:
        """The tasks to promote now, in rank order, given the live workers' offers: reads the read model
        and plans (taskstream/core/batcher.py); sends nothing."""
        s = self.ctx.settings
        self.rounds += 1
        self.gate = Gate(open=False)
        if not offers:
            return []
        await self._forget_queued(conn)
        taken = await self.taken(conn)
        in_flight: dict[str, int] = {}
        for tenant, _, _ in self.promoted.values():
            in_flight[tenant] = in_flight.get(tenant, 0) + 1
        ahead = margin(self.promotions.rate(time.monotonic()), len(offers), s.batch_ahead, s.batch_ahead_max)
        k = room(offers, ahead, sum(taken.values()) + len(self.promoted))
        if k == 0:
            self.gate = Gate(open=False, margin=ahead)
            return []
        headroom: dict[str, int | None] = {}
        weights: dict[str, float] = {}
        uncapped: list[str] = []
        for tenant, cap, weight in await (await conn.execute(TENANTS)).fetchall():
            weights[tenant] = float(weight)
            if cap is not None:
                headroom[tenant] = max(0, cap - taken.get(tenant, 0) - in_flight.get(tenant, 0))
            elif len(uncapped) < GATE_TENANTS:
                uncapped.append(tenant)
        rows = await (await conn.execute(CANDIDATES, (list(self.promoted), k))).fetchall()
        candidates = [Candidate(tid, tenant, cpu, mem, gpu, tuple(sorted((needs or {}).items())))
                      for tid, tenant, cpu, mem, gpu, needs in rows]  # fmt: skip
        holding = {t: taken.get(t, 0) + in_flight.get(t, 0) for t in {*taken, *in_flight}}
        chosen, too_big = plan(candidates, k, headroom, weights, offers, holding)
        self.gate = gate(offers, k, len(chosen), uncapped, ahead)
        self._report_too_big(too_big, offers)
        log.debug("batcher: %d of %d candidates chosen (K %d)", len(chosen), len(candidates), k)
        return chosen

    async def taken(self, conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
        """Per tenant, the tasks queued, claimed or running as the read model says, less those this
        worker's owners saw leave since (`heard`) and those promoted and not seen queued (counted on
        their own)."""
        self.departed.expire(time.monotonic())
        taken: dict[str, int] = {}
        for tid, tenant in await (await conn.execute(TAKEN)).fetchall():
            if tid not in self.departed and tid not in self.promoted:
                taken[tenant] = taken.get(tenant, 0) + 1
        return taken

    async def route(
        self, conn: psycopg.AsyncConnection[Any], chosen: list[Candidate], offers: list[Offer]
    ) -> list[str]:
        """The lane of each chosen task (taskstream/core/batcher.py `route`): with one lane, that one;
        else by what each lane's workers fit and its load (queued, and promoted not yet seen queued)."""
        if len({lane for o in offers for lane in o.lanes}) <= 1:
            return [offers[0].lanes[0] if offers else self.ctx.settings.lane] * len(chosen)
        queued = dict(await (await conn.execute(QUEUED_BY_LANE)).fetchall())
        for _, lane, _ in self.promoted.values():
            queued[lane] = queued.get(lane, 0) + 1
        return route(chosen, offers, queued)

    async def promote(self, chosen: list[Candidate], lanes: list[str] | None = None) -> None:
        """Send each chosen task's owner a Promote into its lane (the default lane if none is given;
        those of one partition in one record; those this worker's owners hold in-process), and count
        them as taken until the read model shows them queued, or their owner here saw them leave."""
        at = self.ctx.now_ms()
        lanes = lanes or [self.ctx.settings.lane] * len(chosen)
        recs = [self.ctx.input(c.task_id, at, r.Promote(lane), f"{c.task_id}:promote:{at}")
                for c, lane in zip(chosen, lanes, strict=True)]  # fmt: skip
        if self.inbox is not None:  # decided without waiting for the broker's copy, which then changes nothing
            for local in self.inbox.local(recs, logged=True):
                if local is not None:
                    self.inbox.put(local).add_done_callback(_decided)
        await self.ctx.send_all(self.ctx.inputs_packed(recs))  # every promotion in the log, as before
        sent = time.monotonic()
        for c, lane in zip(chosen, lanes, strict=True):
            self.promoted[c.task_id] = (c.tenant, lane, sent)
        self.promotions.add(sent, len(chosen))

    def heard(self, records: list[r.EventRecord]) -> None:
        """Events this worker's owners wrote, durable now, in the order decided: a task that left the
        working statuses is not counted as taken from now on, whatever its row says (until the read
        model has had PROMOTED_KEPT_S to show it); one queued again is."""
        if not self.is_leader():
            return  # a later tenure starts from the read model
        now = time.monotonic()
        self.departed.expire(now)
        for rec in records:
            tid = rec.task_id
            if tid is None:
                continue
            if isinstance(rec.payload, LEAVING):
                self.departed.leave(tid, now)
                self.promoted.pop(tid, None)
            elif type(rec.payload) is e.TaskQueued:
                self.departed.back(tid)

    async def say_gate(self) -> None:
        """Publish the gate on the workers topic, which every worker follows (`Adverts.gate`): when it
        changed, and at least every heartbeat_ms while it stays as it is (so a gate heard long ago, from
        a batcher gone since, is known to be stale)."""
        now = time.monotonic()
        if (
            self._said is not None
            and self._said[0] == self.gate
            and now - self._said[1] < self.ctx.settings.heartbeat_ms / 1000
        ):
            return
        body = gate_record(self.gate, self.ctx.node, self.ctx.now_ms())
        await (await self.ctx.producer.send(self.ctx.settings.topic("workers"), GATE_KEY, body, 0, None, None))
        self._said = (self.gate, now)

    async def _forget_queued(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Promotions the read model now shows as no longer READY are counted from it from now on."""
        if not self.promoted:
            return
        still = {row[0] for row in await (await conn.execute(STILL_READY, (list(self.promoted),))).fetchall()}
        old = time.monotonic() - PROMOTED_KEPT_S
        for tid in [t for t, (_, _, sent) in self.promoted.items() if t not in still or sent < old]:
            del self.promoted[tid]

    def _report_too_big(self, too_big: list[Candidate], offers: list[Offer]) -> None:
        for c in too_big:
            if c.task_id in self.too_big:
                continue
            self.too_big[c.task_id] = None
            if len(self.too_big) > TOO_BIG_KEPT:
                self.too_big.popitem(last=False)
            log.warning(
                "batcher: task %s (tenant %s) needs %g cpus, %d MB, %d gpus%s; no live worker offers that (%s): it "
                "waits READY until one does", c.task_id, c.tenant, c.cpu, c.memory_mb, c.gpu,
                _labels(c.labels, " and "),
                ", ".join(f"{o.worker}: {o.cpus:g} cpus, {o.memory_mb} MB, {o.gpus} gpus{_labels(o.labels, ', ')}"
                          for o in offers),
            )  # fmt: skip


def _decided(fut: asyncio.Future[None]) -> None:
    """A promotion handed over in-process that could not be decided: its copy in the log is decided
    later, as any input (and the task, if still READY, promoted again after PROMOTED_KEPT_S)."""
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("batcher: a promotion handed to this worker's owner was not decided (%s)", fut.exception())


def _labels(pairs: tuple[tuple[str, str], ...], sep: str) -> str:
    return f"{sep}labels {','.join(f'{k}={v}' for k, v in pairs)}" if pairs else ""


async def _news(conn: psycopg.AsyncConnection[Any], timeout_s: float) -> bool:
    """Wait until the projector says something changed (True), or `timeout_s` (False); then take every
    notice already there, so a burst of them makes one round."""
    noticed = False
    async for _ in conn.notifies(timeout=timeout_s, stop_after=1):
        noticed = True
    async for _ in conn.notifies(timeout=0.0):
        noticed = True
    return noticed


# -- what workers offer: JSON on the `workers` topic (one partition, kept an hour) -------------------


def advert(offer: Offer, claims: int, stopping: bool, at_ms: int, **more: Any) -> bytes:
    """A worker's advertisement: what it offers (its lanes and labels too), the claims it holds, whether
    it is stopping; `more`: what the resource manager reads and says (its running tasks, the workers it
    watches, streams/resources.py)."""
    body = {"worker": offer.worker, "slots": offer.slots, "claim_ahead": offer.claim_ahead, "cpus": offer.cpus,
            "memory_mb": offer.memory_mb, "gpus": offer.gpus, "lanes": list(offer.lanes),
            "labels": dict(offer.labels),
            "claims": claims, "stopping": stopping, "at_ms": at_ms, **more}  # fmt: skip
    return json.dumps(body, sort_keys=True).encode()


GATE_KEY = b"batcher:gate"


def gate_record(g: Gate, node: str, at_ms: int) -> bytes:
    """The batcher's gate as published on the workers topic (beside the workers' advertisements)."""
    floors = {lane: {"cpus": f.cpus, "memory_mb": f.memory_mb, "gpus": f.gpus, "labels": dict(f.labels)}
              for lane, f in (g.floors or {}).items()}  # fmt: skip
    gate = {"open": g.open, "uncapped": sorted(g.uncapped), "floors": floors, "margin": g.margin}
    body = {"gate": gate, "batcher": node, "at_ms": at_ms}
    return json.dumps(body, sort_keys=True).encode()


def gate_of(body: dict[str, Any]) -> Gate:
    g = body["gate"]
    floors = {str(lane): Offer(f"floor:{lane}", 0, 0, float(f["cpus"]), int(f["memory_mb"]), int(f["gpus"]),
                               (str(lane),), tuple(sorted((str(k), str(v)) for k, v in dict(f["labels"]).items())))
              for lane, f in dict(g["floors"]).items()}  # fmt: skip
    uncapped = frozenset(str(t) for t in g["uncapped"])
    return Gate(open=bool(g["open"]), uncapped=uncapped, floors=floors, margin=int(g.get("margin", 0)))


def offer_of(body: dict[str, Any]) -> Offer:
    lanes = body.get("lanes") or [DEFAULT_LANE]  # an advert from before lanes: the default lane
    if not isinstance(lanes, list) or not all(isinstance(x, str) for x in lanes):
        raise TypeError(f"lanes {lanes!r} is not a list of names")
    labels = body.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise TypeError(f"labels {labels!r} is not a mapping of strings")
    return Offer(str(body["worker"]), int(body["slots"]), int(body["claim_ahead"]), float(body["cpus"]),
                 int(body["memory_mb"]), int(body["gpus"]), tuple(lanes),
                 tuple(sorted((str(k), v) for k, v in labels.items())))  # fmt: skip


class Adverts:
    """Follows the `workers` topic from lease_ms ago: each worker's latest advertisement. A worker is live
    while it advertised within lease_ms and did not say it stops. Age is counted from each record's own
    time for what was there at the start, and from its arrival for what came after (so a worker's skewed
    clock does not make it look dead)."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.tp = TopicPartition(settings.topic("workers"), 0)
        self.latest: dict[str, tuple[dict[str, Any], float]] = {}  # worker -> (advert, monotonic time heard)
        self._gate: tuple[Gate, float] | None = None  # the batcher's latest gate, and when it was heard
        self.consumer: AIOKafkaConsumer | None = None
        self.follower: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.s.bootstrap, enable_auto_commit=False)
        await self.consumer.start()
        self.consumer.assign([self.tp])
        end = (await self.consumer.end_offsets([self.tp]))[self.tp]
        since = int(time.time() * 1000) - self.s.lease_ms
        found = (await self.consumer.offsets_for_times({self.tp: since})).get(self.tp)
        self.consumer.seek(self.tp, found.offset if found is not None else end)
        self.follower = asyncio.create_task(self._follow(end))

    async def _follow(self, end: int) -> None:
        assert self.consumer is not None
        while True:
            batches = await self.consumer.getmany(timeout_ms=500, max_records=1000)
            now_ms, mono = time.time() * 1000, time.monotonic()
            for msgs in batches.values():
                for m in msgs:
                    try:
                        body = json.loads(m.value or b"{}")
                        said = gate_of(body) if m.key == GATE_KEY else offer_of(body)
                        age_s = max(0.0, now_ms - int(body.get("at_ms", now_ms))) / 1000 if m.offset < end else 0.0
                    except (ValueError, KeyError, TypeError, AttributeError):
                        continue  # neither an advertisement nor a gate: skipped, the others still count
                    if isinstance(said, Gate):
                        self._gate = (said, mono - age_s)
                    else:
                        self.latest[body["worker"]] = (body, mono - age_s)

    def heard(self) -> dict[str, dict[str, Any]]:
        """worker -> its latest advertisement, for each worker heard within lease_ms (stopping or not)."""
        if self.follower is not None and self.follower.done():
            self.follower.result()  # what stopped it (the run loop starts again)
            raise KafkaError("the workers topic reader stopped")
        horizon = time.monotonic() - self.s.lease_ms / 1000
        return {w: b for w, (b, heard) in self.latest.items() if heard > horizon}

    def gate(self) -> Gate | None:
        """The batcher's gate as last heard, while it is fresher than two of its heartbeats (the batcher
        says it at least every heartbeat_ms); None: not heard, or a batcher gone since."""
        if self._gate is None or self._gate[1] < time.monotonic() - 2 * self.s.heartbeat_ms / 1000:
            return None
        return self._gate[0]

    def live(self) -> list[Offer]:
        return [offer_of(b) for b in self.heard().values() if not b.get("stopping") and int(b["slots"]) > 0]

    async def stop(self) -> None:
        if self.follower is not None:
            self.follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.follower
        if self.consumer is not None:
            with contextlib.suppress(Exception):
                await self.consumer.stop()
