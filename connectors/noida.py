"""Everything taskstream does only because of noida-db, the pip-only fallback broker. Chosen by
connectors/broker.py when `settings.broker == "noida"`, and off on Apache Kafka.

Each workaround names the noida-db behaviour that made it necessary (ARCHITECTURE.md and
docs/measurements.md have the measurements):

- It answers an empty fetch at once instead of holding it for fetch.wait.max.ms, so an idle assigned
  consumer spins (~2,000 fetches/s, most of a core). librdkafka consumers are unassigned while idle and
  poll the end offsets at a growing interval (`Resting`); aiokafka's fetcher waits after an empty
  answer (`install_idle_backoff`). pause/resume instead restarted fetching late or never.
- It ignores fetch size limits (one 224 MB answer after 1M events): consumers accept answers of any size.
- It never expires the session of a SIGKILLed consumer-group member, so the submitter cluster keeps its
  own membership: heartbeats on a topic and rendezvous hashing over the live members
  (`HeartbeatOwnership`); a restarted Faust worker sends the LeaveGroup its dead predecessor never did
  (`leave_for_predecessor`).
- It lists every aborted transaction still in the log with each fetch, and clients then skip every
  later record of that producer id: a transactional id is never written again after an abort, and a
  new owner fences every id the previous owners announced.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, Message, TopicPartition
from taskstream.connectors import kafka
from taskstream.connectors.keeper import pid_alive
from taskstream.connectors.ownership import Owner, StatusBeats
from taskstream.connectors.reading import ReadTimeout, read_to_end

from taskstream.settings import Settings

log = logging.getLogger("taskstream.admission")
_MARK = "_taskstream_idle_backoff"
_MEMBER_MARK = "_taskstream_remember_member"
BIG_BATCH_BYTES = 256 * 1024  # records worth unassigning the consumer for while they are worked on
READ_EVERY_S = 0.25  # how often a member reads the others' heartbeats
IDLE_MAX_S = 0.05  # the longest an idle admission worker waits before looking for new commands again

# librdkafka consumer settings for noida-db: answers of any size (it ignores the fetch limits), and a
# pause of our own between empty fetches (it answers them at once).
CONSUMER_CONFIG: dict[str, Any] = {
    "receive.message.max.bytes": 2_147_483_647,
    "fetch.wait.max.ms": 100,
    "fetch.error.backoff.ms": 20,
}


# ---- idle librdkafka consumers ------------------------------------------------------------------------


def worth_unassigning(msgs: list[Any]) -> bool:
    """Is this batch big enough to stop fetching while it is decoded and handled? An assigned consumer
    keeps refetching from noida-db meanwhile: ~0.27 s of CPU beside a 10,000-task admission's 0.4 s
    (measured). The caller assigns again at its tracked offsets afterwards."""
    return sum(len(m.value() or b"") for m in msgs) > BIG_BATCH_BYTES


class Resting:
    """An idle consumer unassigned, asking for the partitions' end offsets (one request per partition,
    at a growing interval) until one has records past where it is; then the caller assigns it again at
    explicit offsets. Where it is: the consumer's position, which librdkafka moves past transaction
    markers and aborted records, so a partition whose last records were a commit marker is not taken
    for one with records to read."""

    def __init__(self, consumer: Any, topic: str, first: float = 0.005, ceiling: float = 0.1) -> None:
        self.consumer = consumer
        self.topic = topic
        self.first = first
        self.ceiling = ceiling
        self._pause = first

    def settle(self, next_offsets: dict[int, int]) -> None:
        """Move each partition's next offset up to the consumer's position (call while still assigned)."""
        try:
            positions = self.consumer.position([TopicPartition(self.topic, p) for p in next_offsets])
        except KafkaException:
            return
        for tp in positions:
            if tp.offset is not None and tp.offset > next_offsets.get(tp.partition, tp.offset):
                next_offsets[tp.partition] = tp.offset

    def behind(self, next_offsets: dict[int, int]) -> bool:
        """Does any partition have records at or past its next offset? (Unknown counts as yes.)"""
        for p, offset in next_offsets.items():
            try:
                _, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=5, cached=False)
            except KafkaException:
                return True
            if high > offset:
                return True
        return False

    def pause(self) -> float:
        """How long to wait before looking again: doubles from `first` up to `ceiling` while idle."""
        pause = self._pause
        self._pause = min(self.ceiling, self._pause * 2)
        return pause

    def woke(self) -> None:
        """Records arrived: the next idle spell starts with short pauses again."""
        self._pause = self.first

    def rest(self, next_offsets: dict[int, int], stop: threading.Event) -> bool:
        """Settle, unassign, and return once a partition has records past its next offset (or on stop).
        Returns True: the caller assigns again at `next_offsets`."""
        self.settle(next_offsets)
        self.consumer.unassign()
        while not stop.wait(self.pause()):
            if self.behind(next_offsets):
                break
        return True

    def big_batch(self, msgs: list[Any]) -> bool:
        return worth_unassigning(msgs)


# ---- aiokafka (Faust's client) ------------------------------------------------------------------------


def install_idle_backoff(seconds: float) -> None:
    """aiokafka sends the next fetch to a broker as soon as the previous one returns. Wrap the coroutine
    that handles one fetch so that an empty answer holds the slot for `seconds` before the next request;
    a fetch that brought records returns at once. Pinned to aiokafka 0.14.0 (pyproject), whose
    `Fetcher._proc_fetch_request` returns True exactly when it buffered new records."""
    from aiokafka.consumer.fetcher import Fetcher

    current = Fetcher._proc_fetch_request
    if getattr(current, _MARK, None) is not None:
        setattr(current, _MARK, seconds)
        return
    original = current

    async def proc_fetch_request(self: Any, assignment: Any, node_id: Any, request: Any) -> bool:
        got = await original(self, assignment, node_id, request)
        if not got:
            try:
                await asyncio.sleep(getattr(proc_fetch_request, _MARK))
            except asyncio.CancelledError:
                return False  # closing or reassigned: the original swallows cancellation the same way
        return bool(got)

    setattr(proc_fetch_request, _MARK, seconds)
    Fetcher._proc_fetch_request = proc_fetch_request  # type: ignore[method-assign]


def remember_group_member(path: Path) -> None:
    """Write this process's consumer-group member id and pid to `path` each time it joins a group, so
    that its next run can take the membership back (`leave_for_predecessor`). Pinned to aiokafka 0.14.0,
    whose `GroupCoordinator._on_join_complete(generation, member_id, ...)` runs after every join."""
    from aiokafka.consumer.group_coordinator import GroupCoordinator

    original = GroupCoordinator._on_join_complete
    if getattr(original, _MEMBER_MARK, False):
        return

    async def on_join_complete(self: Any, generation: Any, member_id: str, *args: Any, **kwargs: Any) -> Any:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"group": self.group_id, "member": member_id, "pid": os.getpid()}))
        except OSError as exc:  # a restart then waits like before; nothing else depends on it
            log.warning("could not record the group member id in %s: %s", path, exc)
        return await original(self, generation, member_id, *args, **kwargs)

    setattr(on_join_complete, _MEMBER_MARK, True)
    GroupCoordinator._on_join_complete = on_join_complete  # type: ignore[method-assign]


def leave_for_predecessor(settings: Settings, path: Path) -> str | None:
    """Take a dead predecessor's group membership back: noida-db never expires the session of a SIGKILLed
    member, and a group with a dead member never finishes a rebalance, so a restarted worker was never
    given partitions (docs/measurements.md). A LeaveGroup sent on the dead member's behalf, with the
    member id its run wrote to `path`, removes it (measured: the next member is assigned within
    seconds). Nothing is sent while the recorded process is still alive. Returns the member id left."""
    try:
        known = json.loads(path.read_text())
        group, member, pid = str(known["group"]), str(known["member"]), int(known["pid"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the unreadable group member record %s: %s", path, exc)
        return None
    if pid != os.getpid() and pid_alive(pid):
        log.warning("not leaving group %s for member %s: its process %s is alive", group, member, pid)
        return None

    async def leave() -> int:
        from aiokafka.client import AIOKafkaClient, CoordinationType
        from aiokafka.protocol.group import LeaveGroupRequest

        client = AIOKafkaClient(bootstrap_servers=settings.bootstrap)
        await client.bootstrap()
        try:
            node = await client.coordinator_lookup(CoordinationType.GROUP, group)
            answer = await client.send(node, LeaveGroupRequest(group, member))
            return int(answer.error_code)
        finally:
            await client.close()

    try:
        code = asyncio.run(leave())
    except Exception as exc:  # the worker starts anyway; it is given partitions once the group lets it
        log.warning("could not leave group %s for the dead member %s (tried again at the next start): %s",
                    group, member, exc)  # fmt: skip
        return None
    path.unlink(missing_ok=True)
    log.info("left group %s for the dead member %s of a previous run (error code %s)", group, member, code)
    return member


# ---- the submitter cluster's own membership -----------------------------------------------------------


def rendezvous_owner(members: list[str], partition: int) -> str:
    """The member that owns `partition` among `members` (highest random weight hashing)."""
    return max(members, key=lambda m: hashlib.blake2b(f"{m}|{partition}".encode(), digest_size=8).digest())


@dataclass
class MemberView:
    member: str
    heard: float  # time.monotonic() when its newest heartbeat was read here
    beat: dict[str, Any]


class Membership(StatusBeats):
    """Heartbeats out (StatusBeats), everyone's heartbeats in (a background thread), and who is alive."""

    def __init__(self, settings: Settings, member: str, state: Any) -> None:
        super().__init__(settings, member, state)
        self.timeout = settings.admission_member_timeout_ms / 1000
        self.lock = threading.Lock()
        self.views: dict[str, MemberView] = {}
        self.caught_up = threading.Event()
        self.consumer = kafka.consumer(settings, f"{settings.topic_prefix}-members-{member}-{os.getpid()}")
        self.next_offset = 0
        self.started = time.monotonic()
        self.reader = threading.Thread(target=self._read, name="membership-reader", daemon=True)

    def start(self) -> None:
        low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=10)
        self.next_offset = max(low, high - 5000)
        super().start()
        self.reader.start()

    def _read(self) -> None:
        """Read new heartbeats every READ_EVERY_S, to the end, then unassigned until the next read.

        An assigned librdkafka consumer fetches without pause from noida-db; pausing between reads lost
        up to 18 s of heartbeats under load (resume restarts late, and seek-after-resume stalled when the
        GIL was contended), measured. Unassigned, it fetches nothing; each read costs one round trip."""
        while not self.stop.is_set():
            try:
                for msg in read_to_end(self.consumer, self.topic, {0: self.next_offset}, timeout=5.0):
                    self._heard(msg)
                    self.next_offset = msg.offset() + 1
                self.caught_up.set()
            except ReadTimeout as exc:
                log.warning("membership: %s", exc)
            if time.monotonic() - self.started > 5:
                self.caught_up.set()
            self.stop.wait(READ_EVERY_S)

    def _heard(self, msg: Message) -> None:
        try:
            beat = json.loads(msg.value() or b"{}")
            member = beat["member"]
        except (ValueError, KeyError, TypeError):
            return
        now = time.monotonic()
        if not self.caught_up.is_set():  # old heartbeats read at start: age them by their own clock
            now -= max(0.0, time.time() - beat.get("at_ms", 0) / 1000)
        with self.lock:
            self.views[member] = MemberView(member, now, beat)

    def live(self) -> list[str]:
        now = time.monotonic()
        with self.lock:
            alive = {m for m, v in self.views.items() if v.beat.get("state") == "up" and now - v.heard <= self.timeout}
        return sorted(alive | {self.member})

    def view(self, member: str) -> MemberView | None:
        with self.lock:
            return self.views.get(member)

    def ready(self) -> bool:
        """Has it heard enough to know who else is alive? (At least one timeout's worth of heartbeats.)"""
        return self.caught_up.is_set() and time.monotonic() - self.started >= min(self.timeout, 2.0)

    def close(self) -> None:
        self.stop.set()
        self.reader.join(5)
        super().close()
        self.consumer.close()


