"""The worker: claims queued tasks, runs their argv as a subprocess, and reports how they ended.

A worker never runs a task on its own authority: it asks the task's owner for the claim (ClaimRequest
on task-inputs) and runs only if the log says it won (TaskClaimed with its claim id); a task of a
partition its own lifecycle owns may be claimed for it by that lifecycle as it is queued (LocalClaims),
and runs once that claim is durable in the log. While it holds the
claim it sends heartbeats, which keep the claim's lease alive; if they stop (the worker died), the
owner expires the lease and the task runs again elsewhere, and anything this worker reports under that
claim later is refused. A worker claims up to `claim_ahead` tasks beyond its free slots (their
leases kept alive while they wait for a slot), so a slot that frees starts its next task without a
claim's round trip. It reports the start (in the same record as the end, for a run shorter than
START_REPORT_AFTER_S), then the exit status and a bounded tail of the output. A
run over its execution cap is killed (SIGTERM to its process group, SIGKILL after a grace period) and
reported as such; so is a run whose task is cancelled (the worker sees TaskCancelled on the log), and
one the resource manager found over a limit (TaskLimitExceeded for its claim, streams/resources.py):
each advertisement reports the running tasks' resident memory and run time for that. Task
processes die with their worker (connectors/keeper.py). Told to stop, a worker gives its running tasks
`drain_ms` to finish, then kills them and hands them back (ReleaseClaim). Started again under the
index of a worker whose process is gone, a worker has the owners expire that one's claims at once
(`release_predecessor`) instead of a lease after its last heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import time
import uuid
from asyncio import FIRST_COMPLETED
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer, TopicPartition
from taskstream.connectors.keeper import Keeper, die_with_parent
from taskstream.schemas import records as r
from taskstream.schemas.codec import DecodeError
from taskstream.streams.context import EVENT_HEADER, KINDS_HEADER, Context
from taskstream.streams.inbox import Inbox
from taskstream.streams.runner import RUNNERS_DIR, CallFailed, Runner, Runners

from taskstream.core import events as e
from taskstream.core.batcher import DEFAULT_LANE, Candidate, Offer
from taskstream.core.model import TaskSpec
from taskstream.settings import worker_labels

log = logging.getLogger(__name__)
CLAIM_RESEND_S = 10.0  # a claim request with no verdict yet is sent again after this, then twice as long ...
CLAIM_RESEND_MAX_S = 60.0  # ... up to this: a worker never gives up a claim while it lives
HANDLED_CLAIMS_KEPT = 100_000  # claims a worker remembers, to skip a queue record it has seen again
# A run's start is reported this long after it started, or with its end if that comes first: a short
# task's start then goes in its finish report's record and is decided in the same step, at its own time.
START_REPORT_AFTER_S = 0.05
# A claim waiting for room looks this often whether it is one too many: held beyond slots + claim_ahead
# (what a worker alone on its lane claims, LocalClaims) while another live worker reads its lane.
GIVE_BACK_CHECK_S = 1.0
# what a claim waiter looks for: the verdicts on its claims, and what ends a run of its own
_VERDICT_EVENTS = (e.TaskClaimed, e.ClaimRejected)
_WATCHED_EVENTS = (*_VERDICT_EVENTS, e.TaskCancelled, e.TaskLimitExceeded)
VERDICTS = tuple(kind.__name__.encode() for kind in _VERDICT_EVENTS)  # as the events' kind header names them
WATCHED = tuple(kind.__name__.encode() for kind in _WATCHED_EVENTS)
BASE_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")


class InOrderAcks:
    """Acknowledges a partition's queue records in offset order, whatever order they are handled in.

    A worker handles many queue records at once (worker_slots + claim_ahead), and they finish in any
    order. Faust commits the end of the first run of consecutive acked offsets: a record still being
    handled just before that run is passed over when it is one offset ahead of the last commit, or
    whatever its distance after a rebalance (Faust forgets its committed offsets then). A worker that
    died after such a commit would leave that record to requeue_ms. Here a record's ack is held back
    until every record of its partition taken before it is handled too.

    `taken` as records arrive (in offset order per partition), with the number of tasks the record stands
    for; `handled` when one of them is done: it returns the events that may be acked now (a record once
    all its tasks are handled). A rebalance starts a new generation (`rebalanced`): Faust delivers the
    kept partitions again from their commits, and what was taken before is never acked."""

    def __init__(self) -> None:
        self.generation = 0
        self.pending: dict[Any, OrderedDict[int, list[Any]]] = {}  # tp -> offset -> [event, tasks left]

    def taken(self, tp: Any, offset: int, event: Any, tasks: int = 1) -> int:
        waiting = self.pending.setdefault(tp, OrderedDict())
        if waiting and offset <= next(reversed(waiting)):
            waiting.clear()  # the partition was sought back: what follows is delivered again, in order
        waiting[offset] = [event, tasks]
        return self.generation

    def handled(self, tp: Any, offset: int, generation: int) -> list[Any]:
        waiting = self.pending.get(tp)
        if generation != self.generation or waiting is None or offset not in waiting:
            return []  # taken before a rebalance: delivered again since, and acked as that
        waiting[offset][1] -= 1
        ready = []
        while waiting and next(iter(waiting.values()))[1] <= 0:
            ready.append(waiting.popitem(last=False)[1][0])
        return ready

    def rebalanced(self) -> None:
        self.generation += 1
        self.pending.clear()


class Reports:
    """A worker's inputs to the task owners (claims, starts, finishes, heartbeats, releases) that come at
    the same moment go out in one write, those of one partition in one record (records.Inputs): each
    record costs the owner a delivery through Faust's machinery, and its worker a produce call. Those
    on tasks whose partition this worker's own lifecycle holds are handed to it in-process instead
    (streams/inbox.py).
    `send` returns once its input is durable; it adds no wait (the write goes out in the event loop's
    next turn with whatever the other executors sent in this one)."""

    def __init__(self, ctx: Context, inbox: Inbox | None = None) -> None:
        self.ctx = ctx
        self.inbox = inbox  # reports on tasks whose partition this worker holds are handed over there
        self.waiting: list[tuple[r.InputRecord, asyncio.Future[None]]] = []
        self.flushes: set[asyncio.Task[None]] = set()

    async def send(self, rec: r.InputRecord) -> None:
        if self.inbox is not None:  # this worker owns the task: handed over now, not a turn of the loop later
            local = self.inbox.local((rec,))[0]
            if local is not None:
                await self.inbox.put(local)
                return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not self.waiting:
            task = asyncio.ensure_future(self._flush())
            self.flushes.add(task)
            task.add_done_callback(self.flushes.discard)
        self.waiting.append((rec, fut))
        await fut

    async def _flush(self) -> None:
        # only reports on tasks held elsewhere when sent (`send` hands the others over in-process): one
        # whose partition came here since still goes through the broker, which reaches any owner
        waiting, self.waiting = self.waiting, []
        sends = self.ctx.inputs_packed([rec for rec, _ in waiting])
        try:
            await self.ctx.send_all(sends)  # retried until the broker takes it
        except asyncio.CancelledError:  # the worker is stopping
            for _, fut in waiting:
                fut.cancel()
            raise
        except Exception as exc:  # not a broker's (send_all retries those): each sender gets it
            for _, fut in waiting:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for _, fut in waiting:
            if not fut.done():
                fut.set_result(None)


class Heartbeats:
    """Keeps the lease of every claim a worker holds alive: one loop for all of them rather than a timer
    task per claim. Each claim beats heartbeat_ms after its claim and after each beat; those due within
    a tenth of that are sent a little early, together (Reports: one record per partition, or in-process
    to the worker's own lifecycle). A claim that ends within heartbeat_ms (most) never beats. Each beat
    moves its lease to lease_ms after it."""

    def __init__(self, ctx: Context, reports: Reports | None) -> None:
        self.ctx = ctx
        self.reports = reports
        self.held: dict[str, list[Any]] = {}  # claim id -> [task id, heartbeats sent, next due (monotonic)]
        self.loop: asyncio.Task[None] | None = None

    def hold(self, task_id: str, claim_id: str) -> None:
        self.held[claim_id] = [task_id, 0, time.monotonic() + self.ctx.settings.heartbeat_ms / 1000]
        if self.loop is None or self.loop.done():
            self.loop = asyncio.ensure_future(self._beat())

    def drop(self, claim_id: str) -> None:
        self.held.pop(claim_id, None)

    def due(self, now: float) -> list[r.InputRecord]:
        """The heartbeats to send at `now` (monotonic), counted as sent."""
        every = self.ctx.settings.heartbeat_ms / 1000
        at, recs = self.ctx.now_ms(), []
        for claim_id, held in self.held.items():
            if held[2] <= now + every / 10:
                held[1] += 1
                held[2] = now + every
                recs.append(self.ctx.input(held[0], at, r.Heartbeat(claim_id), f"{claim_id}:beat:{held[1]}"))
        return recs

    async def _beat(self) -> None:
        while self.held:
            # a claim taken later is due later than every one held now: the earliest is the next wake-up
            await asyncio.sleep(max(0.0, min(h[2] for h in self.held.values()) - time.monotonic()))
            recs = self.due(time.monotonic())
            if not recs:
                continue
            with contextlib.suppress(Exception):  # a lost heartbeat is what leases are for
                if self.reports is not None:
                    await asyncio.gather(*(self.reports.send(rec) for rec in recs))
                else:
                    await self.ctx.send_all(self.ctx.inputs_packed(recs))


class ClaimWaiter:
    """Follows the events topic from the moment the worker starts: resolves pending claims, and tells the
    runs of cancelled tasks that they are.

    Every event it looks for (a verdict, a cancellation, a limit) is decided by the task's owner. Those of
    the partitions this worker's own lifecycle owns (`held`) are handed to it in-process once they are
    durable (`written`), so it reads from the broker only the partitions other workers own: alone, it
    reads nothing, and with a peer, half the topic instead of all of it (each waiter read every record
    of it once for every worker, docs/measurements.md). A partition its lifecycle takes over is read on
    to the end it had then (what the earlier owner wrote), and only then left to the lifecycle; one its
    lifecycle gives away is read again from just after the last record the lifecycle wrote there, so
    nothing the next owner writes is missed whenever this waiter notices the move."""

    def __init__(self, ctx: Context, worker_id: str, held: Callable[[], frozenset[int]] | None = None) -> None:
        self.ctx = ctx
        self.worker_id = worker_id
        # the events partitions this worker's lifecycle decides now (none while a rebalance is under way)
        self.held = held or frozenset
        self.local: dict[int, int] = {}  # partition left to the lifecycle -> where to read on if it goes
        self.draining: dict[int, int] = {}  # partition just taken over -> read on to this offset first
        self.consumer: Any = None
        self.topic = ""
        self._followed: frozenset[int] | None = None  # `held` as last followed
        self.pending: dict[str, asyncio.Future[e.Event]] = {}
        # task id -> a future per run of it here (a watch), each told why that run is to be killed: the
        # task was cancelled, or the run's claim is over a limit. Runs of one task can overlap: one that
        # ends (a claim refused, a drain) while the next attempt, claimed in-process, begins.
        self.cancels: dict[str, list[asyncio.Future[str]]] = {}
        self.claims: dict[asyncio.Future[str], str] = {}  # a watch -> the claim its run won
        self.ready = asyncio.Event()
        self.handled: OrderedDict[str, None] = OrderedDict()  # claim ids this worker has asked for

    def first_time(self, claim_id: str) -> bool:
        """Whether this worker has not asked for this claim before. A task queued again (requeue_ms)
        comes back under the same claim id (the same task, attempt and worker): the second queue
        record is skipped, not claimed again (the owner answers nothing to a repeat of the winner)."""
        if claim_id in self.handled:
            return False
        self.handled[claim_id] = None
        if len(self.handled) > HANDLED_CLAIMS_KEPT:
            self.handled.popitem(last=False)
        return True

    def refused(self, claim_id: str) -> None:
        """Forget a claim the owner refused: a later queue record of the same attempt (the task was taken
        back from the queue and queued again, TaskUnqueued) may claim it again, and gets a verdict."""
        self.handled.pop(claim_id, None)

    def expect(self, claim_id: str) -> asyncio.Future[e.Event]:
        fut: asyncio.Future[e.Event] = asyncio.get_running_loop().create_future()
        self.pending[claim_id] = fut
        return fut

    def watch(self, task_id: str) -> asyncio.Future[str]:
        """A future (a watch, for one run) that gets why the run is to be killed, if the task is cancelled
        while watched or the resource manager finds the run's claim (`won`) over a limit."""
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.cancels.setdefault(task_id, []).append(fut)
        return fut

    def won(self, watch: asyncio.Future[str], claim_id: str) -> None:
        self.claims[watch] = claim_id

    def unwatch(self, task_id: str, watch: asyncio.Future[str]) -> None:
        """The run that made `watch` is over. Only its own watch ends: another run of the task, begun
        meanwhile, is still told of a cancellation (keyed by task alone, the ending run had cancelled
        the next one's watch, which it took for the worker stopping: killed and handed back, again and
        again)."""
        self.claims.pop(watch, None)
        watches = self.cancels.get(task_id, [])
        if watch in watches:
            watches.remove(watch)
        if not watches:
            self.cancels.pop(task_id, None)
        if not watch.done():
            watch.cancel()

    async def run(self) -> None:
        s = self.ctx.settings
        consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap,
            enable_auto_commit=False,
            isolation_level="read_committed",
            fetch_max_wait_ms=500,  # a long-poll: it returns as soon as a verdict is there
        )
        await consumer.start()
        try:
            topic = s.topic("events")
            parts = [TopicPartition(topic, p) for p in range(s.partitions)]
            consumer.assign(parts)
            await consumer.seek_to_end(*parts)
            for tp in parts:  # resolve the positions now, so nothing decided after this point is missed
                await consumer.position(tp)
            self.consumer, self.topic = consumer, topic
            self.ready.set()
            log.info("claim waiter ready: following %s from its end", topic)
            while True:
                await self.follow()
                if consumer.assignment():
                    batches = await consumer.getmany(timeout_ms=200, max_records=1000)
                else:  # every partition is this worker's own: what it needs is handed over in-process
                    batches = {}
                    await asyncio.sleep(0.2)
                for msgs in batches.values():
                    for m in msgs:
                        headers = dict(m.headers or ())
                        kind = headers.get(EVENT_HEADER)
                        if kind == b"TaskEvents":  # packed: decoded if a member is one this worker waits for
                            if self.awaits(headers.get(KINDS_HEADER, b"").split(b",")):
                                self._see(m.value)
                        elif kind is None or self.awaits((kind,)):  # no header: an older writer; decode to be sure
                            self._see(m.value)
        finally:
            await consumer.stop()

    async def follow(self) -> None:
        """Read the partitions the lifecycle does not hold (see the class): those it gave away from their
        marks on, those it took over until they are drained to the end they had then. Everything asked
        of the broker is asked before anything changes here: a broker that fails a call changes nothing,
        and the next call tries again."""
        c, held = self.consumer, self.held()
        if held == self._followed and not self.draining:
            return
        taken = [TopicPartition(self.topic, p) for p in held if p not in self.local and p not in self.draining]
        ends = await c.end_offsets(taken) if taken else {}
        have = c.assignment()
        at = {tp: await c.position(tp) for tp in have}
        # nothing awaited from here on
        gone = {p: self.local.pop(p) for p in list(self.local) if p not in held}
        for p in [p for p in self.draining if p not in held]:
            del self.draining[p]  # given away again before it was drained: read on as before
        self.draining.update((tp.partition, end) for tp, end in ends.items())
        for p, end in list(self.draining.items()):
            tp = TopicPartition(self.topic, p)
            if tp in at and at[tp] >= end:  # (a draining partition is always read: `want` below)
                del self.draining[p]
                self.local[p] = at[tp]
        self._followed = held
        want = {TopicPartition(self.topic, p) for p in range(self.ctx.settings.partitions) if p not in self.local}
        if want != have:
            c.assign(list(want))  # which forgets every position: each is sought to where it is to read from
            for tp in want:
                c.seek(tp, at[tp] if tp in at else gone[tp.partition])

    def written(self, records: list[r.EventRecord], offsets: dict[int, int]) -> None:
        """Events this worker's lifecycle wrote, durable now (`offsets`: the last offset written per events
        partition): seen as if read from the log, and the marks of the partitions it holds moved past them."""
        for rec in records:
            if type(rec.payload) in _WATCHED_EVENTS:
                self._see_one(rec)
        for p, offset in offsets.items():
            if p in self.local:
                self.local[p] = max(self.local[p], offset + 1)

    def awaits(self, kinds: Any) -> bool:
        """Whether a record of events of these kinds may hold one this worker waits for: a verdict while a
        claim is pending, a cancellation or a limit while a run is watched. Most of what the owners write
        is neither (a claim decided in-process has no verdict to wait for), and is not decoded."""
        return any(
            (k in VERDICTS and self.pending) or (k in WATCHED and k not in VERDICTS and self.cancels) for k in kinds
        )

    def _see(self, raw: bytes) -> None:
        try:
            rec = self.ctx.codec.decode("event", raw)
        except DecodeError:
            return  # the projections dead-letter these; a worker only looks for its verdicts
        for one in r.task_events(rec):
            self._see_one(one)

    def _see_one(self, rec: r.EventRecord) -> None:
        p = rec.payload
        if isinstance(p, e.TaskClaimed | e.ClaimRejected) and p.claim_id in self.pending:
            fut = self.pending.pop(p.claim_id)
            if not fut.done():
                fut.set_result(p)
        elif isinstance(p, e.TaskCancelled):
            for told in self.cancels.get(rec.task_id, ()):
                if not told.done():
                    told.set_result(f"cancelled ({p.reason})")
        elif isinstance(p, e.TaskLimitExceeded):
            for told in self.cancels.get(rec.task_id, ()):
                if self.claims.get(told) == p.claim_id and not told.done():
                    told.set_result(f"{p.reason} (resource manager {p.watcher})")


