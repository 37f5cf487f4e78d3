"""The submitter cluster on a real stack: admission workers are real processes, killed with real SIGKILLs.

This module runs its own stack with no admission workers of its own; each test starts the workers it
needs (`taskstream serve admission`), so it decides who dies and where. On Kafka the consumer group
decides who owns which commands partition; on noida-db the workers' own membership does (rendezvous
hashing): the tests read who owns what from the cluster view either way. What is checked after each crash:
every command ends decided exactly once (accepted or rejected) in the committed log, no task id is
admitted twice, every admitted task has its edges and every edge its task, in the log, in PostgreSQL and
in the graph; the records the dead worker had written but not committed exist in the log and are
invisible to read_committed readers.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from taskstream.connectors.cluster import describe
from taskstream.connectors.kafka import make_codec
from taskstream.connectors.noida import rendezvous_owner
from taskstream.connectors.partitioning import partition_for
from taskstream.connectors.services import ready_file
from taskstream.projections.graph_service import graph_queries
from taskstream.schemas import records as r

from taskstream.core import events as e
from taskstream.core.submission import Submission, parse_document, reference_id, submission_id_for
from taskstream.sdk import Client
from tests.conftest import ROOT, Stack, running, wait_until

pytestmark = pytest.mark.stack

TENANT = "crashco"


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory, stack_kind: str) -> Iterator[Stack]:
    """A stack without admission workers (the tests start and kill them), short waits for references."""
    s = Stack(tmp_path_factory.mktemp(f"cluster-{stack_kind}") / "state", stack_kind)
    s.env.update(
        TASKSTREAM_ADMISSION_WORKERS="0",
        TASKSTREAM_ADMISSION_MEMBER_TIMEOUT_MS="3000",
        TASKSTREAM_REFERENCE_WAIT_MS="4000",
    )
    with running(s):
        yield s


class Workers:
    """Admission worker processes started by a test; all stopped (SIGTERM) when it ends."""

    def __init__(self, stack: Stack, tmp: Path) -> None:
        self.stack, self.tmp = stack, tmp
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, index: int, **env: str) -> subprocess.Popen[bytes]:
        ready = ready_file(self.stack.settings, f"admission-{index}")
        ready.unlink(missing_ok=True)
        log = (self.tmp / f"admission-{index}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "taskstream", "serve", "admission", "--index", str(index)],
            env={**self.stack.env, **env},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs[index] = proc
        return proc

    def start_pair(self) -> tuple[int, int, set[int]]:
        """Start two workers that split the partitions; wait until both own their share. Returns their
        indices and the first one's partitions."""
        a, b = pair_indices(self.stack.settings)
        self.start(a)
        self.start(b)
        self.wait_ready(a, b)
        return a, b, wait_split(self.stack, a, b)

    def wait_ready(self, *indices: int) -> None:
        for i in indices:
            wait_until(lambda i=i: ready_file(self.stack.settings, f"admission-{i}").exists(), 60, f"admission-{i}")

    def log(self, index: int) -> str:
        return (self.tmp / f"admission-{index}.log").read_text(errors="replace")

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def workers(bare: Stack, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(bare, tmp_path)
    yield w
    w.stop()


def member(settings: Any, index: int) -> str:
    return f"{settings.node_id or socket.gethostname()}-admission-{index}"


def pair_indices(settings: Any) -> tuple[int, int]:
    """Two admission worker indices that both own partitions when alive together. The consumer group
    (Kafka) always splits them; the rendezvous hash (noida-db) does for some pairs of names only."""
    if settings.broker == "kafka":
        return 0, 1
    for a in range(8):
        for b in range(8):
            if a == b:
                continue
            members = sorted([member(settings, a), member(settings, b)])
            owners = {p: rendezvous_owner(members, p) for p in range(settings.partitions)}
            if 0 < sum(1 for m in owners.values() if m == member(settings, a)) < settings.partitions:
                return a, b
    raise AssertionError("no pair of admission workers splits the partitions")


def wait_split(stack: Stack, a: int, b: int) -> set[int]:
    """Wait until workers a and b are both alive and split every commands partition between them, as
    the cluster view says (the group coordinator on Kafka); a's partitions."""
    s = stack.settings

    def split() -> set[int] | None:
        live = {m["member"]: set(m["owned"]) for m in describe(s)["members"] if m["alive"]}
        mine, theirs = live.get(member(s, a), set()), live.get(member(s, b), set())
        ok = mine and theirs and not mine & theirs and mine | theirs == set(range(s.partitions))
        return mine if ok else None

    parts: set[int] = wait_until(split, 60, f"admission-{a} and admission-{b} to split the partitions")
    return parts


def doc(key: str, n: int, linked_to: str | None = None, bad: bool = False) -> Submission:
    tasks: list[dict[str, Any]] = []
    for i in range(n):
        deps = [f"t{i - 1}"] if i else ([f"{linked_to}/t0"] if linked_to else [])
        tasks.append({"name": f"t{i}", "argv": ["true"], "dependencies": deps})
    sub = parse_document({"tenant": TENANT, "idempotency_key": key, "tasks": tasks})
    if bad:  # a retry limit over the limit on one task: the whole submission is rejected
        return dataclasses.replace(sub, tasks=(*sub.tasks[:-1], dataclasses.replace(sub.tasks[-1], retry_limit=10_000)))
    return sub


def waits_for(key: str, name: str, dependency: str) -> Submission:
    """A one-task submission whose task depends on `dependency`."""
    task = {"name": name, "argv": ["true"], "dependencies": [dependency]}
    return parse_document({"tenant": TENANT, "idempotency_key": key, "tasks": [task]})


def produce_many(stack: Stack, subs: list[tuple[Submission, int]]) -> list[str]:
    """Produce SubmitDags to chosen partitions (as any producer may) in one flush; their command ids."""
    codec = make_codec(stack.settings)
    p = Producer({"bootstrap.servers": stack.settings.bootstrap, "linger.ms": 50})
    ids = []
    for sub, partition in subs:
        cmd = r.CommandRecord(
            command_id=str(uuid.uuid4()),
            issued_ms=int(time.time() * 1000),
            body=r.SubmitDag(sub.tenant, sub.tasks, sub.idempotency_key, {}),
            issuer="crash-test",
        )
        p.produce(
            stack.settings.topic("commands"), key=cmd.command_id.encode(), value=codec.encode(cmd), partition=partition
        )
        ids.append(cmd.command_id)
    assert p.flush(30) == 0
    return ids


def produce_to(stack: Stack, sub: Submission, partition: int) -> str:
    return produce_many(stack, [(sub, partition)])[0]


def read_log(stack: Stack, topic_key: str, committed: bool) -> list[Any]:
    s = stack.settings
    c = Consumer(
        {
            "bootstrap.servers": s.bootstrap,
            "group.id": f"t-{uuid.uuid4()}",
            "enable.partition.eof": True,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "receive.message.max.bytes": 2_147_483_647,
        }
    )
    topic = s.topic(topic_key)
    c.assign([TopicPartition(topic, p, 0) for p in range(s.partitions)])
    out, eof = [], set()
    deadline = time.monotonic() + 60
    while len(eof) < s.partitions and time.monotonic() < deadline:
        for m in c.consume(500, 0.5):
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                continue
            out.append(m)
    c.close()
    return out


def decisions(stack: Stack, committed: bool = True) -> tuple[Counter[str], Counter[str], list[r.EventRecord]]:
    """Per command id: how many decisions; per task id: how many TaskSubmitted; all decoded events."""
    codec = make_codec(stack.settings)
    recs = [x for m in read_log(stack, "events", committed) for x in r.task_events(codec.decode("event", m.value()))]
    per_command = Counter(
        x.payload.command_id for x in recs if isinstance(x.payload, r.SubmissionAccepted | r.SubmissionRejected)
    )
    per_task = Counter(x.task_id for x in recs if isinstance(x.payload, e.TaskSubmitted))
    return per_command, per_task, recs


# --------------------------------------------------------------------------------------------------


@pytest.mark.fallback
@pytest.mark.parametrize(
    ("point", "split"),
    [
        ("before-write", False),
        pytest.param("mid-write", False, marks=pytest.mark.kafka_only),
        ("before-commit", False),
        pytest.param("after-commit", False, marks=pytest.mark.kafka_only),
        # decisions committed in a transaction of their own, the tasks in a second one (admit_batch)
        pytest.param("after-decision", True, marks=pytest.mark.kafka_only),
        ("before-commit", True),
    ],  # on noida-db: a kill before any write, and before each kind of commit (its transactions differ)
)
def test_sigkill_inside_admission_then_the_survivor_takes_over(
    bare: Stack, workers: Workers, tmp_path: Path, point: str, split: bool
) -> None:
    s = bare.settings
    a, b = pair_indices(s)
    run = uuid.uuid4().hex[:8]
    home = partition_for(TENANT.encode(), s.partitions)
    marker = tmp_path / "killed"
    mode = {"TASKSTREAM_ADMISSION_SPLIT_TASKS": "0" if split else "1000000"}
    doomed = workers.start(a, TASKSTREAM_ADMISSION_FAULT=point, TASKSTREAM_ADMISSION_FAULT_FILE=str(marker), **mode)
    workers.start(b, **mode)
    workers.wait_ready(a, b)
    a_parts = wait_split(bare, a, b)
    sent: dict[str, tuple[Submission, bool]] = {}  # command id -> (submission, admissible)
    commands = []
    for p in range(s.partitions):  # several commands on every partition, produced together: one batch
        for j in range(3):
            commands.append((doc(f"{run}-p{p}-{j}", 4), True, p))
        commands.append((doc(f"{run}-bad{p}", 3, bad=True), False, p))
    # a linked submission, sent away from the tenant's partition: forwarded there, decided there
    commands.append((doc(f"{run}-linked", 2, linked_to=f"{run}-p0-0"), True, (home + 1) % s.partitions))
    for cid, (sub, ok, _) in zip(produce_many(bare, [(sub, p) for sub, _, p in commands]), commands, strict=True):
        sent[cid] = (sub, ok)
    assert doomed.wait(90) == -signal.SIGKILL, workers.log(a)
    killed_at = marker.stat().st_mtime
    assert f"SIGKILL at {point}" in workers.log(a)

    # the survivor takes the dead worker's partitions over and decides everything, and admits every task
    def all_decided() -> bool:
        counts, tasks, recs = decisions(bare)
        admitted = [x.payload for x in recs if isinstance(x.payload, r.SubmissionAccepted)]
        ids = [t for acc in admitted if acc.command_id in sent for t in acc.task_ids.values()]
        return all(counts[c] >= 1 for c in sent) and all(tasks[t] >= 1 for t in ids)

    wait_until(all_decided, 120, "every command decided", every=1.0)
    took_over = time.time() - killed_at
    log_b = workers.log(b)
    for p in a_parts:
        assert f"took over commands partition {p} from" in log_b, log_b
    print(f"\n{point}: every orphaned admission decided {took_over:.1f}s after the SIGKILL")

    # exactly once, in the committed log
    per_command, per_task, recs = decisions(bare)
    assert all(per_command[c] == 1 for c in sent), {c: per_command[c] for c in sent if per_command[c] != 1}
    accepted = {
        x.submission_id: x.payload
        for x in recs
        if isinstance(x.payload, r.SubmissionAccepted) and x.payload.command_id in sent
    }
    rejected = [x for x in recs if isinstance(x.payload, r.SubmissionRejected) and x.payload.command_id in sent]
    assert len(accepted) == sum(ok for _, ok in sent.values())
    assert {x.payload.command_id for x in rejected} == {c for c, (_, ok) in sent.items() if not ok}
    ids = {tid for acc in accepted.values() for tid in acc.task_ids.values()}
    assert all(per_task[t] == 1 for t in ids), "a task admitted twice"
    specs = {x.task_id: x.payload.spec for x in recs if isinstance(x.payload, e.TaskSubmitted) and x.task_id in ids}
    assert set(specs) == ids, "an accepted task without its TaskSubmitted"
    known = ids | {reference_id(TENANT, f"{run}-p0-0", "t0")}
    assert all(d in known for sp in specs.values() for d in sp.dependencies), "an edge to nothing"

    # what the dead worker wrote and never committed is in the log, invisible to committed readers
    all_per_command, all_per_task, _ = decisions(bare, committed=False)
    uncommitted_extra = sum(all_per_command[c] for c in sent) - len(sent)
    uncommitted_tasks = sum(all_per_task[t] for t in ids) - len(ids)
    if split:
        # the decisions were committed before the crash: the survivor wrote their tasks, deciding nothing
        assert uncommitted_extra == 0
        assert (uncommitted_tasks > 0) == (point == "before-commit"), uncommitted_tasks
        assert "decided before" in log_b, log_b
    elif point in ("mid-write", "before-commit"):
        assert uncommitted_extra > 0, "the crash should have left aborted decisions in the log"
    else:
        assert uncommitted_extra == 0

    # both projections: every accepted task with exactly its edges, nothing of the aborted writes extra
    expected_edges = {(t, d) for t, sp in specs.items() for d in sp.dependencies}

    def projected() -> str | None:
        """None when both projections show exactly the admitted tasks and edges; else what differs."""
        with psycopg.connect(s.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT task_id::text, dependencies::text[] FROM tasks WHERE submission_id = ANY(%s::uuid[])",
                (list(accepted),),
            ).fetchall()
        pg_edges = {(t, d) for t, deps in rows for d in deps}
        graph = graph_queries(s)
        g_nodes = {n[0] for sid in accepted for n in graph.nodes(sid)}
        g_edges = {tuple(x) for sid in accepted for x in graph.edges(sid)}
        diffs = {
            "pg tasks": len({t for t, _ in rows} ^ ids),
            "pg edges": len(pg_edges ^ expected_edges),
            "graph nodes": len(g_nodes ^ ids),
            "graph edges": len(g_edges ^ expected_edges),
        }
        if not any(diffs.values()):
            return None
        pg_ids = {t for t, _ in rows}
        return (
            f"differences {diffs}; in the log only: {sorted(ids - pg_ids)[:4]}, in PostgreSQL only:"
            f" {sorted(pg_ids - ids)[:4]}; accepted: {[(sid, acc.command_id) for sid, acc in accepted.items()]}"
        )

    last: list[str | None] = [None]

    def settled() -> bool:
        last[0] = projected()
        return last[0] is None

    try:
        wait_until(settled, 90, "both projections to show every admitted task and edge", every=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {last[0]}") from None
    with psycopg.connect(s.dsn, autocommit=True) as conn:
        n = conn.execute(
            "SELECT count(*) FROM submissions WHERE command_id = ANY(%s::text[])", (list(sent),)
        ).fetchone()
    assert n is not None and n[0] == len(sent)


def test_linked_submissions_racing_on_different_partitions_never_close_a_cycle(bare: Stack, workers: Workers) -> None:
    """Each pair depends on each other; the two halves are produced at once to two different partitions
    owned by two different workers. One half is admitted, the other rejected with the cycle named."""
    s = bare.settings
    a, b, a_parts = workers.start_pair()
    client = Client(s)
    pa = min(a_parts)
    pb = min(set(range(s.partitions)) - a_parts)
    pairs = []
    for _ in range(5):
        k1, k2 = f"race-{uuid.uuid4().hex[:6]}-x", f"race-{uuid.uuid4().hex[:6]}-y"
        s1 = waits_for(k1, "x", f"{k2}/y")
        s2 = waits_for(k2, "y", f"{k1}/x")
        pairs.append((produce_to(bare, s1, pa), produce_to(bare, s2, pb), k1, k2))
    for c1, c2, k1, k2 in pairs:
        o1 = client.wait_outcome(submission_id_for(TENANT, k1, c1), 60, command_id=c1)
        o2 = client.wait_outcome(submission_id_for(TENANT, k2, c2), 60, command_id=c2)
        assert sorted([o1.accepted, o2.accepted]) == [False, True], (o1, o2)
        loser = o2 if o1.accepted else o1
        reason = loser.errors[0]["reason"]
        assert "closes a cycle through other submissions" in reason
        assert {f"{k1}/x", f"{k2}/y"} & set(reason.replace(" -> ", " ").split()), reason


def test_a_copy_at_another_node_returns_the_same_ids_and_admits_nothing_new(bare: Stack, workers: Workers) -> None:
    s = bare.settings
    a, b, a_parts = workers.start_pair()
    client = Client(s)
    sub = doc(f"copy-{uuid.uuid4().hex[:8]}", 3)
    first = produce_to(bare, sub, min(a_parts))
    second = produce_to(bare, sub, min(set(range(s.partitions)) - a_parts))
    sid = submission_id_for(TENANT, sub.idempotency_key, first)
    o1 = client.wait_outcome(sid, 60, command_id=first)
    wait_until(lambda: decisions(bare)[0][second] == 1, 60, "the second copy decided")
    o2 = client.wait_outcome(sid, 60, command_id=second)
    assert o1.accepted and o2.accepted and o1.task_ids == o2.task_ids
    with psycopg.connect(s.dsn, autocommit=True) as conn:
        n = conn.execute("SELECT count(*) FROM tasks WHERE submission_id = %s", (sid,)).fetchone()
    assert n is not None and n[0] == 3


def test_cluster_command_shows_members_partitions_and_a_death(bare: Stack, workers: Workers) -> None:
    s = bare.settings
    a, b, _ = workers.start_pair()
    victim = workers.procs[b]

    def shown() -> dict[str, Any] | None:
        out = json.loads(bare.cli("cluster", "--json").stdout)
        live = {m["member"]: m for m in out["members"] if m["alive"]}
        return (
            out
            if len(live) == 2 and sorted(p for m in live.values() for p in m["owned"]) == list(range(s.partitions))
            else None
        )

    out = wait_until(shown, 30, "two live members sharing every partition")
    assert all("backlog" in p for p in out["partitions"])
    text = bare.cli("cluster").stdout
    assert f"admission-{a}" in text and f"admission-{b}" in text
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)

    def taken_over() -> dict[str, Any] | None:
        out = json.loads(bare.cli("cluster", "--json").stdout)
        live = [m for m in out["members"] if m["alive"]]
        return out if len(live) == 1 and sorted(live[0]["owned"]) == list(range(s.partitions)) else None

    out = wait_until(taken_over, 30, "the survivor to own every partition")
    dead = [m for m in out["members"] if not m["alive"]]
    assert any(m["member"].endswith(f"admission-{b}") for m in dead)


def test_a_reference_that_is_never_admitted_cancels_its_dependents(bare: Stack, workers: Workers) -> None:
    """The rule for dependencies on tasks that do not exist: the dependent waits for the task to be
    admitted, up to reference_wait_ms (4 s on this stack), and is then cancelled with that reason."""
    s = bare.settings
    workers.start(0)
    workers.wait_ready(0)
    client = Client(s)
    key = f"orphan-{uuid.uuid4().hex[:8]}"
    sub = parse_document(
        {
            "tenant": TENANT,
            "idempotency_key": key,
            "tasks": [
                {"name": "waits", "argv": ["true"], "dependencies": ["never-sent/anything"]},
                {"name": "after", "argv": ["true"], "dependencies": ["waits"]},
            ],
        }
    )
    cid, sid = client.submit(sub)
    out = client.wait_outcome(sid, 60, command_id=cid)
    assert out.accepted

    def cancelled() -> list[Any] | None:
        with psycopg.connect(s.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT name, status, reason FROM tasks WHERE submission_id = %s ORDER BY name", (sid,)
            ).fetchall()
        return rows if len(rows) == 2 and all(x[1] == "CANCELLED" for x in rows) else None

    rows = wait_until(cancelled, 60, "both tasks cancelled")
    waits = dict((n, why) for n, _, why in rows)["waits"]
    missing = reference_id(TENANT, "never-sent", "anything")
    assert waits == f"prerequisite {missing} was not admitted within 4s", waits


def test_a_cycle_through_tasks_admitted_earlier_is_rejected_and_references_run_in_order(
    bare: Stack, workers: Workers
) -> None:
    s = bare.settings
    workers.start(0)
    workers.wait_ready(0)
    client = Client(s)
    run = uuid.uuid4().hex[:6]
    k1, k2 = f"early-{run}", f"late-{run}"

    def submit(key: str, tasks: list[dict[str, Any]]) -> Any:
        sub = parse_document({"tenant": TENANT, "idempotency_key": key, "tasks": tasks})
        cid, sid = client.submit(sub)
        out = client.wait_outcome(sid, 60, command_id=cid)  # read from the events topic
        with Client(s) as other:  # never sent it, so it looks the decision up in PostgreSQL
            assert other.wait_outcome(sid, 60, command_id=cid) == out
        return out

    # k1 waits for a task of k2 that does not exist yet
    first = submit(
        k1,
        [
            {"name": "a", "argv": ["true"], "dependencies": [f"{k2}/b"]},
            {"name": "a2", "argv": ["true"], "dependencies": ["a"]},
        ],
    )
    assert first.accepted
    # k2 would close b -> k1/a2 -> k1/a -> b through the tasks admitted earlier
    bad = submit(k2, [{"name": "b", "argv": ["true"], "dependencies": [f"{k1}/a2"]}])
    assert not bad.accepted
    assert bad.errors == [
        {
            "task": "b",
            "field": "dependencies",
            "reason": f"closes a cycle through other submissions: b -> {k1}/a2 -> {k1}/a -> b",
        }
    ]
    # the rejection admitted nothing and did not use the key up: the fixed k2 is admitted, and runs first
    good = submit(k2, [{"name": "b", "argv": ["true"]}])
    assert good.accepted and good.task_ids["b"] == reference_id(TENANT, k2, "b")

    def ended() -> dict[str, Any] | None:
        with psycopg.connect(s.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT name, status, started_at FROM tasks WHERE task_id = ANY(%s::uuid[])",
                ([*first.task_ids.values(), good.task_ids["b"]],),
            ).fetchall()
        return (
            {n: (st, at) for n, st, at in rows} if len(rows) == 3 and all(x[1] == "SUCCEEDED" for x in rows) else None
        )

    done = wait_until(ended, 90, "all three tasks to succeed")
    assert done["b"][1] < done["a"][1] < done["a2"][1]
