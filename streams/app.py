"""The Faust application: one agent per scheduler component, each owning work through partitions.

- lifecycle: events + task-inputs -> every later task event (streams/lifecycle.py)
- executor: queue -> claim, run, report (streams/worker.py); a task the lifecycle claimed for this
  worker as it queued it (LocalClaims) is handed over in-process once that claim is durable
- a timer that turns due retries and start times into inputs for the owning partition
- batcher: on the group's leader, promotes the top K ready tasks to the queue (streams/batcher.py)
- every worker advertises what it offers (JSON on the workers topic, every heartbeat_ms, and as it stops),
  with its running tasks' memory and run time
- every worker is a resource manager node: it watches its share of the workers' running tasks and orders
  the kill of one over a limit (streams/resources.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faust
import orjson
from faust.types import TP
from taskstream.connectors import broker
from taskstream.connectors.faust_patches import (
    ack_processed_only,
    commit_past_gaps_at_once,
    consumer_in_loop,
    leave_out,
    merge_gaps_locally,
    read_committed_only,
    seek_uncommitted_to_beginning,
    track_heartbeats,
)
from taskstream.connectors.kafka import faust_app_id, make_codec
from taskstream.connectors.keeper import Keeper, Taken, hold, last_holder
from taskstream.connectors.services import ready_file
from taskstream.connectors.table_state import TableState
from taskstream.schemas.codec import DecodeError
from taskstream.schemas.records import TimerFired, queued_tasks
from taskstream.streams.batcher import Batcher, advert
from taskstream.streams.context import Context
from taskstream.streams.gather import gathered
from taskstream.streams.inbox import Inbox
from taskstream.streams.lanes import LaneReader
from taskstream.streams.lifecycle import Lifecycle, not_for_the_lifecycle
from taskstream.streams.lifecycle import weight as admission_weight
from taskstream.streams.resources import ResourceManager
from taskstream.streams.runner import RUNNERS_DIR, Runners
from taskstream.streams.tenure import Tenure
from taskstream.streams.timers import TimerIndex
from taskstream.streams.worker import (
    Capacity,
    ClaimWaiter,
    Executor,
    Heartbeats,
    InOrderAcks,
    LocalClaims,
    Reports,
    release_predecessor,
)

from taskstream import gc_policy
from taskstream.settings import Settings, lanes_of

log = logging.getLogger(__name__)
TIMER_RESEND_MS = 5_000
TIMER_REBUILD_S = 5.0  # how often the timer index is rebuilt from the table (timers of partitions taken over)
RECHECK_AFTER_REBALANCE_MS = 3_000  # waiting tasks ask their prerequisites again this soon after a rebalance
# The lifecycle takes its inputs in batches of at most this many tasks' worth (streams/gather.py): what
# has arrived when it is free, gathered while it decided the batch before. One write and one wait per
# batch. A packed admission counts as the tasks it packs (lifecycle.weight): a 10,000-task DAG's 21
# records were decided as one batch of 7,500 tasks after the first ones, 1.3 s in which nothing else
# was decided and none of its tasks could be promoted; in slices, the promotions come between them
# (docs/measurements.md, "A large admission decided in slices").
LIFECYCLE_BATCH = 2_000
# The largest record batch the worker's producer builds (aiokafka's default: 16 KiB). Its sender has one
# request in flight to a broker, carrying at most one batch per partition: with 16 KiB batches and four
# partitions a 10,000-task admission's changelog (~7.6 MB) took ~120 round trips, 0.8 s with the event
# loop otherwise idle (docs/measurements.md, "A large admission's write"). The broker takes
# batches up to its message.max.bytes (16 MiB here, 1 MiB by Kafka's default).
PRODUCER_BATCH_BYTES = 512 * 1024


class HeldPartitions:
    """`held(topic)`: the partitions of `topic` (task-inputs or events, co-partitioned) whose inputs may
    be handed to this worker's lifecycle in-process, and whose events it decides: this worker's, while
    no rebalance is under way (their state may be recovering).

    Asked for every report a worker hands over, the consumer's assignment (a new set of every partition
    each time) was 2.5% of a busy worker's main thread (py-spy). The answer is kept until the next
    rebalance begins: the assignment changes only inside one, and Faust counts a rebalance up
    (`rebalancing_count`, with `rebalancing` set) from the consumer's rebalance callback as it begins,
    before anything moves."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.memo: dict[str, tuple[int, frozenset[int]]] = {}  # topic -> (rebalances begun, partitions)

    def __call__(self, topic: str) -> frozenset[int]:
        app = self.app
        count = app.rebalancing_count
        if app.rebalancing:
            return frozenset()
        memo = self.memo.get(topic)
        if memo is not None and memo[0] == count:
            return memo[1]
        partitions = frozenset(tp.partition for tp in app.consumer.assignment() if tp.topic == topic)
        if app.rebalancing or app.rebalancing_count != count:
            return frozenset()  # one began meanwhile: what was read may be from either side of it
        self.memo[topic] = (count, partitions)
        return partitions