class LocalClaims:
    """Claims the task owner (this worker's lifecycle) decides for this worker itself, in the same step
    that queues the task: no queue record, no claim request and no verdict to wait for (each of them a
    record through the broker and through Faust's delivery). A task is claimed so only while this worker
    is ready and not stopping, reads the task's lane, could run it at all, and holds fewer claims than
    its slots and claim_ahead (those already handed over and those reserved in the batch being decided
    included), or than that plus batch_ahead while no other live worker reads the lane (`peers`, from
    the advertisements: nobody else could take it from the queue); any other is queued for every worker
    as before. The lifecycle reserves a claim while it decides, and hands the task over once the batch
    that recorded the claim is durable (or releases the reservation if the batch is not written). From
    then on the task is held as any won claim; one waiting for a slot beyond `budget` is given back
    once a peer reads its lane (`excess`, Executor._room)."""

    def __init__(
        self, worker_id: str, capacity: Capacity, budget: int, lanes: Any, executor: Any,
        alone_budget: int | None = None, peers: Any = None, gate: Any = None,
    ) -> None:  # fmt: skip
        self.worker_id = worker_id
        self.capacity = capacity
        self.budget = budget  # worker_slots + claim_ahead
        self.alone_budget = budget if alone_budget is None else alone_budget  # + batch_ahead
        self.peers = peers or (lambda _lane: 1)  # lane -> other live workers reading it
        self.lanes = lanes  # () -> the lanes this worker reads
        self.gate = gate or (lambda: None)  # () -> the batcher's gate as last heard (core/batcher.Gate), or None
        self.executor = executor  # () -> an Executor, or None until the worker is ready
        self.reserved = 0
        self.closed = False
        self.runs: set[asyncio.Task[None]] = set()

    def reserve(self, qt: r.QueuedTask) -> str | None:
        """The claim id to decide for this worker, or None: the task goes to the queue."""
        if qt.lane not in self.lanes() or not self._room(qt.lane, qt.spec):
            return None
        self.reserved += 1
        return claim_id_of(qt, self.worker_id)

    def ready_lane(self, spec: TaskSpec) -> str | None:
        """For a task that just became ready: the lane to queue it in at once, and claim it for this
        worker, if the batcher's gate lets it past (open: nothing ready waits for room; its tenant has
        no cap; every live worker of the lane fits it) and this worker holds fewer claims than its
        slots and claim_ahead (`budget`), even while alone on the lane (not the batcher's margin):
        tasks that become ready together skip the batcher's ranking only as far as a worker commits
        to tasks from the queue anyway. None: it waits READY for the batcher's next round."""
        g = self.gate()
        if g is None:
            return None
        res = spec.resources
        need = Candidate("", spec.tenant, res.cpu, res.memory_mb, res.gpu, res.labels)
        lanes = sorted(self.lanes(), key=lambda x: (x != DEFAULT_LANE, x))
        lane = g.lane_for(spec.tenant, need, lanes)
        return lane if lane is not None and self._room(lane, spec, self.budget) else None

    def _room(self, lane: str, spec: TaskSpec, most: int | None = None) -> bool:
        """Whether this worker may hold one more claim in `lane`: within its budget (or `most`)."""
        if self.closed:
            return False
        budget = self.budget if self.peers(lane) else self._alone_budget()
        if self.capacity.claims + self.reserved >= (budget if most is None else min(budget, most)):
            return False
        if self.capacity.could_run(spec.resources) is not None:
            return False
        executor = self.executor()
        return executor is not None and bool(executor.waiter.ready.is_set())

    def _alone_budget(self) -> int:
        """Alone on a lane: room plus the batcher's margin as its last gate said (widened while tasks are
        promoted fast, taskstream/core/batcher.py margin), or batch_ahead, whichever is larger."""
        g = self.gate()
        said = self.budget + g.margin if g is not None and g.margin else 0
        return max(self.alone_budget, said)

    def release(self, n: int) -> None:
        self.reserved -= n

    def excess(self, lane: str) -> bool:
        """Whether a claim waiting for a slot in `lane` is one too many: this worker holds more than
        `budget` (what it claimed while alone) and another live worker now reads the lane."""
        return self.capacity.claims > self.budget and self.peers(lane) > 0

    def hand(self, qt: r.QueuedTask, claim_id: str) -> None:
        """The batch that recorded the claim is durable: run the task."""
        self.reserved -= 1
        executor = self.executor()
        if self.closed or executor is None:  # stopping since: the lease brings it back (lease_ms + grace)
            log.info("task %s claimed in-process as the worker stopped; its lease will expire", qt.task_id)
            return
        self.capacity.claims += 1
        cancelled = executor.waiter.watch(qt.task_id)  # now, so a cancellation decided next is seen
        run = asyncio.ensure_future(executor.run_claimed(qt, claim_id, cancelled))
        self.runs.add(run)
        run.add_done_callback(self._ended)

    def _ended(self, run: asyncio.Task[None]) -> None:
        self.runs.discard(run)
        if not run.cancelled() and run.exception() is not None:
            log.error("task run claimed in-process failed", exc_info=run.exception())

    async def close(self) -> None:
        """Stopping: claim no more, and stop the runs (each drains as a claimer's would)."""
        self.closed = True
        for run in list(self.runs):
            run.cancel()
        await asyncio.gather(*self.runs, return_exceptions=True)


