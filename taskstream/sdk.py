"""The Python SDK: a thin producer of the same Avro commands any program can write to the commands
topic (Confluent wire format, schema from the registry), plus readers of the outcome."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import KafkaException, TopicPartition

from taskstream.connectors import broker
from taskstream.connectors.kafka import KafkaSetupError, consumer, make_codec, producer
from taskstream.connectors.partitioning import partition_for
from taskstream.core import commands, model
from taskstream.core.machine import TRANSITIONS
from taskstream.core.submission import Submission, external_dependencies, submission_id_for
from taskstream.schemas.codec import DecodeError
from taskstream.schemas.records import (
    CancelTaskRequest,
    CommandRecord,
    ReprioritizeTaskRequest,
    Schedule,
    SetTenant,
    SubmissionAccepted,
    SubmissionRejected,
    SubmitDag,
)
from taskstream.settings import Settings

# Where a submission's decision will be is taken as the end of its events partition before the send.
# An end learnt up to this long ago is taken again (an earlier end only means reading a little more to
# find the decision): a client sending one submission at a time saves a broker round trip per send.
END_REUSE_S = 1.0
REGISTRY_WAIT_S = 5.0  # a registry that does not answer is reported after this long
MARKS_KEPT = 100_000  # decision marks kept for wait_outcome; an older one is looked up in PostgreSQL


class SubmitError(RuntimeError):
    pass


class TaskError(SubmitError):
    """A request about a task that cannot apply: the task is unknown, has ended, or is past the point
    where the request means anything."""


# status names as the read model stores them, from the core's own definitions
TERMINAL = frozenset(st.value for st in model.TERMINAL)
REPRIORITIZABLE = frozenset(st.value for st in TRANSITIONS[commands.ReprioritizeTask])


@dataclass(frozen=True)
class Outcome:
    submission_id: str
    accepted: bool
    task_ids: dict[str, str]
    errors: list[dict[str, Any]]


class Client:
    def __init__(self, settings: Settings, issuer: str = "taskstream-sdk") -> None:
        self.settings = settings
        self.issuer = issuer
        self.topic = settings.topic("commands")
        # Our codec writes the same Confluent wire format as confluent_kafka's AvroSerializer, with the
        # hand-written TaskSpec fast path: a 10,000-task SubmitDag encodes in ~0.1 s instead of ~1 s.
        try:
            self._codec = make_codec(settings, wait_s=REGISTRY_WAIT_S)
        except KafkaSetupError as exc:
            raise SubmitError(
                f"cannot reach the schema registry at {settings.registry} (is the stack up?): {exc}"
            ) from exc
        # Not the idempotent producer: its first send waited 0.5-1 s for a producer id on noida-db
        # (measured), paid by every `taskstream submit`. Commands need no broker-side deduplication: a
        # resent SubmitDag has the same command id (and key), so the same submission and task ids, and
        # every reader skips what it has seen; a resent cancel or reprioritize changes nothing more.
        # One request in flight keeps a client's commands in the order it sent them.
        self._producer = producer(
            settings,
            partitioner="murmur2_random",
            **{"enable.idempotence": False, "max.in.flight.requests.per.connection": 1},
        )
        self._closed = False
        try:
            self._connect()
        except SubmitError:
            self._producer.close()
            raise
        self._reader: Any = None  # a read_committed consumer of the events topic, made on first use
        self._marks: OrderedDict[str, TopicPartition] = OrderedDict()  # command id -> where its decision will be
        self._ends: dict[int, tuple[float, int]] = {}  # partition -> (when learnt, monotonic; its end then)

    def _connect(self, timeout: float = 10.0) -> None:
        """Connect and learn the commands topic's partitions now, so a broker that is not there is
        reported here and the first submission does not wait for the connection."""
        try:
            meta = self._producer.list_topics(self.topic, timeout=timeout)
        except KafkaException as exc:
            raise SubmitError(f"cannot reach the broker at {self.settings.bootstrap}: {exc}") from exc
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None:
            why = "missing" if topic is None else topic.error.str()
            raise SubmitError(
                f"the commands topic {self.topic} at {self.settings.bootstrap} is not usable ({why}); "
                "is the stack up? `taskstream status`"
            )

    def _send(self, key: str, body: Any, command_id: str | None = None) -> str:
        command_id = command_id or str(uuid.uuid4())
        errors: list[Any] = []
        self._produce(key, body, command_id, errors)
        self._flush(errors)
        return command_id

    def _produce(self, key: str, body: Any, command_id: str, errors: list[Any]) -> None:
        cmd = CommandRecord(command_id=command_id, issued_ms=int(time.time() * 1000), body=body, issuer=self.issuer)
        value = self._codec.encode(cmd)
        while True:
            try:
                self._producer.produce(
                    self.topic,
                    key=key.encode(),
                    value=value,
                    on_delivery=lambda err, _msg: errors.append(err) if err else None,
                )
                return
            except BufferError:  # the client's queue is full: let it send some first
                self._producer.poll(0.1)

    def _flush(self, errors: list[Any]) -> None:
        if self._producer.flush(30) or errors:
            raise SubmitError(
                f"the broker at {self.settings.bootstrap} did not take the command: {errors[:3] or 'timeout'}"
            )

    def submit(self, sub: Submission) -> tuple[str, str]:
        """Produce a SubmitDag; returns (command id, submission id). Admission decides asynchronously."""
        return self.submit_many([sub])[0]

    def submit_many(self, subs: Iterable[Submission]) -> list[tuple[str, str]]:
        """Produce a SubmitDag for each submission and wait for the broker once, at the end: the way to
        send many. Returns (command id, submission id) for each, in order; each is decided on its own,
        as if sent by `submit`. If the broker does not take them all, SubmitError (resending the same
        submissions with idempotency keys admits nothing twice)."""
        errors: list[Any] = []
        ends: dict[int, TopicPartition] = {}
        out = []
        for sub in subs:
            body = SubmitDag(tenant=sub.tenant, tasks=sub.tasks, idempotency_key=sub.idempotency_key, labels=sub.labels)
            # A submission that depends on other submissions is decided on its tenant's partition (see
            # streams/admission.py): key it by tenant so it lands there. Others spread over the partitions.
            spread = f"{sub.tenant}/{sub.idempotency_key or uuid.uuid4()}"
            key = sub.tenant if external_dependencies(sub) else spread
            command_id = str(uuid.uuid4())
            sid = submission_id_for(sub.tenant, sub.idempotency_key, command_id)
            # Where the decision will be: after the end of its events partition as it was before the
            # first of these was sent.
            part = partition_for(sid.encode(), self.settings.partitions)
            if part not in ends:
                ends[part] = self._decisions_end(sid)
            self._marks[command_id] = TopicPartition(ends[part].topic, part, ends[part].offset)
            if len(self._marks) > MARKS_KEPT:
                self._marks.popitem(last=False)
            self._produce(key, body, command_id, errors)
            out.append((command_id, sid))
        self._flush(errors)
        return out

    def set_schedule(self, sched: Schedule) -> tuple[str, str]:
        """Set a schedule: its DAG is submitted at every time its cron expression names in its time zone
        (a later setting of the same tenant and name replaces it; `enabled=False` stops it). Decided
        like a submission: `wait_outcome(submission id)` says whether it was accepted, with the
        problems if not. Each submission it makes has the labels `schedule` and `scheduled_for` and
        the idempotency key `schedule/NAME/EPOCH_MS`. Returns (command id, submission id)."""
        command_id = str(uuid.uuid4())
        sid = submission_id_for(sched.tenant, None, command_id)
        self._marks[command_id] = self._decisions_end(sid)
        errors: list[Any] = []
        # keyed by tenant: every setting of one schedule is decided in the order it was sent
        self._produce(sched.tenant, sched, command_id, errors)
        self._flush(errors)
        return command_id, sid

    def set_tenant(
        self, tenant: str, tier: str, *, max_running: int | None = None, no_cap: bool = False,
        weight: float | None = None,
    ) -> tuple[str, str]:  # fmt: skip
        """Create a tenant or change it (taskstream/core/tenants.py): its tier (free, standard, premium),
        and a cap on its tasks queued, claimed or running at once (`max_running`, or `no_cap`) or a
        share weight other than the tier's. Decided like a submission: `wait_outcome(submission id)`
        says whether it was accepted, with the problems if not. Returns (command id, submission id)."""
        command_id = str(uuid.uuid4())
        sid = submission_id_for(tenant, None, command_id)
        self._marks[command_id] = self._decisions_end(sid)
        errors: list[Any] = []
        body = SetTenant(tenant, tier, max_running, no_cap, weight)
        self._produce(tenant, body, command_id, errors)  # keyed by tenant: its changes decided in order
        self._flush(errors)
        return command_id, sid

    def cancel(self, task_id: str, reason: str = "", *, check: bool = True) -> str:
        """Ask the task's owner to cancel it: a task not yet running never runs; a running one is
        killed (SIGTERM to its process group, SIGKILL after kill_grace_ms) and that is recorded. With
        `check`, a task unknown to the read model or already ended raises TaskError instead. Returns
        the command id; the owner decides (a task that ends first stays as it ended)."""
        if check:
            st = self.task(task_id)["status"]
            if st in TERMINAL:
                raise TaskError(f"task {task_id} has already ended ({st.lower()}); there is nothing to cancel")
        return self._send(task_id, CancelTaskRequest(task_id, reason))

    def reprioritize(self, task_id: str, priority: int, *, check: bool = True) -> str:
        """Ask the task's owner to change its priority, which orders it among the ready tasks until a
        worker claims it: a task queued but not yet claimed is taken back from the queue and ranked again
        (TaskUnqueued). With `check`, a task unknown, ended, claimed or running raises TaskError instead."""
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TaskError(f"priority must be an integer, got {priority!r}")
        if check:
            st = self.task(task_id)["status"]
            if st not in REPRIORITIZABLE:
                past = "has already ended" if st in TERMINAL else "is already claimed by a worker"
                raise TaskError(f"task {task_id} {past} ({st.lower()}); its priority no longer orders anything")
        return self._send(task_id, ReprioritizeTaskRequest(task_id, priority))

    def retry_dead_lettered(self, task_id: str) -> tuple[str, str]:
        """Run a dead-lettered task again, as a new one-task submission of the same tenant with the
        same specification (its prerequisites had all succeeded, so it has none) and the label
        `retry_of`. The dead-lettered task stays as it ended, and so do its dependents (they ended
        cancelled when it was dead-lettered): every submission still has exactly one outcome per task.
        Idempotent: retrying the same task again returns the same submission. Returns (command id,
        submission id); TaskError if the task is unknown or not dead-lettered."""
        self.task(task_id)  # a clear error for a malformed or unknown id
        with psycopg.connect(self.settings.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT status, name, tenant, argv, env, working_dir, cpu, memory_mb, gpu, execution_cap_ms, "
                "retry_limit, backoff, delay_tolerance_ms, priority, labels, call, needs_labels FROM tasks "
                "WHERE task_id = %s",
                (task_id,),
            ).fetchone()
        if row is None:  # pragma: no cover (self.task found it a moment ago; rows are never deleted)
            raise TaskError(f"no task {task_id} in the read model")
        status, name, tenant, argv, env, wd, cpu, mem, gpu, cap, limit, bo, tol, prio, labels, call, needs = row
        if status != model.Status.DEAD_LETTERED:
            raise TaskError(f"task {task_id} is {status.lower()}, not dead-lettered: only a dead letter is retried")
        args = None if call is None else (call["target"], json.dumps(call["args"]), json.dumps(call["kwargs"]))
        spec = model.TaskSpec(
            name=name,
            tenant=tenant,
            argv=tuple(argv),
            env=dict(env),
            working_dir=wd,
            resources=model.Resources(cpu=cpu, memory_mb=mem, gpu=gpu, labels=tuple(sorted(needs.items()))),
            execution_cap_ms=cap,
            retry_limit=limit,
            backoff=model.Backoff(bo["initial_ms"], bo["factor"], bo["max_ms"], bo["jitter"]),
            delay_tolerance_ms=tol,
            priority=prio,
            labels={**labels, "retry_of": task_id},
            call=None if args is None else model.Call(*args),
        )
        retry = Submission(tenant, (spec,), idempotency_key=f"dlq-retry/{task_id}", labels={"retry_of": task_id})
        return self.submit(retry)

    def task(self, task_id: str) -> dict[str, Any]:
        """The task as the PostgreSQL read model has it now (status, priority, attempt, worker, reason,
        name); TaskError if the id is not a task id or the read model has no such task."""
        try:
            uuid.UUID(task_id)
        except ValueError:
            raise TaskError(f"{task_id!r} is not a task id (a UUID, as `taskstream submit` prints)") from None
        try:
            with psycopg.connect(self.settings.dsn, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT status, priority, attempt, worker, reason, name FROM tasks WHERE task_id = %s",
                    (task_id,),
                ).fetchone()
        except psycopg.OperationalError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SubmitError(f"cannot reach PostgreSQL (is the stack up?): {first}") from exc
        if row is None:
            raise TaskError(f"no task {task_id} in the read model (unknown, or submitted a moment ago)")
        return dict(zip(("status", "priority", "attempt", "worker", "reason", "name"), row, strict=True))

    def _decisions_end(self, submission_id: str) -> TopicPartition:
        """The end of the events partition a submission's decision goes to (keyed by submission id)."""
        if self._reader is None:
            self._reader = consumer(self.settings, f"taskstream-sdk-{uuid.uuid4()}")
        part = partition_for(submission_id.encode(), self.settings.partitions)
        tp = TopicPartition(self.settings.topic("events"), part)
        learnt = self._ends.get(part)
        if learnt is not None and time.monotonic() - learnt[0] < END_REUSE_S:
            tp.offset = learnt[1]
            return tp
        try:
            _, high = self._reader.get_watermark_offsets(tp, timeout=10, cached=False)
        except KafkaException as exc:
            raise SubmitError(f"cannot reach the broker at {self.settings.bootstrap}: {exc}") from exc
        self._ends[part] = (time.monotonic(), high)
        tp.offset = high
        return tp

    def wait_outcome(self, submission_id: str, timeout: float = 60.0, command_id: str | None = None) -> Outcome:
        """Wait for admission's decision. With `command_id`, the decision on that command: an earlier
        rejection of the same idempotency key does not count (a rejection does not use the key up), an
        earlier acceptance does (the same ids, nothing new).

        For a command this client sent, the decision is read from the events topic (read_committed), where
        it is as soon as admission commits: for a 10,000-task DAG well before the projections have it.
        Otherwise it is looked up in PostgreSQL, which also holds decisions made long ago."""
        start = self._marks.pop(command_id, None) if command_id else None
        if start is None:
            return self._wait_in_postgres(submission_id, timeout, command_id)
        reader, topic, part = self._reader, start.topic, start.partition
        nxt = {part: start.offset}
        # on noida-db, rest unassigned between looks instead of spinning on the broker (connectors/noida.py)
        idle = broker.idle(self.settings, reader, topic, first=0.002, ceiling=0.05)
        wait = broker.poll_timeout(self.settings)
        deadline = time.monotonic() + timeout
        stop = threading.Event()
        reader.assign([TopicPartition(topic, part, nxt[part])])
        try:
            while time.monotonic() < deadline:
                msg = reader.poll(max(0.0, min(wait, deadline - time.monotonic())))
                if msg is None:
                    if idle.rest(nxt, _Deadline(stop, deadline)):
                        reader.assign([TopicPartition(topic, part, nxt[part])])
                    continue
                idle.woke()
                if msg.error():
                    continue
                nxt[part] = msg.offset() + 1
                if msg.key() != submission_id.encode():
                    continue
                try:
                    rec = self._codec.decode("event", msg.value())
                except DecodeError:
                    continue  # not ours to judge: the projections dead-letter it
                p = rec.payload
                if isinstance(p, SubmissionAccepted):
                    return Outcome(submission_id, True, dict(p.task_ids), [])
                if isinstance(p, SubmissionRejected) and (command_id is None or p.command_id == command_id):
                    errors = [{"task": x.task, "field": x.field, "reason": x.reason} for x in p.errors]
                    return Outcome(submission_id, False, {}, errors)
        finally:
            reader.unassign()
        raise SubmitError(
            f"no admission decision for submission {submission_id} within {timeout:.0f}s "
            "(is the stack up? `taskstream status`, `taskstream cluster`)"
        )

    def close(self) -> None:
        """Deliver what is still queued and let go of the broker connections. Closing again does
        nothing. A producer left open went on reconnecting, and logging "Connection refused" once the
        stack had stopped, for as long as the program ran."""
        if self._closed:
            return
        self._closed = True
        try:
            self._producer.flush(30)
        finally:
            self._producer.close()
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _wait_in_postgres(self, submission_id: str, timeout: float, command_id: str | None) -> Outcome:
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.settings.dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT outcome, task_ids, errors, command_id FROM submissions WHERE submission_id = %s",
                    (submission_id,),
                ).fetchone()
                if row and (command_id is None or row[0] == "ACCEPTED" or row[3] == command_id):
                    return Outcome(submission_id, row[0] == "ACCEPTED", dict(row[1]), list(row[2]))
                time.sleep(0.2)
        raise SubmitError(
            f"no admission decision for submission {submission_id} within {timeout:.0f}s "
            "(is the stack up? `taskstream status`)"
        )


class _Deadline:
    """A stop event that also fires at a deadline (for an idle wait bounded by the caller's timeout)."""

    def __init__(self, stop: threading.Event, deadline: float) -> None:
        self.stop, self.deadline = stop, deadline

    def is_set(self) -> bool:
        return self.stop.is_set() or time.monotonic() >= self.deadline

    def wait(self, seconds: float) -> bool:
        self.stop.wait(max(0.0, min(seconds, self.deadline - time.monotonic())))
        return self.is_set()