def build_app(settings: Settings, index: int = 0, predecessor: str | None = None) -> faust.App:
    """The worker's Faust app. `predecessor`: the id of the worker that last ran under this index and
    whose process is gone; its claims are expired at once (streams/worker.release_predecessor)."""
    s = settings
    node = s.node_id or f"{s.node}-w{index}"
    app = faust.App(
        faust_app_id(s),
        broker=f"kafka://{s.bootstrap}",
        store="rocksdb://",  # rocksdict underneath: the table store that survived restarts here
        datadir=str(s.state_dir / "faust" / f"worker-{index}"),
        web_enabled=False,  # nothing reads Faust's HTTP pages; a port taken by anyone stopped the worker
        topic_partitions=s.partitions,
        topic_replication_factor=1,
        processing_guarantee="at_least_once",
        producer_linger_ms=1,
        producer_max_batch_size=PRODUCER_BATCH_BYTES,
        broker_commit_interval=0.5,
        consumer_auto_offset_reset="earliest",
        stream_wait_empty=False,
        table_standby_replicas=s.table_standby_replicas,
        **broker.faust_settings(s),
    )
    raw: dict[str, Any] = {"key_serializer": "raw", "value_serializer": "raw"}
    events = app.topic(s.topic("events"), **raw)
    inputs = app.topic(s.topic("task-inputs"), **raw)
    queue = app.topic(s.topic("queue"), **raw)
    dead = app.topic(s.topic("dead-letters"), **raw)
    commands = app.topic(s.topic("commands"), **raw)  # written to (schedules), never read here
    owned = app.topic(s.topic("events"), s.topic("task-inputs"), **raw)
    events_name = s.topic("events")
    # the lifecycle's own writing on the events topic: dropped before Faust delivers it (see leave_out)
    leave_out(app, lambda m: m.topic == events_name and not_for_the_lifecycle(m.headers))
    tasks = app.Table("tasks", default=None, partitions=s.partitions, key_type=bytes, value_type=bytes)
    timers = app.Table("timers", default=None, partitions=s.partitions, key_type=bytes, value_type=bytes)

    holder: dict[str, Any] = {}

    def ctx() -> Context:
        if "ctx" not in holder:
            holder["ctx"] = Context(s, make_codec(s), node, events, inputs, queue, dead, app.producer, commands)
        return holder["ctx"]

    due_index = TimerIndex()
    lifecycle_holder: dict[str, Lifecycle] = {}
    tenure = Tenure(s.worker_session_timeout_ms / 1000)  # the lifecycle writes only while it holds
    track_heartbeats(tenure.heard, faust_app_id(s))  # the workers' group's, not a lane's

    def holding() -> Callable[[Any], bool]:
        """Whether the partition of a message (consumed, or handed over in-process) is this worker's, as
        the assignment is now: asked once for a batch's messages."""
        assigned = app.consumer.assignment()
        return lambda m: TP(m.topic, m.partition) in assigned

    held = HeldPartitions(app)

    inputs_topic = s.topic("task-inputs")
    inbox_holder: dict[str, Inbox] = {}

    def inbox() -> Inbox | None:
        if not s.local_inputs:
            return None
        if "i" not in inbox_holder:
            inbox_holder["i"] = Inbox(inputs_topic, ctx().partition, lambda: held(inputs_topic), ctx().codec)
        return inbox_holder["i"]

    def lifecycle() -> Lifecycle:
        if "l" not in lifecycle_holder:
            lifecycle_holder["l"] = Lifecycle(
                ctx(), TableState(tasks), TableState(timers), due_index, tenure, holding=holding
            )
            if s.local_claims:
                lifecycle_holder["l"].local = local
            lifecycle_holder["l"].inbox = inbox()
            lifecycle_holder["l"].written = written
        return lifecycle_holder["l"]

    deciding = asyncio.Lock()  # the lifecycle decides one batch at a time, from Faust or from the inbox
    events_topic = s.topic("events")

    async def decide(consumed: list[Any]) -> None:
        """Decide a batch: what Faust consumed, and what was handed over in-process meanwhile (unless a
        rebalance is under way: that waits for the next batch). A handed-over input whose partition was
        given away goes through the broker instead (`Lifecycle.on_batch`). One batch, one write of
        events and state, however the inputs came."""
        async with deciding:
            box = inbox()
            taken = box.drain() if box is not None and not app.rebalancing else []
            try:
                batch = consumed + [item for item, _ in taken]
                if batch:
                    await lifecycle().on_batch(batch, events_topic, lambda m, h: _guarded(ctx(), m, "lifecycle", h))
            except Exception as exc:  # a bug: the reporters hear of it (on_batch dead-letters what raises)
                for _, fut in taken:
                    if not fut.done():
                        fut.set_exception(exc)
                if consumed:
                    raise
                log.exception("inputs handed over in-process could not be decided")
                return
            for _, fut in taken:
                if not fut.done():
                    fut.set_result(None)

    @app.agent(owned, name="lifecycle")
    async def lifecycle_agent(stream: Any) -> None:
        async for batch in gathered(stream, LIFECYCLE_BATCH, _weight):
            await decide([_Msg(event) for event in batch])

    @app.task
    async def local_inputs() -> None:
        """Inputs handed over in-process (streams/inbox.py) that no batch from the broker took along:
        decided on their own as soon as the lifecycle is free, once any rebalance is over."""
        box = inbox()
        if box is None:
            return
        while True:
            await box.wait()
            while app.rebalancing:
                await asyncio.sleep(0.02)
            await decide([])

    worker_id = node
    waiter_holder: dict[str, Any] = {}

    def written(records: list[Any], offsets: dict[int, int]) -> None:
        """The lifecycle's events, durable: to this worker's claim waiter, which reads only what other
        workers decide from the broker, and to its batcher."""
        if "w" in waiter_holder:
            waiter_holder["w"].written(records, offsets)
        if "batcher" in waiter_holder:  # and to the batcher here: the read model says it later
            waiter_holder["batcher"].heard(records)

    @app.task
    async def claim_waiter() -> None:
        waiter_holder["w"] = ClaimWaiter(ctx(), worker_id, lambda: held(events_name))
        await waiter_holder["w"].run()

    def executor_for() -> Executor:
        if "keeper" not in waiter_holder:  # kills this worker's task processes if the worker dies
            waiter_holder["keeper"] = Keeper()
            # for callable tasks, with their scratch directories under the state directory's work/
            waiter_holder["runners"] = Runners(waiter_holder["keeper"], s.state_dir / "work" / RUNNERS_DIR)
            waiter_holder["capacity"] = capacity
            # what the executors send together goes as one; to this worker's own lifecycle in-process
            waiter_holder["reports"] = Reports(ctx(), inbox())
            waiter_holder["heartbeats"] = Heartbeats(ctx(), waiter_holder["reports"])  # one loop for every claim
        ex = Executor(
            ctx(), worker_id, waiter_holder["w"], waiter_holder["keeper"], waiter_holder["runners"],
            waiter_holder["capacity"], waiter_holder["reports"], waiter_holder["heartbeats"],
        )  # fmt: skip
        ex.excess = local.excess  # the claims a worker alone took beyond its room, once it is not alone
        return ex

    in_order = InOrderAcks()
    workers_topic = s.topic("workers")
    capacity = Capacity.of(s)  # what this worker offers, and what its tasks take of it
    lanes = lanes_of(s)  # the default lane (the executor agent below), then the others (streams/lanes.py)
    reading = {lanes[0]}  # the lanes advertised: another once its topic exists and its reader has subscribed

    # the tasks this worker's lifecycle claims for this worker as it queues them (streams/worker.py)
    def local_executor() -> Executor | None:
        if "w" not in waiter_holder:
            return None  # not ready yet
        if "local" not in waiter_holder:
            waiter_holder["local"] = executor_for()
        return waiter_holder["local"]  # type: ignore[no-any-return]

    def peers(lane: str) -> int:
        """Other live workers reading `lane`, as this node's resource manager last heard (none yet: 0)."""
        return holder["rm"].peers.get(lane, 0) if "rm" in holder else 0

    def gate() -> Any:
        """The batcher's gate as this node last heard it on the workers topic (None: not heard)."""
        adverts = holder["rm"].adverts if "rm" in holder else None
        return adverts.gate() if adverts is not None else None

    room = s.worker_slots + s.claim_ahead
    local = LocalClaims(
        worker_id, capacity, room, lambda: reading, local_executor, room + s.batch_ahead, peers, gate
    )  # fmt: skip

    async def advertised(stopping: bool = False) -> None:
        offer = capacity.offer(worker_id, s.claim_ahead, tuple(x for x in lanes if x in reading))
        watching = [] if stopping or "rm" not in holder else holder["rm"].watching
        ad = advert(offer, capacity.claims, stopping, ctx().now_ms(), running=capacity.runs(), watching=watching)
        await (await app.producer.send(workers_topic, worker_id.encode(), ad, 0, None, None))

    @app.task
    async def advertise() -> None:
        """Say what this worker offers every heartbeat_ms (the batcher's capacity), and that it stops."""
        try:
            while True:
                with contextlib.suppress(Exception):
                    await advertised()
                await asyncio.sleep(s.heartbeat_ms / 1000)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(advertised(stopping=True), 2.0)
            raise

    @app.task
    async def resource_manager() -> None:
        holder["rm"] = ResourceManager(ctx(), worker_id)
        await holder["rm"].run()

    if s.batcher:

        @app.task
        async def batcher() -> None:
            waiter_holder["batcher"] = Batcher(ctx(), app.is_leader, inbox())
            await waiter_holder["batcher"].run()

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def _revoked(_sender: Any, *_: Any, **__: Any) -> None:
        tenure.rebalance_begun()
        in_order.rebalanced()  # what was taken is delivered again from the commits (InOrderAcks)

    async def claimer(work: asyncio.Queue[Any], acks: Any) -> None:
        while True:
            event, generation, qt = await work.get()
            tp, offset = event.message.tp, event.message.offset
            if tp not in app.consumer.assignment():
                continue  # its partition went to another worker in a rebalance, which reads it again
            while "w" not in waiter_holder:
                await asyncio.sleep(0.05)
            try:
                # a stopping worker's drain happens in here (streams/worker.py)
                await _guarded(ctx(), _Msg(event), "executor", executor_for().handle(qt))
            except Exception:  # not even dead-lettered (the broker refused that too): requeue_ms covers it
                log.exception("executor could not handle a task of queue record %s", offset)
            for done in in_order.handled(tp, offset, generation):
                await acks.ack(done)  # its offset may be committed (not if the worker stopped first)

    @app.agent(queue, name="executor")
    async def executor(stream: Any) -> None:
        """Queue records are taken as they come, and the tasks each stands for handed to worker_slots +
        claim_ahead claimers (at most worker_slots of them run at once); a record is acknowledged once
        all its tasks are handled. The stream itself never waits: Faust hands every topic's records over
        through one conductor, and an executor stream left full stopped the lifecycle's inputs with it,
        so the claims it waited for were never decided (a 10,000-task backlog, docs/measurements.md).
        Records of a partition this worker no longer has are dropped unhandled: the new owner reads them
        from the last commit (an added worker takes its share at once instead of after this one's
        backlog). Acks go in offset order (InOrderAcks)."""
        acks = stream.noack()
        work: asyncio.Queue[Any] = asyncio.Queue()
        claimers = [asyncio.ensure_future(claimer(work, acks)) for _ in range(s.worker_slots + s.claim_ahead)]
        try:
            async for event in acks.events():
                tp = event.message.tp
                if tp not in in_order.pending:  # the first record of a partition since the last rebalance
                    log.info("executor: queue %s[%s] from offset %s", tp.topic, tp.partition, event.message.offset)
                try:
                    tasks = queued_tasks(ctx().codec.decode("queued", event.value))
                except DecodeError as err:
                    generation = in_order.taken(tp, event.message.offset, event)
                    await ctx().dead_letter(_Msg(event), err.reason, "executor")
                    for done in in_order.handled(tp, event.message.offset, generation):
                        await acks.ack(done)
                    continue
                generation = in_order.taken(tp, event.message.offset, event, len(tasks))
                for qt in tasks:
                    work.put_nowait((event, generation, qt))
        finally:
            for c in claimers:
                c.cancel()
            await asyncio.gather(local.close(), *claimers, return_exceptions=True)

    def lane_reader(lane: str) -> Any:
        async def read_lane() -> None:
            """Another queue lane this worker reads (streams/lanes.py), into the same executors."""
            while "w" not in waiter_holder:
                await asyncio.sleep(0.05)

            async def handle(m: Any, qt: Any) -> None:
                await _guarded(ctx(), m, "executor", executor_for().handle(qt))

            def ready() -> None:
                reading.add(lane)

            await LaneReader(ctx(), lane, handle, s.worker_slots + s.claim_ahead, ready).run()

        read_lane.__name__ = read_lane.__qualname__ = f"read_lane_{lane.replace('-', '_')}"
        return read_lane

    for lane in lanes[1:]:
        app.task(lane_reader(lane))

    sent: dict[bytes, tuple[int, int]] = {}  # key -> (the due time fired, when)
    rebuilt = [0.0]
    rebalanced = [0.0]  # when this worker's last rebalance completed (monotonic)
    early: set[bytes] = set()  # recheck timers pulled forward by a rebalance

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]
    async def _rebalanced(_sender: Any, *_: Any, **__: Any) -> None:
        # Inputs that arrived during the rebalance may have been skipped (connectors/faust_patches.py):
        # the waiting tasks ask their prerequisites again soon, not after their next recheck_ms.
        if not rebalanced[0]:  # the first: what the worker built to start is never walked by the collector again
            gc_policy.started()
        rebalanced[0] = time.monotonic()
        rebuilt[0] = 0.0
        tenure.rebalance_completed()

    @app.timer(interval=0.25)
    async def fire_timers() -> None:
        """Send TimerFired for every due timer. Due ones come from the index (streams/timers.py), which
        is rebuilt from the table every TIMER_REBUILD_S; the table decides (a timer changed or cleared
        since is not fired). A fired timer is sent again after TIMER_RESEND_MS if it is still there."""
        now = ctx().now_ms()
        if time.monotonic() - rebuilt[0] >= TIMER_REBUILD_S:
            after_rebalance = rebalanced[0] > rebuilt[0]
            rebuilt[0] = time.monotonic()
            entries = []
            for k, v in list(timers.items()):
                if v is None:
                    continue
                t = orjson.loads(v)
                due = int(t["due"])
                if after_rebalance and t["purpose"] == "recheck":
                    early.add(k)
                    due = min(due, now + RECHECK_AFTER_REBALANCE_MS)
                entries.append((k, due))
            due_index.rebuild(entries)
            for k in [k for k, (_due, at) in sent.items() if now - at > TIMER_RESEND_MS]:
                del sent[k]  # past its resend window: forgotten
        fired = []
        for key in due_index.due(now):
            raw_timer = timers.get(key)
            if raw_timer is None:
                continue
            t = orjson.loads(raw_timer)
            if t["purpose"] == "recheck" and key in early:
                early.discard(key)  # due now: pulled forward by a rebalance
            elif t["due"] > now:
                due_index.note(key, int(t["due"]))  # moved later since it was noted
                continue
            last = sent.get(key)  # (due, when sent) of the last firing of this key
            if last is not None and last[0] == t["due"] and now - last[1] <= TIMER_RESEND_MS:
                due_index.note(key, last[1] + TIMER_RESEND_MS + 1)  # that firing may still be on its way
                continue
            tid = key.decode()
            sent[key] = (t["due"], now)
            due_index.note(key, now + TIMER_RESEND_MS + 1)  # looked at again then, if still there
            body = TimerFired(t["purpose"])
            fired.append((inputs, tid, ctx().input(tid, now, body, f"{tid}:timer:{t['purpose']}:{t['due']}")))
        if fired:
            await ctx().send_all(fired)  # all due timers in one write

    @app.task
    async def mark_ready() -> None:
        # SIGUSR1: every asyncio task's stack into the log (what a stuck worker is waiting for)
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _dump_tasks)
        ctx()  # registers schemas before anything flows
        path = ready_file(s, f"worker-{index}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        log.info("worker %s ready", node)
        if predecessor is not None and predecessor != node:
            try:
                n = await release_predecessor(ctx(), predecessor, s.dsn)
            except Exception as exc:  # the leases expire as they would have: nothing is lost
                log.warning("worker %s: could not expire the claims of %s, gone: %s", node, predecessor, exc)
            else:
                log.info("worker %s: %d claim(s) of %s, gone, sent to be expired now", node, n, predecessor)

    return app


def _dump_tasks() -> None:
    import io

    for task in asyncio.all_tasks():
        out = io.StringIO()
        task.print_stack(limit=12, file=out)
        log.warning("task %s:\n%s", task.get_name(), out.getvalue())


async def _guarded(ctx: Context, msg: Any, agent: str, handling: Any) -> None:
    """Run one message's handler. A bug that raises on this message must neither kill the agent nor stall
    the partition nor vanish: the message goes to the dead-letter topic with the error, and the agent
    moves on. (Broker errors never reach here: sends retry until they succeed.)"""
    try:
        await handling
    except Exception as exc:
        log.exception("%s could not handle %s[%s]@%s", agent, msg.topic, msg.partition, msg.offset)
        await ctx.dead_letter(msg, f"{agent} failed on this record: {type(exc).__name__}: {exc}", agent)


_held: list[Any] = []


class WorkerIndexTaken(RuntimeError):
    pass


def index_lock(settings: Settings, index: int) -> Path:
    return settings.state_dir / "faust" / f"worker-{index}.lock"


def hold_index(settings: Settings, index: int) -> Any:
    """The lock of worker `index` in this state directory (connectors/keeper.hold), or WorkerIndexTaken
    naming the worker that runs under it and what to do instead."""
    try:
        return hold(index_lock(settings, index))
    except Taken as taken:
        raise WorkerIndexTaken(
            f"worker {index} of {settings.state_dir} is already running (pid {taken.pid or '?'}); "
            "start this one with another --index"
        ) from None


def _weight(event: Any) -> int:
    """What a Faust event of the lifecycle's costs to decide, in tasks (streams/lifecycle.weight)."""
    return admission_weight(event.message.headers, event.message.value)


class _Msg:
    """The parts of a Faust event the handlers use (topic, partition, offset, timestamp, key, value)."""

    def __init__(self, event: Any) -> None:
        self.event = event
        m = event.message
        self.topic, self.partition, self.offset = m.topic, m.partition, m.offset
        self.timestamp = m.timestamp
        self.key, self.value = m.key, m.value
        self.headers = dict(m.headers or ())


def run_worker(settings: Settings, index: int) -> None:
    (settings.state_dir / "faust").mkdir(parents=True, exist_ok=True)
    # One process per worker index and state directory: a second would share the first one's table
    # store and node id. Held until this process ends.
    before = last_holder(index_lock(settings, index))
    _held.append(hold_index(settings, index))
    # The lock was free, so whoever wrote its pid there is gone: its claims need not wait for their
    # leases. A node id set by hand is the same for its successor, whose own claims are not told apart.
    predecessor = f"{socket.gethostname()}-{before}-w{index}" if before and not settings.node_id else None
    broker.install_client_patches(settings, settings.state_dir / "faust" / f"worker-{index}.member")
    read_committed_only()
    ack_processed_only()
    merge_gaps_locally()
    commit_past_gaps_at_once()
    consumer_in_loop()
    seek_uncommitted_to_beginning({settings.topic(t) for t in ("events", "task-inputs", "queue")})
    app = build_app(settings, index, predecessor)
    worker = faust.Worker(app, loglevel="INFO", quiet=True)
    worker.execute_from_commandline()