# The claims a worker held as the read model last heard: the task's current attempt, claimed or running.
HELD_BY = (
    "SELECT t.task_id::text, a.claim_id FROM tasks t JOIN attempts a ON a.task_id = t.task_id AND a.attempt = t.attempt"
    " WHERE t.worker = %s AND t.status IN ('CLAIMED', 'RUNNING') AND a.claim_id IS NOT NULL AND a.ended_at IS NULL"
)


async def release_predecessor(ctx: Context, predecessor: str, dsn: str) -> int:
    """The claims `predecessor` (a worker whose process is gone: this one took its index's lock) held, as
    the read model says, each sent to its task's owner as HolderGone: the owner expires the lease now
    (if the claim is still that worker's) instead of lease_ms + lease_grace_ms after its last heartbeat.
    A lone worker claims up to its slots, claim_ahead and the batcher's margin (dozens of tasks), which
    its successor would otherwise wait a lease for. What the read model had not heard of yet expires as
    before. Returns how many were sent."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        rows = await (await conn.execute(HELD_BY, (predecessor,))).fetchall()
    why = f"its worker {predecessor} is gone (its successor {ctx.node} took its index)"
    at = ctx.now_ms()
    sends = [
        (ctx.inputs, tid, ctx.input(tid, at, r.HolderGone(cid, predecessor, why), f"{cid}:holder-gone"))
        for tid, cid in rows
    ]
    if sends:
        await ctx.send_all(sends)
    return len(sends)


def claim_id_of(qt: r.QueuedTask, worker_id: str) -> str:
    """A worker's claim on a task's attempt: the same id however often the attempt is queued."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{qt.task_id}/{qt.attempt}/{worker_id}"))


