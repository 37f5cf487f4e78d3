"""The task's owner (dependency tracker, dispatcher, and the claim's judge), one per partition.

It consumes the events topic (to pick up what admission wrote) and the task-inputs topic (claims and
reports from workers, signals from other partitions, timers, user requests), both keyed by task id, so
one owner sees everything about a task. For each input it runs the pure core (`machine.run`), writes
the resulting events and signals, waits until they are durable, and only then saves the task's record
in its table. Reprocessing an input after a crash therefore either finds the record already saved (the
events are durable) or decides again from the same state and time, producing the same events with the
same ids, which every reader skips.

Inputs come in batches (`on_batch`): each is decided in turn against the records as the batch left
them, everything decided is written in one go and waited for once, and only then are the records and
timers saved (each once, as the batch left it: one RocksDB write batch per partition, and their
changelog records produced together and waited for once, connectors/table_state.py) and the batch
acknowledged. One Kafka round trip for the events and one for the state per batch, rather than per
input, is what the hot path costs.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from typing import Any

import orjson
from taskstream.connectors.table_state import ChangelogRecord, KeyedState
from taskstream.schemas import records as r
from taskstream.schemas.codec import DecodeError, _plain, spec_from
from taskstream.streams import state_codec
from taskstream.streams.admission import CHUNK_TASKS
from taskstream.streams.context import EVENT_HEADER, Context, unit_random
from taskstream.streams.inbox import Inbox, LocalInput
from taskstream.streams.state_codec import TaskRecord
from taskstream.streams.tenure import Tenure
from taskstream.streams.timers import TimerIndex

from taskstream.core import commands as c
from taskstream.core import events as e
from taskstream.core import schedule
from taskstream.core.machine import Rejection, evolve, run
from taskstream.core.model import TERMINAL, Status, TaskState
from taskstream.core.submission import Submission, external_dependencies

log = logging.getLogger(__name__)
NOT_ADMITTED = "NOT_ADMITTED"  # outcome sent to dependents of a task that was never admitted in time
ADMISSION_EVENTS = (e.TaskSubmitted, e.TaskAdmitted, e.TaskRejected)
# The events this agent acts on, by their header: it reads the events topic for admissions, and most of
# what is there is its own writing (a packed TaskEvents per partition and batch), not worth decoding
# again; the worker drops that before Faust delivers it (not_for_the_lifecycle, streams/app.py).
ADMISSION_KINDS = frozenset({b"TasksAdmitted", *(k.__name__.encode() for k in ADMISSION_EVENTS)})


def not_for_the_lifecycle(headers: Any) -> bool:
    """Whether a record of the events topic with these headers (pairs of name and value) is one the
    lifecycle skips: its kind is named and is not an admission's (a record without the header might be
    anything, and is decoded)."""
    for name, value in headers or ():
        if name == EVENT_HEADER:
            return value not in ADMISSION_KINDS
    return False


# Less than one task of a packed admission takes in the record, however small the task (a no-op: ~140
# bytes): a record's size over this is at least as many tasks as it packs, and not many more for small ones.
ADMITTED_TASK_BYTES = 128


def weight(headers: Any, value: bytes | None) -> int:
    """What a record of the lifecycle's inputs costs to decide, in tasks, from its headers (pairs of name
    and value) and size: a packed admission about as many as it packs (CHUNK_TASKS at most; a shared one
    of a flood of one-task submissions packs tens), anything else one."""
    if dict(headers or ()).get(EVENT_HEADER) != b"TasksAdmitted":
        return 1
    return min(CHUNK_TASKS, max(1, len(value or b"") // ADMITTED_TASK_BYTES))


LEASED = (Status.CLAIMED, Status.RUNNING)  # the statuses in which a claim's lease runs


class _Batch:
    """What a batch of inputs decided and has not written yet: the records to send, and the tasks'
    records and timers as the batch left them (a timer of None: cleared)."""

    def __init__(self) -> None:
        self.sends: list[tuple[Any, str, Any]] = []
        self.tasks: dict[bytes, bytes] = {}
        self.timers: dict[bytes, bytes | None] = {}
        self.source: dict[bytes, int] = {}  # key -> the partition of the message it came with (saved there)
        self.handoffs: list[tuple[r.QueuedTask, str]] = []  # claimed in-process: run once written


# A batch decides the signals it sends to tasks held here in at most this many rounds (a round per hop:
# one task ending makes its dependents ready, which sends nothing more until they run).
ECHO_ROUNDS = 8
ECHOED = (r.PrerequisiteEnded, r.WatchPrerequisite)  # the signals one task's owner sends another's

_NO_TIMER = (e.TaskReady, e.TaskUnqueued, e.TaskCancelled, e.TaskSucceeded, e.TaskDeadLettered)  # timer cleared


class Lifecycle:
    def __init__(
        self,
        ctx: Context,
        tasks: KeyedState,
        timers: KeyedState,
        index: TimerIndex | None = None,
        tenure: Tenure | None = None,
        holding: Any = None,
    ) -> None:
        self.ctx = ctx
        self.tasks = tasks  # task id (bytes) -> TaskRecord JSON (connectors/table_state.py)
        self.timers = timers  # task id (bytes) -> {"due": ms, "purpose": str}
        self.index = index or TimerIndex()  # when they are due (streams/timers.py)
        self._batch: _Batch | None = None
        self._message: Any = None  # the batch's message being handled
        # tenure: whether this worker's membership is confirmed (streams/tenure.py); holding(): a test of
        # whether a message's partition is this worker's, as the assignment is when a batch begins
        # (asked once per batch: the consumer's assignment is a new set of every partition each time,
        # 2-3% of a busy worker's main thread when asked twice per message, py-spy). Without them
        # (tests), every write goes ahead.
        self.tenure = tenure
        self.holding = holding or (lambda: lambda _message: True)
        # local: claims decided for this worker itself as tasks are queued (streams/worker.LocalClaims);
        # None: every queued task goes to the queue
        self.local: Any = None
        # inbox: signals to tasks whose partition this worker holds are decided in the batch that sent
        # them, besides being written (streams/inbox.py); None: they wait for their copy from the log
        self.inbox: Inbox | None = None
        self._handoffs: list[tuple[r.QueuedTask, str]] = []  # decided, not yet in a write
        # written(events, offsets): told of the events of each durable write and the last offset written
        # per events partition (this worker's claim waiter: streams/worker.ClaimWaiter); None: nobody
        self.written: Any = None

    def load(self, task_id: str) -> TaskRecord:
        raw = self._raw(task_id.encode())
        return state_codec.load(task_id, raw) if raw else TaskRecord(TaskState(task_id=task_id))

    def _partition(self) -> int:
        """The partition of the message being handled: the records of its tasks are kept there (inputs
        and events are co-partitioned by task id). Outside a message (the pure tests) the state has none."""
        return self._message.partition if self._message is not None else 0

    def _raw(self, key: bytes) -> bytes | None:
        """What the table holds for `key`, as the batch so far left it."""
        raw = self._batch.tasks.get(key) if self._batch is not None else None
        return raw or self.tasks.read(self._partition(), key)

    def _put(self, key: bytes, raw: bytes) -> None:
        """Keep `raw` for `key`: with the batch (saved once its writes are durable), or at once."""
        if self._batch is not None:
            self._batch.tasks[key] = raw
            self._batch.source[key] = self._partition()
        else:
            self.tasks.write(self._partition(), {key: raw})

    def _timer(self, key: bytes) -> bytes | None:
        if self._batch is not None and key in self._batch.timers:
            return self._batch.timers[key]
        return self.timers.read(self._partition(), key)

    async def _emit(self, sends: list[tuple[Any, str, Any]]) -> None:
        """Write records: at once outside a batch, with the batch's other records inside one. The tasks
        claimed in-process in what is written are handed over once it is durable."""
        handoffs, self._handoffs = self._handoffs, []
        if self._batch is not None:
            self._batch.sends.extend(sends)
            self._batch.handoffs.extend(handoffs)
        else:
            self._tell(sends, await self.ctx.send_all(sends))
            for qt, cid in handoffs:
                self.local.hand(qt, cid)

    def _tell(self, sends: list[tuple[Any, str, Any]], durable: dict[str, dict[int, int]]) -> None:
        """Tell `written` of the events among `sends`, durable now."""
        if self.written is not None:
            events = self.ctx.events
            self.written(
                [rec for topic, _key, rec in sends if topic is events and type(rec) is r.EventRecord],
                durable.get(events.get_topic_name(), {}),
            )

    def _drop_handoffs(self, handoffs: list[tuple[r.QueuedTask, str]]) -> None:
        """Claims decided in-process that are not written after all: their reservations go back."""
        if handoffs:
            self.local.release(len(handoffs))

    # -- inputs ----------------------------------------------------------------------------------------
    async def on_batch(self, messages: list[Any], events_topic: str, guard: Any) -> None:
        """Handle messages in order, each through `guard(message, handling)` (which dead-letters a
        message whose handling raises), then write what they decided, wait for it, and save.

        Nothing is written until the group has confirmed this worker's membership since (`Tenure`): a
        worker let go on while frozen would otherwise write what it decided from its stale table after
        the new owner's writes. If a rebalance came in between, nothing of the batch is written: the
        messages of partitions still held are decided again, against the table as it is now.

        A message of a partition given away before its batch began is not decided here at all: taken
        before a rebalance, its batch may come after it (waiting its turn behind another batch, or
        gathered across it), and this worker's table of that partition is no longer kept up to date.
        The new owner reads it again from the last commit; one handed over in-process goes to it
        through the broker."""
        rebalances = self.tenure.completed if self.tenure is not None else 0
        holds = self.holding()
        kept = [holds(m) for m in messages]
        if not all(kept):
            away = [m for m, k in zip(messages, kept, strict=True) if not k]
            log.info("%d of %d input(s) left to the new owner of their partition", len(away), len(messages))
            await self.reroute(away)
            messages = [m for m, k in zip(messages, kept, strict=True) if k]
            if not messages:
                return
        batch = self._batch = _Batch()
        todo, seen, rounds = list(messages), 0, 0
        try:
            while todo:
                for message in todo:
                    self._message = message
                    await guard(message, self.on_message(message, events_topic))
                    self._drop_handoffs(self._handoffs)  # of a message whose handling raised before its write
                    self._handoffs = []
                # signals just decided for tasks held here are decided in this batch too (streams/inbox.py)
                todo, seen = self._echoes(batch.sends, seen), len(batch.sends)
                rounds += 1
                if rounds >= ECHO_ROUNDS:
                    break  # the rest arrive from the log
        finally:
            self._batch = self._message = None
        if self.tenure is not None and await self.tenure.settled() != rebalances:
            self._drop_handoffs(batch.handoffs)
            log.info("a rebalance came before a batch of %d input(s) was written: decided again", len(messages))
            await self.on_batch(messages, events_topic, guard)  # those of partitions given away set aside
            return
        changelog = self._changelog(batch)
        try:  # the events (packed) and the state that says they were decided: durable together ...
            durable = await self.ctx.send_all(self.ctx.packed(batch.sends), changelog)
        except BaseException:
            self._drop_handoffs(batch.handoffs)
            raise
        self._tell(batch.sends, durable or {})
        for qt, cid in batch.handoffs:  # claimed in-process: recorded, so run
            self.local.hand(qt, cid)
        self._remember(batch, durable or {})  # ... then remembered here

    def _echoes(self, sends: list[tuple[Any, str, Any]], start: int) -> list[LocalInput]:
        """The inputs among `sends[start:]` addressed to tasks whose partition this worker holds, as local
        inputs to decide in this batch. They are written all the same: a copy in the log outlives this
        worker, and changes nothing when it arrives (`_input`)."""
        if self.inbox is None:
            return []
        echoed = [
            rec
            for topic, _key, rec in sends[start:]
            if topic is self.ctx.inputs and type(rec) is r.InputRecord and type(rec.body) in ECHOED
        ]
        return [local for local in self.inbox.local(echoed, logged=True) if local is not None] if echoed else []

    async def reroute(self, messages: list[Any]) -> None:
        """Inputs handed over in-process and never written whose partition was given away before they
        were decided: through the broker to its new owner."""
        lost = [m.record for m in messages if isinstance(m, LocalInput) and not m.logged]
        if lost:
            log.info("%d input(s) handed over in-process go through the broker: their partition moved", len(lost))
            await self.ctx.send_all(self.ctx.inputs_packed(lost))

    def _by_partition(self, batch: _Batch) -> list[tuple[KeyedState, int, dict[bytes, bytes | None]]]:
        """The batch's records and timers, each under its message's partition."""
        out: list[tuple[KeyedState, int, dict[bytes, bytes | None]]] = []
        for state, items in ((self.tasks, batch.tasks), (self.timers, batch.timers)):
            by_partition: dict[int, dict[bytes, bytes | None]] = {}
            for key, value in items.items():
                by_partition.setdefault(batch.source[key], {})[key] = value
            out.extend((state, partition, writes) for partition, writes in by_partition.items())
        return out

    def _changelog(self, batch: _Batch) -> list[ChangelogRecord]:
        """The changelog records of the batch's state, to go out with its events: a worker that takes the
        partition over recovers the state from the changelog, and must find it there whenever it finds
        the events (else it decides the same inputs again)."""
        return [
            rec for state, partition, writes in self._by_partition(batch) for rec in state.changelog(partition, writes)
        ]

    def _remember(self, batch: _Batch, durable: dict[str, dict[int, int]]) -> None:
        """Save the batch's records and timers in this worker's store, once they are durable in the
        changelog (`durable`: the last offset written per changelog topic and partition), from which the
        store's recovery reads on. Only then are the batch's inputs acknowledged."""
        for state, partition, writes in self._by_partition(batch):
            state.write(partition, writes)
        for key, timer in batch.timers.items():
            if timer is not None:
                self.index.note(key, int(orjson.loads(timer)["due"]))
        for state in (self.tasks, self.timers):
            for partition, offset in durable.get(state.changelog_topic, {}).items():
                state.persisted(partition, offset)

    async def on_message(self, message: Any, events_topic: str) -> None:
        if message.topic == events_topic:
            await self._on_event(message)
        else:
            await self._on_input(message)

    async def _on_event(self, message: Any) -> None:
        if not_for_the_lifecycle(getattr(message, "headers", {}).items()):
            return  # its own writing, mostly, when not left out before delivery (streams/app.py)
        try:
            rec = self.ctx.codec.decode("event", message.value)
        except DecodeError as err:
            await self.ctx.dead_letter(message, err.reason, "lifecycle")
            return
        if isinstance(rec.payload, r.TasksAdmitted):
            await self._admit(rec, rec.payload)
            return
        if rec.task_id is None or not isinstance(rec.payload, ADMISSION_EVENTS):
            return  # submission outcomes, and events this agent wrote itself
        record = self.load(rec.task_id)
        if rec.version != record.state.version + 1:
            return  # already applied (redelivery or a resubmission with the same ids)
        record.state = evolve(record.state, rec.payload, rec.event_ms)
        more, sends = self._react(record, [rec.payload], rec.event_ms)
        await self._process(record, more, rec.event_ms, rand=0.0, sends=sends)

    async def _admit(self, rec: r.EventRecord, packed: r.TasksAdmitted) -> None:
        """Admit every task of a packed admission (all of them owned here): the same steps as its
        TaskSubmitted and TaskAdmitted one by one, but written in one go. Each prerequisite learns its
        dependents inside the submission from the record itself; only prerequisites in other
        submissions are asked (WatchPrerequisite) to say when they end."""
        at = rec.event_ms
        out: list[tuple[Any, str, Any]] = []
        saves: list[tuple[TaskRecord, Any]] = []
        admitted = e.TaskAdmitted(node=packed.node)
        for item in packed.tasks:
            record = self.load(item.task_id)
            if record.state.version >= 2:
                continue  # already applied (redelivery or a resubmission with the same ids)
            if record.state.version == 0:  # version 1
                record.state = evolve(record.state, e.TaskSubmitted(item.submission(rec), item.spec), at)
            record.state = evolve(record.state, admitted, at)  # version 2
            for dep in item.dependents:
                if dep not in record.dependents:
                    record.dependents.append(dep)
            sends: list[tuple[Any, str, Any]] = []
            more, more_sends = self._react(record, [admitted], at, watch=item.references)
            sends.extend(more_sends)
            events, timer = self._decide(record, more, at, 0.0, sends)
            out.extend(events)
            out.extend(sends)
            saves.append((record, timer))
        await self._emit(out)  # durable first ...
        for record, timer in saves:
            self._save(record, timer)  # ... then remembered

    async def _on_input(self, message: Any) -> None:
        if type(message) is LocalInput:
            await self._input(message.record)
            return
        try:
            inp = self.ctx.codec.decode("input", message.value)
        except DecodeError as err:
            await self.ctx.dead_letter(message, err.reason, "lifecycle")
            return
        if type(inp.body) is r.Inputs:  # several inputs in one record (a worker's, sent together)
            failures = []
            for member in inp.body.items:  # one that raises holds up none of the others ...
                try:
                    await self._input(member)
                except Exception as exc:
                    log.exception("lifecycle could not handle input %s of a packed record", member.input_id)
                    failures.append(f"{member.task_id} {type(member.body).__name__}: {type(exc).__name__}: {exc}")
            if failures:  # ... and the record is dead-lettered once, naming every one that raised
                raise PackedInputsFailed(f"{len(failures)} of {len(inp.body.items)} inputs: " + "; ".join(failures))
            return
        await self._input(inp)

    async def _input(self, inp: r.InputRecord) -> None:
        if inp.task_id.startswith(r.SCHEDULE_KEY):
            await self._schedule(inp)
            return
        at = inp.sent_ms
        record = self.load(inp.task_id)
        rand = unit_random(inp.input_id)
        b = inp.body
        cmds: list[c.Command] = []
        sends: list[tuple[Any, str, Any]] = []
        first: list[tuple[Any, str, Any]] = []  # events decided before the commands (a folded start)
        match b:
            case r.WatchPrerequisite(dependent=dep):
                if dep not in record.dependents:
                    record.dependents.append(dep)
                if record.state.is_terminal:
                    sends.append(self._ended_signal(record.state, dep, at))
                elif (
                    record.state.version == 0 and not record.not_admitted and self._timer(inp.task_id.encode()) is None
                ):
                    # A task of another submission not admitted (yet): wait for it, but not forever (a
                    # dependent asking again does not move the deadline).
                    wait = {"due": at + self.ctx.settings.reference_wait_ms, "purpose": "admission_wait"}
                    self._set_timer(inp.task_id, wait)
            case r.TimerFired(purpose="admission_wait"):
                stored = self._timer(inp.task_id.encode())
                if stored is not None and json.loads(stored).get("purpose") == "admission_wait":
                    self._clear_timer(inp.task_id.encode())
                if record.state.version == 0 and not record.not_admitted:
                    record.not_admitted = True
                    sends.extend(self._not_admitted_signal(inp.task_id, d, at) for d in record.dependents)
            case r.PrerequisiteEnded(prerequisite=pre, succeeded=ok, outcome=outcome):
                if record.ended.get(pre) == outcome:
                    return  # heard already (decided in the batch that sent it, streams/inbox.py)
                record.ended[pre] = outcome
                if record.state.status is Status.WAITING:
                    if not ok and outcome == NOT_ADMITTED:
                        wait_s = self.ctx.settings.reference_wait_ms / 1000
                        cmds.append(c.CancelTask(f"prerequisite {pre} was not admitted within {wait_s:g}s", at))
                    elif not ok:
                        cmds.append(c.CancelTask(f"prerequisite {pre} ended {outcome.lower()}", at))
                    elif self._all_succeeded(record):
                        cmds.append(c.MarkReady("every prerequisite succeeded", at))
            case r.ClaimRequest(attempt=n, worker=w, claim_id=cid):
                cmds.append(c.ClaimTask(n, w, cid, at))
            case r.Heartbeat(claim_id=cid):
                claim = record.state.claim
                if claim is not None and claim.claim_id == cid and record.state.status in LEASED:
                    # the lease moves on in the task's record; no event: expiry is the fact worth logging
                    record.lease_until_ms = max(record.lease_until_ms or 0, at + self.ctx.settings.lease_ms)
                    self._save(record, False)
                    return
            case r.TimerFired(purpose="lease"):
                claim = record.state.claim
                if claim is not None and record.state.status in LEASED:
                    deadline = (record.lease_until_ms or at) + self.ctx.settings.lease_grace_ms
                    if at < deadline:  # extended since the timer was set: look again then
                        self._save(record, {"due": deadline, "purpose": "lease"})
                        return
                    cmds.append(c.ExpireLease(claim.claim_id, at, self.ctx.settings.lease_expiry_limit))
            case r.ReleaseClaim(claim_id=cid, reason=why):
                cmds.append(c.ReleaseTask(cid, why, at))
            case r.HolderGone(claim_id=cid, worker=w, reason=why):
                claim = record.state.claim
                if claim is None or claim.claim_id != cid or claim.worker != w or record.state.status not in LEASED:
                    return  # ended, or claimed again since: nothing to do
                log.info("lifecycle: task %s: %s; its claim %s expires now", inp.task_id, why, cid)
                cmds.append(c.ExpireLease(cid, at, self.ctx.settings.lease_expiry_limit))
            case r.TimerFired(purpose="recheck"):
                if record.state.status is not Status.WAITING:
                    self._save(record, None)
                    return
                sends.extend(self._recheck(record, at))
                await self._emit(sends)
                self._save(record, self._recheck_timer(record, at))
                return
            case r.StartReport(claim_id=cid, pid=pid):
                cmds.append(c.StartTask(cid, pid, at))
            case r.FinishReport():
                if b.started_ms is not None and record.state.status is Status.CLAIMED:
                    # a short run's start, come with its end: decided first, at the time it started
                    start = c.StartTask(b.claim_id, b.pid or 0, b.started_ms)
                    first, _ = self._decide(record, [start], b.started_ms, rand, sends)
                cmds.append(c.FinishTask(b.claim_id, b.exit_code, b.output_tail, b.duration_ms, b.reason, at))
            case r.TimerFired(purpose="requeue"):
                st = record.state
                if st.status is Status.QUEUED and st.spec is not None:
                    # queued long ago and never claimed: the queue record, or every claim on it, was lost
                    # (a claim request skipped in a rebalance, a worker that gave up waiting): send it again
                    log.info("task %s attempt %d queued %ds ago and not claimed: queued again", st.task_id,
                             st.attempt, self.ctx.settings.requeue_ms // 1000)  # fmt: skip
                    again = r.QueuedTask(st.task_id, st.attempt, st.lane, at, st.spec)
                    await self._emit([(self.ctx.queue_for(st.lane), st.task_id, again)])
                    self._save(record, {"due": at + self.ctx.settings.requeue_ms, "purpose": "requeue"})
                return
            case r.TimerFired(purpose="retry"):
                cmds.append(c.RetryTask(at))
            case r.TimerFired(purpose="not_before"):
                cmds.append(c.MarkReady("earliest start time reached", at))
            case r.Promote(lane=lane):
                st = record.state
                if st.status is Status.QUEUED and lane != st.lane:
                    # queued in a lane that has no live reader now (its only worker died): moved
                    why = f"moved from lane {st.lane} to {lane}: no live worker reads {st.lane}"
                    cmds.extend((c.UnqueueTask(why, at), c.QueueTask(lane, at)))
                elif st.status is not Status.READY:
                    return  # promoted twice, or cancelled or queued since: nothing to do
                else:
                    cmds.append(c.QueueTask(lane, at))
            case r.CancelRequest(reason=why):
                cmds.append(c.CancelTask(why, at))
            case r.LimitExceeded(claim_id=cid, limit=limit, reason=why, watcher=watcher):
                cmds.append(c.EnforceLimit(cid, limit, why, watcher, at))
            case r.ReprioritizeRequest(priority=p):
                cmds.append(c.ReprioritizeTask(p, at))
        await self._process(record, cmds, at, rand, sends, first)

    async def _schedule(self, inp: r.InputRecord) -> None:
        """A schedule's owner: it keeps the latest setting and the next time it is due (taskstream/core/
        schedule.py), and at that time submits its DAG through the commands topic, as any submission,
        under an idempotency key naming the time, so a second firing for one time admits nothing twice."""
        key, at, body = inp.task_id.encode(), inp.sent_ms, inp.body
        raw = self._raw(key)
        kept = json.loads(raw) if raw else None
        if isinstance(body, r.Schedule):
            due = schedule.next_due(body.cron, body.timezone, at) if body.enabled else None
            self._keep_schedule(key, {"schedule": _plain(body), "due": due})
            log.info("schedule %s set (%s, %s): next due %s", inp.task_id, body.cron, body.timezone,
                     schedule.iso(due, body.timezone) if due else "never (stopped)")  # fmt: skip
            return
        if not (isinstance(body, r.TimerFired) and body.purpose == "schedule"):
            log.info("schedule %s: %s ignored (schedules take settings and their timer)", inp.task_id, body)
            return
        if kept is None or kept["due"] is None:
            self._clear_timer(key)
            return
        sch = _schedule_from(kept["schedule"])
        fire_for, due = schedule.fire(sch.cron, sch.timezone, kept["due"], at)
        if fire_for is not None:
            when = schedule.iso(fire_for, sch.timezone)
            sub = r.SubmitDag(
                tenant=sch.tenant,
                tasks=sch.tasks,
                idempotency_key=f"schedule/{sch.name}/{fire_for}",
                labels={**sch.labels, "schedule": sch.name, "scheduled_for": when},
            )
            cmd = r.CommandRecord(f"{inp.task_id}/{fire_for}", at, sub, f"schedule {sch.tenant}/{sch.name}")
            linked = external_dependencies(Submission(sch.tenant, sch.tasks))
            # as the SDK keys a submission: by tenant if it depends on other submissions, else spread
            where = sch.tenant if linked else f"{sch.tenant}/schedule/{sch.name}/{fire_for}"
            await self._emit([(self.ctx.commands, where, cmd)])
            log.info("schedule %s submitted for %s (%d ms late by this clock)", inp.task_id, when, at - fire_for)
        self._keep_schedule(key, {**kept, "due": due})

    def _keep_schedule(self, key: bytes, kept: dict[str, Any]) -> None:
        self._put(key, json.dumps(kept).encode())
        if kept["due"] is None:
            self._clear_timer(key)
        else:
            self._set_timer(key.decode(), {"due": kept["due"], "purpose": "schedule"})

    # -- deciding ------------------------------------------------------------------------------------
    def _all_succeeded(self, record: TaskRecord) -> bool:
        spec = record.state.spec
        assert spec is not None
        return all(record.ended.get(d) == Status.SUCCEEDED.value for d in spec.dependencies)

    def _ended_signal(self, state: TaskState, dependent: str, at: int) -> tuple[Any, str, Any]:
        body = r.PrerequisiteEnded(
            prerequisite=state.task_id, succeeded=state.status is Status.SUCCEEDED, outcome=state.status.value
        )
        return (self.ctx.inputs, dependent, self.ctx.input(dependent, at, body, f"{state.task_id}:ended:{dependent}"))

    def _not_admitted_signal(self, task_id: str, dependent: str, at: int) -> tuple[Any, str, Any]:
        body = r.PrerequisiteEnded(prerequisite=task_id, succeeded=False, outcome=NOT_ADMITTED)
        return (self.ctx.inputs, dependent, self.ctx.input(dependent, at, body, f"{task_id}:not-admitted:{dependent}"))

    def _react(
        self, record: TaskRecord, new: list[e.Event], at: int, watch: Any = None
    ) -> tuple[list[c.Command], list[tuple[Any, str, Any]]]:
        """What follows from events just decided: more commands for this task, and sends elsewhere.
        `watch`: the prerequisites to ask for word when they end (default: all of them)."""
        s = record.state
        cmds: list[c.Command] = []
        sends: list[tuple[Any, str, Any]] = []
        for ev in new:
            match ev:
                case e.TaskAdmitted():
                    assert s.spec is not None
                    if not s.spec.dependencies:
                        cmds.append(c.MarkReady("no prerequisites", at))
                    for dep in s.spec.dependencies if watch is None else watch:
                        sends.append(
                            (
                                self.ctx.inputs,
                                dep,
                                self.ctx.input(
                                    dep, at, r.WatchPrerequisite(dependent=s.task_id), f"{s.task_id}:watch:{dep}"
                                ),
                            )
                        )
                    if s.spec.dependencies and self._all_succeeded(record):
                        cmds.append(c.MarkReady("every prerequisite succeeded", at))
                case e.TaskReady() | e.TaskUnqueued() if not self.ctx.settings.batcher:
                    cmds.append(c.QueueTask(self.ctx.settings.lane, at))  # else it waits to be promoted ...
                case e.TaskReady() if self.local is not None and self.ctx.settings.ready_at_once:
                    assert s.spec is not None  # ... unless the batcher's gate lets it past (LocalClaims)
                    if (lane := self.local.ready_lane(s.spec)) is not None:
                        cmds.append(c.QueueTask(lane, at))
                case e.TaskQueued(attempt=n, lane=lane):
                    assert s.spec is not None
                    queued = r.QueuedTask(s.task_id, n, lane, at, s.spec)
                    cid = self.local.reserve(queued) if self.local is not None else None
                    if cid is not None:  # this worker runs it: claimed in the same step, no queue record
                        cmds.append(c.ClaimTask(n, self.local.worker_id, cid, at))
                        self._handoffs.append((queued, cid))
                    else:
                        sends.append((self.ctx.queue_for(lane), s.task_id, queued))
        if s.status in TERMINAL and any(type(ev) in _ENDINGS for ev in new):
            sends.extend(self._ended_signal(s, dep, at) for dep in record.dependents)
        return cmds, sends

    async def _process(
        self,
        record: TaskRecord,
        commands: list[c.Command],
        at: int,
        rand: float,
        sends: list[tuple[Any, str, Any]],
        first: list[tuple[Any, str, Any]] | None = None,
    ) -> None:
        events, timer = self._decide(record, commands, at, rand, sends)
        await self._emit([*(first or ()), *events, *sends])  # durable first ...
        self._save(record, timer)  # ... then remembered

    def _decide(
        self, record: TaskRecord, commands: list[c.Command], at: int, rand: float, sends: list[tuple[Any, str, Any]]
    ) -> tuple[list[tuple[Any, str, Any]], Any]:
        """Run the commands (and what follows from them) on the record: the events to write (sends to
        other partitions are appended to `sends`) and what to do with the task's timer."""
        tid = record.state.task_id
        pending = deque(commands)
        out: list[tuple[Any, str, Any]] = []
        timer: dict[str, Any] | None | bool = False  # False: leave as is; None: clear
        while pending:
            cmd = pending.popleft()
            before = record.state
            state, decided = run(before, cmd, rand)
            if isinstance(cmd, c.ClaimTask) and not (
                isinstance(decided, list) and any(isinstance(ev, e.TaskClaimed) for ev in decided)
            ):  # a claim decided in-process that did not win (never expected): nothing runs on it
                lost = [h for h in self._handoffs if h[1] == cmd.claim_id]
                self._handoffs = [h for h in self._handoffs if h[1] != cmd.claim_id]
                self._drop_handoffs(lost)
            if isinstance(decided, Rejection):
                if (
                    isinstance(cmd, c.MarkReady)
                    and before.status is Status.WAITING
                    and before.spec
                    and before.spec.not_before_ms is not None
                ):
                    timer = {"due": before.spec.not_before_ms, "purpose": "not_before"}
                else:
                    log.info("%s", decided.message)
                continue
            for i, ev in enumerate(decided, start=1):
                out.append(
                    (self.ctx.events, tid, self.ctx.event(tid, before.submission_id, before.version + i, at, ev))
                )
                if isinstance(ev, e.TaskRetryScheduled):
                    timer = {"due": ev.due_ms, "purpose": "retry"}
                elif isinstance(ev, e.TaskQueued):  # until it is claimed: queued again if nobody does
                    timer = {"due": at + self.ctx.settings.requeue_ms, "purpose": "requeue"}
                elif isinstance(ev, e.TaskClaimed):  # the lease starts with the claim
                    record.lease_until_ms = at + self.ctx.settings.lease_ms
                    timer = {"due": record.lease_until_ms + self.ctx.settings.lease_grace_ms, "purpose": "lease"}
                elif isinstance(ev, _NO_TIMER):
                    timer = None
                    record.lease_until_ms = None
            record.state = state
            more, more_sends = self._react(record, decided, at)
            pending.extend(more)
            sends.extend(more_sends)
        return out, timer

    def _recheck(self, record: TaskRecord, at: int) -> list[tuple[Any, str, Any]]:
        """Ask again each prerequisite that has not said it ended. Its answer (PrerequisiteEnded, if it
        has) may have been lost: a Faust worker can skip an input during a rebalance (measured,
        connectors/faust_patches.py), and nothing else would ever send it again."""
        spec = record.state.spec
        assert spec is not None
        n = record.rechecks = record.rechecks + 1
        tid = record.state.task_id
        return [
            (self.ctx.inputs, d, self.ctx.input(d, at, r.WatchPrerequisite(dependent=tid), f"{tid}:watch:{d}:{n}"))
            for d in spec.dependencies
            if d not in record.ended
        ]

    def _recheck_timer(self, record: TaskRecord, at: int) -> dict[str, Any] | None:
        """While it waits for prerequisites: look again after recheck_ms, then twice as long each time."""
        s = self.ctx.settings
        if record.state.status is not Status.WAITING or not record.state.spec or not record.state.spec.dependencies:
            return None
        wait = min(s.recheck_max_ms, s.recheck_ms * 2 ** min(record.rechecks, 20))
        return {"due": at + wait, "purpose": "recheck"}

    def _set_timer(self, task_id: str, timer: dict[str, Any]) -> None:
        key = task_id.encode()
        raw = orjson.dumps(timer)
        if self._batch is not None:
            self._batch.timers[key] = raw
            self._batch.source[key] = self._partition()
            return
        self.timers.write(self._partition(), {key: raw})
        self.index.note(key, int(timer["due"]))

    def _clear_timer(self, key: bytes) -> None:
        """Clear the task's timer. A timer never saved has nothing to clear: a tombstone for it would be a
        changelog record and a store write for nothing (a task made ready at once clears the timer it
        never had), and one set earlier in this batch is just not written."""
        saved = self.timers.read(self._partition(), key) is not None
        if self._batch is not None:
            if saved:
                self._batch.timers[key] = None
                self._batch.source[key] = self._partition()
            else:
                self._batch.timers.pop(key, None)
        elif saved:
            self.timers.write(self._partition(), {key: None})

    def _save(self, record: TaskRecord, timer: Any) -> None:
        """Remember the task (only once its events are durable) and set, clear or keep its timer:
        a dict sets it, None clears it, False leaves it as it is. A task left waiting for prerequisites
        without a timer gets its recheck timer."""
        key = record.state.task_id.encode()
        if timer is False and record.state.status is Status.WAITING and self._timer(key) is None:
            timer = self._recheck_timer(record, record.state.updated_ms) or False
        self._put(key, state_codec.save(record))
        if timer:
            self._set_timer(record.state.task_id, timer)
        elif timer is None:
            self._clear_timer(key)


_ENDINGS = (e.TaskSucceeded, e.TaskDeadLettered, e.TaskCancelled, e.TaskRejected)


def _schedule_from(d: dict[str, Any]) -> r.Schedule:
    return r.Schedule(**{**d, "tasks": tuple(spec_from(t) for t in d["tasks"])})


class PackedInputsFailed(Exception):
    """Inputs of one packed record raised: the record goes to the dead letters once, with all of them."""