class HeartbeatOwnership:
    """Ownership of the commands partitions without a consumer group (noida-db never expires the session
    of a killed member). Each partition belongs to the live member with the highest rendezvous hash for
    it, so a death moves only the dead member's partitions and every survivor computes the same answer
    without a coordinator. Views can disagree for a moment; that is harmless because ownership is enforced
    by the broker, not by the view: every transactional id is announced before it writes, and a new owner
    fences every id announced for the partition (init_transactions aborts its open transaction, and any
    later commit by the old owner fails)."""

    def __init__(self, settings: Settings, owner: Owner, state: Any) -> None:
        self.s = settings
        self.owner = owner
        self.topic = settings.topic("commands")
        self.consumer = kafka.consumer(settings, f"{settings.topic_prefix}-{kafka.ADMISSION_GROUP_SUFFIX}")
        self.members = Membership(settings, owner.member, state)
        self.rest = Resting(self.consumer, self.topic, ceiling=IDLE_MAX_S)
        self.resting = False
        self.next_offsets: dict[int, int] = {}  # owned partition -> the next command offset to read
        self.txn_ids: dict[int, str] = {}  # partition -> the transactional id this member writes it with
        self.settled = threading.Event()
        self.last_rebalance = 0.0

    # -- what the admitter asks ------------------------------------------------------------------------
    def start(self) -> None:
        self.members.start()

    def transactional_id(self, p: int) -> str:
        """An id never used before, announced (heartbeat, flushed) before it writes anything: ids are not
        reused after an abort (noida-db's aborted-transaction lists), and whoever owns the partition next
        can fence it."""
        txn_id = f"{self.s.topic_prefix}-admission-p{p}-{uuid.uuid4().hex[:12]}"
        self.txn_ids[p] = txn_id
        self.members.beat(flush=True)
        return txn_id

    def fence(self, p: int, make_producer: Any) -> None:
        """Abort and fence every other transactional id any member announced for partition p: a dead or
        stale owner's open transaction would otherwise hold back read_committed readers forever."""
        with self.members.lock:
            beats = [v.beat for v in self.members.views.values()]
        for beat in beats:
            old = (beat.get("txn") or {}).get(str(p))
            if old and old != self.txn_ids.get(p):
                prod = make_producer(old)  # bumps its epoch: aborts its open transaction, fences it
                prod.flush(5)

    def previous_owner(self, p: int) -> str | None:
        with self.members.lock:
            views = list(self.members.views.values())
        for v in views:
            if v.member != self.owner.member and p in (v.beat.get("owned") or []):
                return v.member
        return None

    def heard_from(self, member: str) -> float | None:
        """Seconds since `member` was last heard, if it was."""
        seen = self.members.view(member)
        return None if seen is None else time.monotonic() - seen.heard

    def abandoned(self, member: str, p: int) -> bool:
        """This cluster moves a partition from a live member only once that member has let it go, so a
        previous owner that still lists p abandoned it if it is no longer live."""
        return member not in self.members.live()

    def seek(self, p: int, offset: int) -> None:
        self.next_offsets[p] = offset
        self._reassign()

    def take(self, most: int, stop: threading.Event) -> list[Message]:
        """The next commands of the owned partitions (ownership is settled here first)."""
        now = time.monotonic()
        if now - self.last_rebalance >= 0.2:
            self._rebalance()
            self.last_rebalance = now
        if not self.next_offsets:
            stop.wait(0.05)
            return []
        if self.resting:  # unassigned while idle; _rebalance() keeps running
            if not self.rest.behind(self.next_offsets):
                stop.wait(self.rest.pause())
                return []
            self._reassign()
        first = self.consumer.poll(0.05)
        if first is None:
            self.rest.settle(self.next_offsets)
            self.consumer.unassign()
            self.resting = True
            return []
        msgs = [first, *self.consumer.consume(most - 1, 0)]
        self.rest.woke()
        if worth_unassigning(msgs):  # long work ahead: stop fetching meanwhile
            self.consumer.unassign()
            self.resting = True
        return msgs

    def done(self, p: int, next_offset: int) -> None:
        if p in self.next_offsets:
            self.next_offsets[p] = next_offset

    def beat(self) -> None:
        self.members.beat()

    def close(self) -> None:
        for p in list(self.next_offsets):
            self.owner.release(p, "shutting down")
            self.next_offsets.pop(p, None)
        self.members.close()
        self.consumer.close()

    # -- ownership -------------------------------------------------------------------------------------
    def _rebalance(self) -> None:
        if not self.members.ready():
            return
        live = self.members.live()
        want = {p for p in range(self.s.partitions) if rendezvous_owner(live, p) == self.owner.member}
        for p in sorted(set(self.next_offsets) - want):
            self.give_up(p, "another member owns it now")
        for p in sorted(want - set(self.next_offsets)):
            self.next_offsets[p] = self.owner.acquire(p)
            self._reassign()
        self.settled.set()  # owns its share of the partitions as this member sees the cluster

    def give_up(self, p: int, why: str) -> None:
        """Stop reading p (fenced, or someone else's now); rebalance() takes it again if it should."""
        self.txn_ids.pop(p, None)
        if self.next_offsets.pop(p, None) is not None:
            self.owner.release(p, why)
            self._reassign()

    def _reassign(self) -> None:
        """Assign exactly the owned partitions at the next offsets to read.

        Used instead of pause/resume, which on noida-db left a partition paused before its first fetch
        unread for good and restarted others up to 1.5 s late (docs/measurements.md): an idle consumer
        is unassigned (it fetches nothing) and reassigned at explicit offsets, which fetches at once."""
        self.consumer.assign([TopicPartition(self.topic, p, o) for p, o in sorted(self.next_offsets.items())])
        self.resting = False