class Capacity:
    """A worker's slots, cpus, memory and gpus, and what its running tasks take of them. `take` waits
    until a task's needs fit what is free (no worker is ever oversubscribed); `give` hands them back.
    What it offers by default: one cpu per slot and the machine's memory (Settings.worker_cpus, ...)."""

    def __init__(
        self, slots: int, cpus: float, memory_mb: int, gpus: int, labels: dict[str, str] | None = None
    ) -> None:
        self.slots, self.cpus, self.memory_mb, self.gpus = slots, cpus, memory_mb, gpus
        self.labels = dict(labels or {})
        self.used = [0, 0.0, 0, 0]  # slots, cpus, memory_mb, gpus
        self.claims = 0  # claims held, running or waiting for room (advertised)
        # the claims waiting for room, in the order they began to wait: ticket -> [its needs, the future it
        # waits on, if it waits now]. Room that frees goes to the first of them it fits, never to one that
        # came later, and only that one is woken (`_wake`): waking every waiter on every freed slot cost
        # a tenth of the worker's CPU with a few hundred claims waiting (docs/measurements.md)
        self.line: dict[object, list[Any]] = {}
        self.running: dict[str, _Running] = {}  # claim id -> its run, while it runs (advertised)

    @classmethod
    def of(cls, s: Any) -> Capacity:
        memory = s.worker_memory_mb or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
        cpus = s.worker_cpus or float(s.worker_slots)
        return cls(s.worker_slots, cpus, int(memory), s.worker_gpus, worker_labels(s.worker_labels))

    def could_run(self, res: Any) -> str | None:
        """Why a task with these needs can never run here, or None if it can."""
        for need, has, what in ((res.cpu, self.cpus, "cpus"), (res.memory_mb, self.memory_mb, "MB of memory"),
                                (res.gpu, self.gpus, "gpus")):  # fmt: skip
            if need > has:
                return f"it needs {need:g} {what} and this worker offers {has:g}"
        for key, value in res.labels:
            if self.labels.get(key) != value:
                return f"it needs the worker label {key}={value} and this worker has {key}={self.labels.get(key)}"
        return None

    def _fits(self, res: Any) -> bool:
        u = self.used
        return (u[0] < self.slots and u[1] + res.cpu <= self.cpus + 1e-9 and u[2] + res.memory_mb <= self.memory_mb
                and u[3] + res.gpu <= self.gpus)  # fmt: skip

    def try_take(self, res: Any) -> bool:
        """Take the task's needs if they fit now and no claim waiting before it would fit (True); else
        take nothing (False)."""
        if not self._fits(res) or self._first_fitting() is not None:
            return False
        self._use(res)
        return True

    def join(self, res: Any) -> object:
        """Wait in line for room (`take`); the ticket leaves the line with `leave`."""
        ticket = object()
        self.line[ticket] = [res, None]
        return ticket

    def leave(self, ticket: object) -> None:
        if self.line.pop(ticket, None) is not None:
            self._wake()  # the next in line may fit now

    async def take(self, res: Any, ticket: object) -> None:
        """Wait until the task fits and no claim ahead of it in line (`join`) would; take its needs. A
        claim that came later never takes room an earlier one fits (which let a task claimed ahead wait
        behind tasks ranked after it, for as long as they came)."""
        place = self.line[ticket]
        while not self._fits(res) or self._first_fitting() is not ticket:
            place[1] = asyncio.get_running_loop().create_future()
            try:
                await place[1]
            finally:
                place[1] = None
        self._use(res)
        self.leave(ticket)

    def _first_fitting(self) -> object | None:
        if self.used[0] >= self.slots:  # nothing fits without a slot: not a walk of the whole line
            return None
        return next((t for t, (need, _) in self.line.items() if self._fits(need)), None)

    def _use(self, res: Any) -> None:
        u = self.used
        u[0], u[1], u[2], u[3] = u[0] + 1, u[1] + res.cpu, u[2] + res.memory_mb, u[3] + res.gpu

    def _wake(self) -> None:
        """Wake the first claim in line that fits now, if it waits; once it has taken its room it leaves
        the line, which wakes the next that fits then."""
        first = self._first_fitting()
        if first is not None:
            fut = self.line[first][1]
            if fut is not None and not fut.done():
                fut.set_result(None)

    def give(self, res: Any) -> None:
        u = self.used
        u[0], u[1], u[2], u[3] = u[0] - 1, u[1] - res.cpu, u[2] - res.memory_mb, u[3] - res.gpu
        self._wake()

    def runs(self) -> list[dict[str, Any]]:
        """The running tasks as advertised for the resource manager: each one's resident memory (its
        process and all its descendants, now) and how long it has run by this worker's clock."""
        now = time.monotonic()
        return [
            {"task": x.task_id, "claim": claim, "pid": x.pid, "ran_ms": int((now - x.started) * 1000),
             "cap_ms": x.cap_ms, "memory_mb": x.memory_mb, "rss_mb": round(_resident_mb(x.pid), 1)}
            for claim, x in list(self.running.items())
        ]  # fmt: skip

    def offer(self, worker: str, claim_ahead: int, lanes: tuple[str, ...] = (DEFAULT_LANE,)) -> Offer:
        labels = tuple(sorted(self.labels.items()))
        return Offer(worker, self.slots, claim_ahead, self.cpus, self.memory_mb, self.gpus, lanes, labels)


