"""The submitter cluster: admission workers that turn commands into events inside Kafka transactions.

Each worker owns some partitions of the commands topic. For every batch of commands from a partition it
owns it opens a transaction, writes every record the decisions call for (task events, rejections,
forwarded commands, dead letters, the link index), adds the commands' offsets to the same transaction
and commits. A worker that dies anywhere in between leaves nothing visible to read_committed readers;
whoever owns the partition next starts from the last committed offset and decides the same commands
again, producing the same ids (streams/admission.py), so even a reader that saw uncommitted records
converges (every reader deduplicates by event id / version). A batch that accepts many tasks commits its
decisions first and the tasks in a second transaction, with the offsets (`admit_batch`).

Who owns what (the seed's cluster manager) is connectors/ownership.py: on Kafka the consumer-group
protocol, with one transactional id per partition so a new owner fences the previous one before it
reads; on noida-db a membership of the workers' own (connectors/noida.py). Either way ownership is
enforced by the broker (a fenced producer cannot commit), not by anyone's view of the cluster.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition
from taskstream.connectors import broker, kafka
from taskstream.connectors.partitioning import partition_for
from taskstream.connectors.reading import read_to_end
from taskstream.schemas.codec import Codec, DecodeError
from taskstream.schemas.records import EventRecord, TasksAdmitted
from taskstream.streams.admission import (
    Admitted,
    Decision,
    LinkIndex,
    Placement,
    Send,
    carry_out,
    decide_command,
    packed_admissions,
)
from taskstream.streams.context import EVENT_HEADER

from taskstream.core.tenants import TenantTerms
from taskstream.settings import Settings

log = logging.getLogger("taskstream.admission")
Headers = list[tuple[str, str | bytes | None]]
FAULT_POINTS = ("before-write", "mid-write", "after-decision", "before-commit", "after-commit")
BATCH = 200  # commands per transaction at most
TXN_TIMEOUT_S = 30.0
PACKED_MAX_BYTES = kafka.MAX_MESSAGE_BYTES // 4  # a TasksAdmitted bigger than this is split
DECIDED_KEY = b"decided"  # the links topic's record of a batch decided and not yet carried out
CARRY_OUT_RETRY_S = 2.0  # how long to wait before retrying the tasks of a decided command that failed


class CarryOutError(Exception):
    """The tasks of an accepted command could not be made now (its schema is unreachable): retry later."""


@dataclass(frozen=True)
class Decided:
    """A batch whose decisions were committed in a transaction of their own, before its tasks: commands up
    to offset `through` are decided, and those at `carry_out` are accepted submissions whose tasks may
    not be written yet. Kept in the links topic (key DECIDED_KEY) until the next such batch replaces it;
    it matters only while `through` is at or past the partition's committed offset."""

    through: int
    carry_out: tuple[int, ...]

    def to_json(self) -> bytes:
        return json.dumps({"decided": {"through": self.through, "carry_out": list(self.carry_out)}}).encode()

    @staticmethod
    def from_entry(entry: dict[str, Any]) -> Decided:
        d = entry["decided"]
        return Decided(int(d["through"]), tuple(int(o) for o in d["carry_out"]))

    def covers(self, offset: int) -> bool:
        return offset <= self.through


@dataclass
class Owned:
    partition: int
    producer: Producer
    index: LinkIndex
    decided: Decided | None = None  # decisions committed ahead of their tasks (see admit_batch)


@dataclass
class InFlight:
    partition: int
    first_offset: int
    last_offset: int
    commands: int
    since_ms: int


@dataclass
class Stats:
    decided: int = 0
    accepted: int = 0
    rejected: int = 0
    forwarded: int = 0
    dead_lettered: int = 0
    takeovers: list[dict[str, Any]] = field(default_factory=list)