@dataclasses.dataclass(frozen=True, slots=True)
class _Running:
    task_id: str
    pid: int
    started: float  # monotonic
    cap_ms: int
    memory_mb: int


def _resident_mb(pid: int) -> float:
    """Resident memory of a process and its descendants, in MB (0 once it is gone)."""
    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total / 2**20


def _tail(buf: bytearray, limit: int) -> str:
    return bytes(buf[-limit:]).decode("utf-8", errors="replace")


async def _read_tail(stream: asyncio.StreamReader, limit: int) -> bytearray:
    buf = bytearray()
    while chunk := await stream.read(65536):
        buf += chunk
        if len(buf) > 2 * limit:
            del buf[:-limit]
    return buf


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class Executor:
    def __init__(
        self,
        ctx: Context,
        worker_id: str,
        waiter: ClaimWaiter,
        keeper: Keeper | None = None,
        runners: Runners | None = None,
        capacity: Capacity | None = None,
        reports: Reports | None = None,
        heartbeats: Heartbeats | None = None,
    ) -> None:
        self.ctx = ctx
        self.reports = reports  # shared by a worker's executors: what they send together goes as one
        self.heartbeats = heartbeats if heartbeats is not None else Heartbeats(ctx, reports)  # shared too
        self.worker_id = worker_id
        self.waiter = waiter
        self.keeper = keeper
        self.work_root = ctx.settings.state_dir / "work"
        # what every task's environment starts from, read once: os.environ per task was 1.7% of a busy
        # worker's main thread (py-spy)
        self.base_env = {k: os.environ[k] for k in BASE_ENV_KEYS if k in os.environ}
        # shared by a worker's executors
        self.runners = runners if runners is not None else Runners(keeper, self.work_root / RUNNERS_DIR)
        # the worker's slots and resources, shared by its executors: more executors claim than run
        self.capacity = capacity if capacity is not None else Capacity.of(ctx.settings)
        # lane -> whether a claim waiting for room there is to be given back (see GIVE_BACK_CHECK_S)
        self.excess: Any = lambda _lane: False

    async def handle(self, qt: r.QueuedTask) -> None:
        await self.waiter.ready.wait()
        cancelled = self.waiter.watch(qt.task_id)
        try:
            await self._claim_and_run(qt, cancelled)
        finally:
            self.waiter.unwatch(qt.task_id, cancelled)

    async def _claim_and_run(self, qt: r.QueuedTask, cancelled: asyncio.Future[str]) -> None:
        claim_id = claim_id_of(qt, self.worker_id)
        if not self.waiter.first_time(claim_id):
            log.info("task %s attempt %d was queued again; this worker has claimed it already", qt.task_id, qt.attempt)
            return
        never = self.capacity.could_run(qt.spec.resources)
        if never is not None:  # left to a worker that fits, once its record is queued again (requeue_ms)
            log.warning("task %s not claimed: %s", qt.task_id, never)
            return
        verdict = self.waiter.expect(claim_id)
        now = self.ctx.now_ms()
        outcome = None
        wait, waited = CLAIM_RESEND_S, 0.0
        while outcome is None:
            # sent again while no verdict comes: a request can be lost in a rebalance of the owners, and
            # the owner's partition can be without a live owner for a while (noida-db: until restarted)
            request = r.ClaimRequest(qt.attempt, self.worker_id, claim_id)
            await self._report(qt.task_id, now, request, f"{claim_id}:claim")
            try:
                outcome = await asyncio.wait_for(asyncio.shield(verdict), wait)
            except TimeoutError:
                waited += wait
                wait = min(wait * 2, CLAIM_RESEND_MAX_S)
                if waited >= CLAIM_RESEND_MAX_S:
                    log.warning("no verdict on claim %s for task %s after %.0fs; asking again", claim_id,
                                qt.task_id, waited)  # fmt: skip
        if isinstance(outcome, e.ClaimRejected):
            log.info("claim on %s attempt %d lost: %s", qt.task_id, qt.attempt, outcome.reason)
            self.waiter.refused(claim_id)
            return
        self.capacity.claims += 1
        await self.hold(qt, claim_id, cancelled)

    async def run_claimed(self, qt: r.QueuedTask, claim_id: str, cancelled: asyncio.Future[str]) -> None:
        """Run a task this worker's own lifecycle claimed for it (LocalClaims): the claim is in the log
        already, so there is no request and no verdict to wait for. The caller counted the claim in
        `capacity.claims` and watches the task (`cancelled`); both are undone here."""
        self.waiter.first_time(claim_id)  # a queue record of this attempt, should one come, is skipped
        try:
            await self.hold(qt, claim_id, cancelled)
        finally:
            self.waiter.unwatch(qt.task_id, cancelled)

    async def hold(self, qt: r.QueuedTask, claim_id: str, cancelled: asyncio.Future[str]) -> None:
        """Hold a won claim (counted in `capacity.claims`, uncounted here): heartbeats from now on, wait
        for room, run, report. The claim and its room are given back as soon as the run has ended
        (`_Held`); the heartbeats end once the report is durable."""
        self.waiter.won(cancelled, claim_id)
        self.heartbeats.hold(qt.task_id, claim_id)  # from the claim on, not the start
        held = _Held(self.capacity, qt.spec.resources)
        try:
            try:
                if not await self._room(qt):  # claimed ahead: wait for room
                    held.free()  # at once: the other claims waiting decide on the new count
                    why = f"its worker {self.worker_id} held more claims than it has room for; another is live"
                    await self._report(
                        qt.task_id, self.ctx.now_ms(), r.ReleaseClaim(claim_id, why), f"{claim_id}:release"
                    )
                    log.info("gave task %s back: %s", qt.task_id, why)
                    return
            except asyncio.CancelledError:  # the worker is stopping before it ran: hand it back
                why = f"its worker {self.worker_id} stopped before a slot was free"
                with contextlib.suppress(Exception):
                    await self._report(
                        qt.task_id, self.ctx.now_ms(), r.ReleaseClaim(claim_id, why), f"{claim_id}:release"
                    )
                raise
            held.running = True  # room taken
            try:
                if cancelled.done():  # cancelled between the claim and now: nothing to run
                    why = f"{cancelled.result()}, before it started"
                    finish = r.FinishReport(claim_id, None, "", 0, why)
                    await self._report(qt.task_id, self.ctx.now_ms(), finish, f"{claim_id}:finish")
                    return
                await self._run(qt, claim_id, cancelled, held.free)
            finally:
                held.free()
        finally:
            held.free()
            self.heartbeats.drop(claim_id)  # once its report is durable: the lease runs until then

    async def _room(self, qt: r.QueuedTask) -> bool:
        """Wait until the task fits (True), or until the claim is one too many (False: give it back, so
        the worker that came meanwhile can run it)."""
        if self.capacity.try_take(qt.spec.resources):
            return True  # fits now: no wait (nor a timer for one)
        ticket = self.capacity.join(qt.spec.resources)  # its place in line, kept across the checks
        try:
            while True:
                try:  # (a timeout, not wait_for: no task of its own, so a woken claim resumes one turn sooner)
                    async with asyncio.timeout(GIVE_BACK_CHECK_S):
                        await self.capacity.take(qt.spec.resources, ticket)
                    return True
                except TimeoutError:
                    if self.excess(qt.lane):
                        return False
        finally:
            self.capacity.leave(ticket)  # (taken: left already)

    async def _report(self, task_id: str, at: int, body: Any, input_id: str, start: Any = None) -> None:
        """Send one report and wait until it is durable. `start`: the run's start report, held back (see
        _StartReport), goes in the same record as this finish report."""
        if start is not None:
            started_at, report, _ = start
            body = dataclasses.replace(body, started_ms=started_at, pid=report.pid)
        rec = self.ctx.input(task_id, at, body, input_id)
        if self.reports is not None:
            await self.reports.send(rec)
        else:
            await self.ctx.send_all([(self.ctx.inputs, task_id, rec)])

    async def _run(
        self, qt: r.QueuedTask, claim_id: str, cancelled: asyncio.Future[str], ended: Callable[[], None]
    ) -> None:
        """Run the task (room taken) and report how it ended; `ended` is called once its process has
        ended, before the report is durable."""
        spec = qt.spec
        env = dict(self.base_env)
        env.update(spec.env)
        env.update(
            TASKSTREAM_TASK_ID=qt.task_id,
            TASKSTREAM_ATTEMPT=str(qt.attempt),
            TASKSTREAM_TENANT=spec.tenant,
            TASKSTREAM_TASK_NAME=spec.name,
        )
        attempt_dir = self.work_root / qt.task_id / str(qt.attempt)
        cwd = Path(spec.working_dir) if spec.working_dir else attempt_dir
        started = time.monotonic()
        limit = self.ctx.settings.output_tail_bytes
        run: _ProgramRun | _CallRun
        try:
            if spec.call is not None:  # in a runner's scratch directory unless it has its own (streams/runner.py)
                run = await _CallRun.start(self.runners, spec, env, spec.working_dir, attempt_dir, limit)
            else:
                if not spec.working_dir:
                    cwd.mkdir(parents=True, exist_ok=True)
                run = await _ProgramRun.start(spec, env, cwd, limit)
        except OSError as exc:
            what = spec.call.target if spec.call is not None else spec.argv[0]
            why = f"cannot start {what!r}: {exc.strerror or exc}"
            await self._report(
                qt.task_id, self.ctx.now_ms(), r.FinishReport(claim_id, None, "", 0, why), f"{claim_id}:finish"
            )
            return
        if self.keeper is not None and isinstance(run, _ProgramRun):
            self.keeper.watch(run.pid)
        res = spec.resources
        self.capacity.running[claim_id] = _Running(qt.task_id, run.pid, started, spec.execution_cap_ms, res.memory_mb)
        ended_at: list[int] = []

        def gone() -> int:
            """Once, as soon as the run has ended (before its report is durable): its slot given back, and
            the time it ended, for its finish report (stamped before the slot is free, so no task that
            takes the slot is seen in the log to start before this one ended)."""
            if ended_at:
                return ended_at[0]
            ended_at.append(self.ctx.now_ms())
            self.capacity.running.pop(claim_id, None)
            run.cleanup()  # nothing the task started outlives it
            if self.keeper is not None and isinstance(run, _ProgramRun):
                self.keeper.forget(run.pid)
            ended()
            return ended_at[0]

        if isinstance(run, _CallRun):  # answered: its slot is free as the answer comes, not turns of the loop later
            run.answer.add_done_callback(lambda answer: gone() if _answered(answer) else None)
        try:
            await self._supervise(qt, claim_id, run, started, cancelled, gone)
        finally:
            gone()

    async def _supervise(
        self,
        qt: r.QueuedTask,
        claim_id: str,
        run: _ProgramRun | _CallRun,
        started: float,
        cancelled: Any,
        gone: Callable[[], int],
    ) -> None:
        spec = qt.spec
        grace = self.ctx.settings.kill_grace_ms / 1000
        start = _StartReport(self, qt.task_id, claim_id, run.pid)
        reason = ""
        try:
            ended = run.ended()
            await asyncio.wait({ended, cancelled}, timeout=spec.execution_cap_ms / 1000, return_when=FIRST_COMPLETED)
            if not ended.done():
                ended.cancel()
                if cancelled.done():
                    reason = f"killed: {cancelled.result()}"
                else:
                    reason = f"killed: ran over its execution cap of {spec.execution_cap_ms / 1000:g}s"
                await run.stop(grace)
        except asyncio.CancelledError:  # the worker is stopping: drain
            if not await self._drain(qt, claim_id, run, await start.take()):
                gone()
                raise
        code, why, tail = await run.result()
        duration = int((time.monotonic() - started) * 1000)
        at = gone()  # its slot is free while the report is on its way
        if reason and code == 0:
            code = -signal.SIGTERM
        await self._report(
            qt.task_id,
            at,
            r.FinishReport(claim_id, code, tail, duration, reason or why),
            f"{claim_id}:finish",
            await start.take(),
        )

    async def _drain(self, qt: r.QueuedTask, claim_id: str, run: _ProgramRun | _CallRun, start: Any) -> bool:
        """Stopping: give the task drain_ms to finish (True: it did, report it as usual); else kill it and
        hand it back, so it runs again elsewhere without using up a retry (False)."""
        drain = self.ctx.settings.drain_ms / 1000
        log.info("stopping: task %s has %.0fs to finish", qt.task_id, drain)
        if start is not None:
            with contextlib.suppress(Exception):
                await self._report(qt.task_id, *start)
        try:
            await asyncio.wait_for(asyncio.shield(run.wait()), drain)
            return True
        except (TimeoutError, asyncio.CancelledError):
            pass
        await run.stop(self.ctx.settings.kill_grace_ms / 1000)
        why = f"its worker {self.worker_id} stopped; the task did not finish within {drain:g}s"
        with contextlib.suppress(Exception):
            await self._report(qt.task_id, self.ctx.now_ms(), r.ReleaseClaim(claim_id, why), f"{claim_id}:release")
        log.info("handed task %s back: %s", qt.task_id, why)
        return False


class _Held:
    """What a won claim holds of its worker: the claim (counted in `capacity.claims`) and, once it runs,
    its slot and resources. Both are given back once (`free`), as soon as the run has ended: the finish
    report is still on its way, and its lease runs on (heartbeats) until it is durable. Held until the
    report was durable, a slot sat idle for a batch of the lifecycle or two whenever the report went
    in-process (streams/inbox.py), and the worker claimed and ran less than it had room for."""

    def __init__(self, capacity: Capacity, resources: Any) -> None:
        self.capacity, self.resources = capacity, resources
        self.counted = True
        self.running = False

    def free(self) -> None:
        if self.running:
            self.running = False
            self.capacity.give(self.resources)
        if self.counted:
            self.counted = False
            self.capacity.claims -= 1


class _StartReport:
    """A run's start report, sent START_REPORT_AFTER_S after the start unless taken first (to go out with
    the run's end). `take()` gives (at, body, input id) if it was not sent yet, else None. A timer
    handle, not a task: most runs here end before it is due."""

    def __init__(self, executor: Executor, task_id: str, claim_id: str, pid: int) -> None:
        self.report = (executor.ctx.now_ms(), r.StartReport(claim_id, pid), f"{claim_id}:start")
        self.executor, self.task_id = executor, task_id
        self.sent: asyncio.Future[None] | None = None  # the report on its way, once due
        self.taken = False
        self.due = asyncio.get_running_loop().call_later(START_REPORT_AFTER_S, self._send)

    def _send(self) -> None:
        if not self.taken:
            self.sent = asyncio.ensure_future(self.executor._report(self.task_id, *self.report))

    async def take(self) -> tuple[int, Any, str] | None:
        if self.sent is None and not self.taken:
            self.due.cancel()
            self.taken = True
            return self.report
        self.taken = True
        if self.sent is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(self.sent)  # a report after it, never before
        return None