class TenantBook:
    """Every tenant set (`taskstream tenants set`), as the tenants topic has it: one partition, compacted,
    written in the admission transaction that accepted the SetTenant, read committed. A tenant not
    known yet makes it read on to the topic's end before it says no, so a tenant set (its decision
    published) before a submission was sent is always known to whichever worker decides it. A tenant
    set in the batch being decided counts from the next command on (`pending`)."""

    def __init__(self, settings: Settings, group: str) -> None:
        self.topic = settings.topic("tenants")
        self.reader = kafka.consumer(settings, f"{group}-tenants-{os.getpid()}")
        self.terms: dict[str, dict[str, Any]] = {}
        self.pending: dict[str, dict[str, Any]] = {}
        self.next = 0

    def known(self, tenant: str) -> bool:
        if tenant in self.pending or tenant in self.terms:
            return True
        self.catch_up()
        return tenant in self.terms

    def catch_up(self) -> None:
        for m in read_to_end(self.reader, self.topic, {0: self.next}, timeout=30):
            self.next = m.offset() + 1
            try:
                entry = json.loads(m.value() or b"{}")
                self.terms[entry["tenant"]] = entry
            except (ValueError, KeyError, TypeError):
                log.warning("tenants topic: record at offset %d is not a tenant's terms; skipped", m.offset())

    def set(self, terms: TenantTerms) -> bytes:
        entry = {"tenant": terms.tenant, "tier": terms.tier, "max_running": terms.max_running, "weight": terms.weight}
        self.pending[terms.tenant] = entry
        return json.dumps(entry, sort_keys=True).encode()

    def committed(self) -> None:
        self.terms.update(self.pending)
        self.pending.clear()

    def close(self) -> None:
        self.reader.close()