class _ProgramRun:
    """An argv task: its own process group, its stdout and stderr read into a bounded tail."""

    def __init__(self, proc: Any, reader: asyncio.Task[bytearray], limit: int) -> None:
        self.proc, self.reader, self.limit = proc, reader, limit
        self.pid: int = proc.pid

    @classmethod
    async def start(cls, spec: Any, env: dict[str, str], cwd: Path, limit: int) -> _ProgramRun:
        proc = await asyncio.create_subprocess_exec(
            *spec.argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # a process group of its own: killed whole
            preexec_fn=die_with_parent,  # and killed by the kernel if this worker dies
        )
        assert proc.stdout is not None
        return cls(proc, asyncio.create_task(_read_tail(proc.stdout, limit)), limit)

    async def wait(self) -> None:
        await asyncio.shield(self.proc.wait())

    def ended(self) -> asyncio.Future[Any]:
        """Done when the process has ended (cancelling it leaves the process be)."""
        return asyncio.ensure_future(self.wait())

    async def stop(self, grace_s: float) -> None:
        await _terminate(self.proc, grace_s)

    async def result(self) -> tuple[int | None, str, str]:
        _kill_group(self.pid, signal.SIGKILL)  # what the task left running in its group
        buf = await self.reader
        return self.proc.returncode, "", _tail(buf, self.limit)

    def cleanup(self) -> None:
        _kill_group(self.pid, signal.SIGKILL)
        if not self.reader.done():
            self.reader.cancel()


class _CallRun:
    """A callable task, run by one of the worker's runner processes (streams/runner.py)."""

    def __init__(self, runners: Runners, runner: Runner, answer: asyncio.Task[dict[str, Any]], keep: Path, limit: int):
        self.runners, self.runner, self.answer, self.keep, self.limit = runners, runner, answer, keep, limit
        self.pid = runner.pid

    @classmethod
    async def start(
        cls, runners: Runners, spec: Any, env: dict[str, str], cwd: str | None, keep: Path, limit: int
    ) -> _CallRun:
        call = spec.call
        request = {
            "target": call.target,
            "args_json": call.args_json,  # read by the runner: not decoded and encoded again here
            "kwargs_json": call.kwargs_json,
            "env": env,
            "cwd": cwd,  # None: the runner's scratch directory, what is left there moved to `keep`
            "keep": str(keep),
            "limit": limit,
        }
        runner = await runners.acquire()
        runner.send(request)  # in this step: the runner starts without waiting for a turn of the loop
        return cls(runners, runner, asyncio.create_task(runner.answer()), keep, limit)

    async def wait(self) -> None:
        with contextlib.suppress(CallFailed):
            await asyncio.shield(self.answer)

    def ended(self) -> asyncio.Future[Any]:
        """Done when the call has answered or its runner died (cancelling it leaves the call be)."""
        fut = asyncio.shield(self.answer)
        fut.add_done_callback(_retrieved)  # a failed call is `result()`'s to tell
        return fut

    async def stop(self, grace_s: float) -> None:
        self.runner.retired = True
        await _terminate(self.runner.proc, grace_s)

    async def result(self) -> tuple[int | None, str, str]:
        try:
            answer = await self.answer
            return int(answer["exit_code"]), str(answer.get("reason", "")), str(answer.get("tail", ""))
        except CallFailed as exc:
            await self.runner.proc.wait()
            return self.runner.proc.returncode, str(exc), self.runner.tail(self.limit)

    def cleanup(self) -> None:
        if not self.answer.done():  # stopped, or the worker is going: this runner is not reused
            self.answer.cancel()
            self.runner.retired = True
            _kill_group(self.pid, signal.SIGKILL)
        if not self.runner.alive:  # what its stopped call left is the attempt's
            self.runner.keep_scratch(self.keep)
        self.runners.release(self.runner)


def _answered(answer: asyncio.Future[Any]) -> bool:
    """Whether a call answered (a call that failed keeps its runner until its output is read)."""
    return not answer.cancelled() and answer.exception() is None


def _retrieved(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


async def _terminate(proc: Any, grace_s: float) -> None:
    """SIGTERM to the task's process group, SIGKILL `grace_s` later if it has not ended."""
    _kill_group(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), grace_s)
    except (TimeoutError, asyncio.CancelledError):
        _kill_group(proc.pid, signal.SIGKILL)
        await asyncio.shield(proc.wait())