class Admitter:
    def __init__(self, settings: Settings, index: int = 0, codec: Codec | None = None) -> None:
        s = self.s = settings
        if s.admission_fault and s.admission_fault not in FAULT_POINTS:
            raise ValueError(
                f"TASKSTREAM_ADMISSION_FAULT={s.admission_fault!r}: expected one of {', '.join(FAULT_POINTS)}"
            )
        self.member = f"{s.node_id or socket.gethostname()}-admission-{index}"
        self.codec = codec or kafka.make_codec(s)
        self.commands = s.topic("commands")
        self.links_topic = s.topic("admission-links")
        self.tenants_topic = s.topic("tenants")
        self.topic_names = {k: s.topic(k) for k in ("events", "task-inputs", "dead-letters")}
        self.group = f"{s.topic_prefix}-{kafka.ADMISSION_GROUP_SUFFIX}"
        self.owned: dict[int, Owned] = {}
        self.tenants = TenantBook(s, self.group)  # consulted when TASKSTREAM_TENANTS=closed
        self.txn_ids: dict[int, str] = {}  # partition -> transactional id this member writes it with
        self.in_flight: InFlight | None = None
        self.stats = Stats()
        self.ownership = broker.admission_ownership(s, self, self._beat_state)
        self.consumer = self.ownership.consumer
        self.stopping = threading.Event()

    @property
    def settled(self) -> threading.Event:
        """Set once it owns its share of the partitions (as the group, or its view of the cluster, says)."""
        return self.ownership.settled

    # -- heartbeat content ----------------------------------------------------------------------
    def _beat_state(self) -> dict[str, Any]:
        fl = self.in_flight
        return {
            "owned": sorted(self.owned),
            "txn": {str(p): t for p, t in self.txn_ids.items()},
            "in_flight": None if fl is None else fl.__dict__,
            "decided": self.stats.decided,
            "accepted": self.stats.accepted,
            "rejected": self.stats.rejected,
            "forwarded": self.stats.forwarded,
            "dead_lettered": self.stats.dead_lettered,
            "takeovers": self.stats.takeovers[-8:],
        }

    # -- ownership (called by the ownership: connectors/ownership.py, connectors/noida.py) ---------------
    def _producer(self, txn_id: str) -> Producer:
        prod = kafka.producer(
            self.s,
            **{
                "transactional.id": txn_id,
                "transaction.timeout.ms": int(TXN_TIMEOUT_S * 1000),
                "partitioner": "murmur2_random",  # where Kafka's Java clients (and Faust) put a key
                "linger.ms": 2,
            },
        )
        prod.init_transactions(30)
        return prod

    def _new_producer(self, p: int) -> Producer:
        """A producer for partition p under the id the ownership gives; its init_transactions fences
        whoever wrote under that id before."""
        txn_id = self.ownership.transactional_id(p)
        self.txn_ids[p] = txn_id
        return self._producer(txn_id)

    def acquire(self, p: int) -> int:
        """Take commands partition p: fence earlier owners, load its link index and decided batch, find
        where its committed commands end. Returns the offset to read from."""
        self.ownership.fence(p, self._producer)
        prod = self._new_producer(p)
        index, decided = self._load_links(p)
        committed = self.consumer.committed([TopicPartition(self.commands, p)], timeout=10)[0].offset
        low, high = self.consumer.get_watermark_offsets(TopicPartition(self.commands, p), timeout=10, cached=False)
        start = committed if committed >= 0 else low
        orphaned = max(0, high - start)
        pending = _pending(decided, start)
        self.owned[p] = Owned(p, prod, index, pending)
        if pending is not None:
            log.warning("commands partition %d: decided up to offset %d, tasks still to write", p, pending.through)
        previous = self.ownership.previous_owner(p)
        self.ownership.beat()  # say so at once: whoever takes over after a crash knows whom from
        if (previous is not None and self.ownership.abandoned(previous, p)) or (previous is None and orphaned):
            # its previous owner is gone (or unknown, and left commands uncommitted): a takeover
            self.stats.takeovers.append(
                {"partition": p, "from": previous or "?", "at_ms": int(time.time() * 1000), "orphaned": orphaned}
            )
            heard = self.ownership.heard_from(previous) if previous else None
            silent = f" (silent {heard:.1f}s)" if heard is not None else ""
            log.warning(
                "took over commands partition %d from %s%s: %d command(s) not yet committed, from offset %d",
                p,
                previous or "its previous owner",
                silent,
                orphaned,
                start,
            )
        else:
            handed = f" (handed over by {previous})" if previous else ""
            log.info("owns commands partition %d%s from offset %s (%d to decide)", p, handed, start, orphaned)
        return start

    def release(self, p: int, why: str) -> None:
        owned = self.owned.pop(p, None)
        self.txn_ids.pop(p, None)
        if owned is None:
            return
        owned.producer.flush(5)
        self.ownership.beat()
        log.info("released commands partition %d: %s", p, why)

    def _load_links(self, p: int) -> tuple[LinkIndex, Decided | None]:
        """Read this partition's link index from its topic (read_committed: only committed admissions),
        and the newest batch decided ahead of its tasks."""
        index = LinkIndex()
        decided: Decided | None = None
        reader = kafka.consumer(self.s, f"{self.group}-index-{os.getpid()}")
        try:
            low, _ = reader.get_watermark_offsets(TopicPartition(self.links_topic, p), timeout=10)
            for m in read_to_end(reader, self.links_topic, {p: low}, timeout=120):
                value = m.value()
                if not value:
                    continue
                if m.key() == DECIDED_KEY:
                    decided = Decided.from_entry(json.loads(value))
                else:
                    index.add(json.loads(value))
        finally:
            reader.close()
        return index, decided

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> None:
        self.ownership.start()
        try:
            while not self.stopping.is_set():
                msgs = self.ownership.take(BATCH, self.stopping)
                by_partition: dict[int, list[Message]] = {}
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            log.warning("commands consumer: %s", err)
                        continue
                    by_partition.setdefault(_partition(m), []).append(m)
                for p, batch in by_partition.items():
                    if p in self.owned:
                        self.admit_batch(self.owned[p], batch)
        finally:
            self.close()

    def close(self) -> None:
        self.ownership.close()
        for p in list(self.owned):
            self.release(p, "shutting down")
        self.tenants.close()

    # -- one transaction ------------------------------------------------------------------------
    def admit_batch(self, owned: Owned, batch: list[Message]) -> None:
        """Decide a batch of commands and write what the decisions call for, in one transaction; or, when
        the batch admits many tasks, in two: the decisions (with a `Decided` record in the links topic)
        first, so clients learn the outcome without waiting for thousands of task records, then the
        tasks with the commands' offsets. A crash between the two leaves the offsets uncommitted; the
        next owner finds the `Decided` record, skips deciding those commands again and writes the tasks
        of the accepted ones (`carry_out`): every decision is published once, every task admitted once."""
        p = owned.partition
        prod = owned.producer
        self.in_flight = InFlight(p, _offset(batch[0]), _offset(batch[-1]), len(batch), int(time.time() * 1000))
        self._fault("before-write")
        counts = Stats()
        t0 = time.monotonic()
        t_decided = None
        # A large submission allocates ~10^5 objects that all live until the batch ends: the cyclic
        # collector would traverse them again and again for nothing (~12% of the batch, measured).
        gc.disable()
        try:
            prod.begin_transaction()
            admitted: list[tuple[int, Admitted]] = []  # (command offset, the tasks it admits)
            fresh = 0  # tasks of submissions accepted just now
            for i, msg in enumerate(batch):
                earlier = owned.decided is not None and owned.decided.covers(_offset(msg))
                adm = self._carry_out(owned, msg) if earlier else self._admit_one(owned, msg, counts)
                if adm is not None:
                    admitted.append((_offset(msg), adm))
                    fresh += 0 if earlier else len(adm.ids)
                if i == 0:
                    self._fault("mid-write", flush=prod)
            if fresh and fresh >= self.s.admission_split_tasks:
                decided = _decided_after(owned.decided, _offset(batch[-1]), [o for o, _ in admitted])
                prod.produce(self.links_topic, key=DECIDED_KEY, value=decided.to_json(), partition=p)
                self._commit(prod)
                self.tenants.committed()
                owned.decided = decided
                self._tally(counts)
                counts = Stats()
                t_decided = time.monotonic()
                self._fault("after-decision")
                prod.begin_transaction()
            # the tasks of every submission of the batch: several small ones share a record per partition
            self._produce(prod, packed_admissions([adm for _, adm in admitted], self.task_partition))
            t1 = time.monotonic()
            prod.flush(TXN_TIMEOUT_S)
            self._fault("before-commit")
            t2 = time.monotonic()
            offsets = [TopicPartition(self.commands, p, _offset(batch[-1]) + 1)]
            prod.send_offsets_to_transaction(offsets, self.consumer.consumer_group_metadata(), TXN_TIMEOUT_S)
            self._commit(prod)
            self.tenants.committed()
            t3 = time.monotonic()
            if t3 - t0 > 0.0:
                split = "" if t_decided is None else f", decisions committed after {t_decided - t0:.2f}s"
                log.info(
                    "partition %d: %d command(s) in %.2fs (deciding and producing %.2fs, flush %.2fs, commit %.2fs%s)",
                    p,
                    len(batch),
                    t3 - t0,
                    t1 - t0,
                    t2 - t1,
                    t3 - t2,
                    split,
                )
        except KafkaException as exc:
            self._failed(owned, batch, exc)
            return
        except CarryOutError as exc:  # nothing is lost by waiting: the commands stay uncommitted
            self._retry(owned, batch, str(exc))
            self.stopping.wait(CARRY_OUT_RETRY_S)
            return
        finally:
            gc.enable()
            self.in_flight = None
        if owned.decided is not None and not owned.decided.covers(_offset(batch[-1]) + 1):
            owned.decided = None  # everything it covered is committed now
        self.ownership.done(p, _offset(batch[-1]) + 1)
        self._fault("after-commit")
        self._tally(counts)

    def _tally(self, counts: Stats) -> None:
        for k in ("decided", "accepted", "rejected", "forwarded", "dead_lettered"):
            setattr(self.stats, k, getattr(self.stats, k) + getattr(counts, k))

    def _commit(self, prod: Producer) -> None:
        while True:
            try:
                prod.commit_transaction(TXN_TIMEOUT_S)
                return
            except KafkaException as exc:
                if exc.args[0].retriable():
                    continue
                raise

    def _failed(self, owned: Owned, batch: list[Message], exc: KafkaException) -> None:
        self.tenants.pending.clear()
        err = exc.args[0]
        p = owned.partition
        if err.fatal() or err.code() in (KafkaError._FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
            # Someone else owns the partition now (or the producer is unusable): its transaction was
            # aborted by the broker. The ownership takes it again if this member still should own it.
            log.warning("commands partition %d: transaction fenced (%s); giving it up", p, err.str())
            self.ownership.give_up(p, "fenced")
            return
        self._retry(owned, batch, f"transaction failed ({err.str()})")

    def _retry(self, owned: Owned, batch: list[Message], why: str) -> None:
        """Abort the open transaction and read the batch again from its first command."""
        p = owned.partition
        log.warning("commands partition %d: %s; aborting and retrying the batch", p, why)
        self.tenants.pending.clear()  # tenants set by the aborted transaction are set again, or not
        try:
            owned.producer.abort_transaction(TXN_TIMEOUT_S)
        except KafkaException as abort_exc:
            log.warning("abort failed (%s); giving partition %d up", abort_exc, p)
            self.ownership.give_up(p, "abort failed")
            return
        owned.producer = self._new_producer(p)  # on noida-db under a new id: it hides records after an abort
        owned.index, decided = self._load_links(p)  # forget links added by the aborted transaction ...
        owned.decided = _pending(decided, _offset(batch[0]))  # ... but not decisions committed before it
        self.ownership.seek(p, _offset(batch[0]))

    def _admit_one(self, owned: Owned, msg: Message, counts: Stats) -> Admitted | None:
        """Decide one command and write the decision's records; the tasks it admits are the caller's to
        write (`Admitted.records`)."""
        prod = owned.producer
        p = owned.partition
        try:
            cmd = self.codec.decode("command", msg.value())
        except DecodeError as err:
            log.warning("command at %s[%d]@%d is undecodable: %s", msg.topic(), p, msg.offset(), err.reason)
            prod.produce(
                self.topic_names["dead-letters"],
                key=msg.key(),
                value=msg.value(),
                headers=_dead_letter_headers(msg, err.reason),
            )
            counts.dead_lettered += 1
            return None
        at_ms = msg.timestamp()[1]  # log time: the same on every reprocessing
        try:
            where = Placement(p, self.tenant_partition, self.task_partition)
            if self.s.tenants == "closed":
                where = replace(where, tenant_known=self.tenants.known)
            decision = decide_command(self.member, cmd, at_ms, where=where, index=owned.index)
        except Exception as exc:  # a bug on this record must not stall the partition: dead-letter it
            log.exception("admission failed on %s[%d]@%d", msg.topic(), p, msg.offset())
            prod.produce(
                self.topic_names["dead-letters"],
                key=msg.key(),
                value=msg.value(),
                headers=_dead_letter_headers(msg, f"admission failed on this record: {type(exc).__name__}: {exc}"),
            )
            counts.dead_lettered += 1
            return None
        self._write(prod, msg, decision, counts)
        if decision.link_entry is not None:
            entry = decision.link_entry
            prod.produce(
                self.links_topic,
                key=entry["submission_id"].encode(),
                value=LinkIndex.entry_bytes(entry),
                partition=p,
            )
            owned.index.add(entry)  # visible to the rest of this batch; reloaded if the batch aborts
        if decision.tenant is not None:
            value = self.tenants.set(decision.tenant)
            prod.produce(self.tenants_topic, key=decision.tenant.tenant.encode(), value=value, partition=0)
        return decision.admitted

    def _carry_out(self, owned: Owned, msg: Message) -> Admitted | None:
        """A command decided by an earlier transaction: nothing to decide; the tasks of an accepted one."""
        assert owned.decided is not None
        if _offset(msg) not in owned.decided.carry_out:
            return None
        try:
            cmd = self.codec.decode("command", msg.value())
        except DecodeError as err:  # it decoded when it was decided: its writer schema is unreachable now
            raise CarryOutError(
                f"the command at offset {_offset(msg)} was accepted, but its tasks cannot be written yet: {err.reason}"
            ) from err
        log.info("commands partition %d: writing the tasks of %s, decided before", owned.partition, cmd.command_id)
        return carry_out(self.member, cmd, msg.timestamp()[1])

    def _write(self, prod: Producer, msg: Message, decision: Decision, counts: Stats) -> None:
        if decision.forward_to is not None:
            headers: Headers = [("taskstream.forwarded-from", f"{msg.partition()}@{msg.offset()}".encode())]
            prod.produce(
                self.commands, key=msg.key(), value=msg.value(), partition=decision.forward_to, headers=headers
            )
            counts.forwarded += 1
            return
        self._produce(prod, decision.sends)
        counts.decided += 1
        if decision.accepted:
            counts.accepted += 1
        elif decision.sends and decision.sends[0][0] == "events":
            counts.rejected += 1

    def _produce(self, prod: Producer, sends: list[Send]) -> None:
        for topic_key, key, rec in sends:
            kind: Headers | None = [(EVENT_HEADER, rec.kind.encode())] if topic_key == "events" else None
            for k, value in self._encoded(key, rec):
                prod.produce(self.topic_names[topic_key], key=k.encode(), value=value, headers=kind)
            if len(prod) > 50_000:
                prod.poll(0)

    def _encoded(self, key: str, rec: Any) -> list[tuple[str, bytes]]:
        return encode_split(self.codec, key, rec, PACKED_MAX_BYTES)

    def tenant_partition(self, tenant: str) -> int:
        return partition_for(tenant.encode(), self.s.partitions)

    def task_partition(self, task_id: str) -> int:
        return partition_for(task_id.encode(), self.s.partitions)

    # -- fault injection (tests) ----------------------------------------------------------------
    def _fault(self, point: str, flush: Producer | None = None) -> None:
        s = self.s
        if s.admission_fault != point or not s.admission_fault_file:
            return
        marker = s.admission_fault_file
        if os.path.exists(marker):
            return
        if flush is not None:
            flush.flush(10)  # make the partial writes reach the broker before dying
        with open(marker, "w") as f:
            f.write(f"{self.member} pid {os.getpid()} killed itself at {point}\n")
            f.flush()
            os.fsync(f.fileno())
        log.warning("fault injection: SIGKILL at %s", point)
        os.kill(os.getpid(), signal.SIGKILL)


def encode_split(codec: Codec, key: str, rec: Any, limit: int) -> list[tuple[str, bytes]]:
    """(key, bytes) to produce for a record. A packed admission bigger than `limit` is split in halves
    until every part fits; each part keeps its partition (its key is its first task's id, and all its
    tasks belong to one partition) and gets its own event id."""
    value = codec.encode(rec)
    tasks = rec.payload.tasks if isinstance(rec, EventRecord) and isinstance(rec.payload, TasksAdmitted) else ()
    if len(value) <= limit or len(tasks) < 2:
        return [(key, value)]
    half = len(tasks) // 2
    parts = []
    for n, part in enumerate((tasks[:half], tasks[half:])):
        sub = replace(rec, event_id=f"{rec.event_id}.{n}", payload=replace(rec.payload, tasks=part))
        parts.extend(encode_split(codec, part[0].task_id, sub, limit))
    return parts


def _pending(decided: Decided | None, start: int) -> Decided | None:
    """The decided batch that still matters to a reader starting at command offset `start`."""
    return decided if decided is not None and decided.covers(start) else None


def _decided_after(previous: Decided | None, last: int, carry_out: list[int]) -> Decided:
    """The Decided record for a batch ending at `last`, keeping what an earlier one covers past it."""
    if previous is None or previous.through <= last:
        return Decided(last, tuple(carry_out))
    return Decided(previous.through, (*carry_out, *(o for o in previous.carry_out if o > last)))


def _partition(msg: Message) -> int:
    partition = msg.partition()
    assert partition is not None, "a consumed record always has a partition"
    return partition


def _offset(msg: Message) -> int:
    offset = msg.offset()
    assert offset is not None, "a consumed record always has an offset"
    return offset


def _dead_letter_headers(msg: Message, reason: str) -> Headers:
    return [
        ("taskstream.error", reason.encode()[:2000]),
        ("taskstream.source.topic", str(msg.topic()).encode()),
        ("taskstream.source.partition", str(msg.partition()).encode()),
        ("taskstream.source.offset", str(msg.offset()).encode()),
        ("taskstream.detected.by", b"admission"),
    ]


def run_admitter(settings: Settings, index: int, on_ready: Any = None) -> None:
    """Run one admission worker until SIGTERM/SIGINT."""
    admitter = Admitter(settings, index)

    def stop(*_: object) -> None:
        admitter.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if on_ready is not None:
        threading.Thread(target=_when_ready, args=(admitter, on_ready), daemon=True).start()
    admitter.run()


def _when_ready(admitter: Admitter, on_ready: Any) -> None:
    """Ready once it owns its share: `taskstream up` then returns with the partitions handed over."""
    while not admitter.settled.wait(0.1) and not admitter.stopping.is_set():
        pass
    on_ready()
