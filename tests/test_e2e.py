"""End to end on the embedded stack: a DAG produced to the commands topic the way an outside program
would, run to completion in dependency order, checked in the event log, PostgreSQL and the graph."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from taskstream.projections.graph_service import graph_queries
from taskstream.schemas.records import ClaimRequest, PrerequisiteEnded, WatchPrerequisite, task_events

from taskstream.core.submission import submission_id_for
from tests.conftest import Stack, wait_until

pytestmark = [pytest.mark.stack, pytest.mark.fallback]


def task(name: str, code: str, deps: list[str] = (), **extra: Any) -> dict[str, Any]:  # type: ignore[assignment]
    """A TaskSpec as a plain dict, the way any Avro producer builds it."""
    return {
        "name": name,
        "tenant": "acme",
        "argv": ["python3", "-c", code],
        "env": {},
        "working_dir": None,
        "resources": {"cpu": 0.5, "memory_mb": 64, "gpu": 0},
        "execution_cap_ms": 60_000,
        "retry_limit": 0,
        "backoff": {"initial_ms": 200, "factor": 2.0, "max_ms": 1000, "jitter": 0.0},
        "delay_tolerance_ms": 0,
        "priority": 0,
        "dependencies": list(deps),
        "not_before_ms": None,
        "labels": {},
        **extra,
    }


class Commands:
    """Avro commands produced with confluent-kafka and the registry's latest schema, nothing of ours:
    one serializer and one producer for many commands, flushed by `flush`."""

    def __init__(self, stack: Stack) -> None:
        s = stack.settings
        self.topic = s.topic("commands")
        registry = SchemaRegistryClient({"url": s.registry})
        latest = registry.get_latest_version(f"{self.topic}-value")
        self.ser = AvroSerializer(
            registry, latest.schema.schema_str, conf={"auto.register.schemas": False, "use.latest.version": True}
        )
        self.producer = Producer({"bootstrap.servers": s.bootstrap, "linger.ms": 5})

    def send(self, body_type: str, body: dict[str, Any], key: str | None = None) -> str:
        """Produce one command, keyed by its id unless `key` is given."""
        command_id = str(uuid.uuid4())
        value = self.ser(
            {
                "command_id": command_id,
                "issued_ms": int(time.time() * 1000),
                "issuer": "outside-program",
                "body": (f"io.taskstream.{body_type}", body),
            },
            SerializationContext(self.topic, MessageField.VALUE),
        )
        self.producer.produce(self.topic, key=(key or command_id).encode(), value=value)
        self.producer.poll(0)
        return command_id

    def flush(self) -> None:
        assert self.producer.flush(30) == 0


def produce_command(stack: Stack, body_type: str, body: dict[str, Any]) -> str:
    """Produce one Avro command (Commands) and wait until the broker has it."""
    commands = Commands(stack)
    command_id = commands.send(body_type, body)
    commands.flush()
    return command_id


def submission_of(stack: Stack, command_id: str, timeout: float = 90) -> tuple[str, str, dict[str, Any]]:
    def find() -> Any:
        with psycopg.connect(stack.settings.dsn, autocommit=True) as conn:
            return conn.execute(
                "SELECT submission_id::text, outcome, task_ids, errors FROM submissions WHERE command_id = %s",
                (command_id,),
            ).fetchone()

    sid, outcome, ids, errors = wait_until(find, timeout, f"the admission decision on {command_id}")
    return sid, outcome, {"task_ids": ids, "errors": errors}


def rows(stack: Stack, sid: str) -> dict[str, dict[str, Any]]:
    with (
        psycopg.connect(stack.settings.dsn, autocommit=True) as conn,
        conn.cursor(row_factory=psycopg.rows.dict_row) as cur,
    ):
        cur.execute("SELECT * FROM tasks WHERE submission_id = %s", (sid,))
        return {r["name"]: r for r in cur.fetchall()}


def attempts(stack: Stack, task_id: Any) -> list[dict[str, Any]]:
    with (
        psycopg.connect(stack.settings.dsn, autocommit=True) as conn,
        conn.cursor(row_factory=psycopg.rows.dict_row) as cur,
    ):
        cur.execute("SELECT * FROM attempts WHERE task_id = %s ORDER BY attempt", (task_id,))
        return cur.fetchall()


def all_terminal(stack: Stack, sid: str, n: int) -> dict[str, dict[str, Any]] | None:
    got = rows(stack, sid)
    terminal = {"SUCCEEDED", "DEAD_LETTERED", "CANCELLED", "REJECTED"}
    return got if len(got) == n and all(r["status"] in terminal for r in got.values()) else None


DIAMOND = {
    "root": [],
    "left": ["root"],
    "middle": ["root"],
    "right": ["root"],
    "join": ["left", "middle", "right"],
    "leaf-a": ["join"],
    "leaf-b": ["join"],
}


def test_an_outside_program_submits_a_dag_that_runs_in_dependency_order(stack: Stack) -> None:
    tasks = [task(name, f"print('{name} done')", deps) for name, deps in DIAMOND.items()]
    tasks[2] = task(
        "middle",
        "import os,sys; a=int(os.environ['TASKSTREAM_ATTEMPT']); print('try', a); sys.exit(0 if a > 1 else 5)",
        ["root"],
        retry_limit=1,
    )
    cid = produce_command(stack, "SubmitDag", {"tenant": "acme", "idempotency_key": None, "labels": {}, "tasks": tasks})
    sid, outcome, _ = submission_of(stack, cid)
    assert outcome == "ACCEPTED"
    done = wait_until(lambda: all_terminal(stack, sid, len(DIAMOND)), 120, "every task to end")
    assert {n: r["status"] for n, r in done.items()} == dict.fromkeys(DIAMOND, "SUCCEEDED")

    # PostgreSQL rows carry the submission and the runs
    by_id = {str(r["task_id"]): n for n, r in done.items()}
    for name, r in done.items():
        assert r["tenant"] == "acme" and r["argv"][:2] == ["python3", "-c"]
        assert sorted(by_id[str(d)] for d in r["dependencies"]) == sorted(DIAMOND[name])
    middle = attempts(stack, done["middle"]["task_id"])
    assert [(a["attempt"], a["outcome"], a["exit_code"]) for a in middle] == [(1, "FAILED", 5), (2, "SUCCEEDED", 0)]
    assert "try 2" in middle[1]["output_tail"]

    # order: no task started before every prerequisite had finished
    runs = {n: attempts(stack, r["task_id"])[-1] for n, r in done.items()}
    for name, deps in DIAMOND.items():
        for d in deps:
            assert runs[name]["started_at"] >= runs[d]["ended_at"], f"{name} started before {d} ended"

    # the same order holds in the event log itself (audit reads the log, not a projection)
    starts, ends = {}, {}
    for name, r in done.items():
        out = stack.cli("audit", str(r["task_id"]), "--json")
        history = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
        kinds = [h["event"] for h in history]
        assert kinds[:2] == ["TaskSubmitted", "TaskAdmitted"] and kinds[-1] == "TaskSucceeded"
        assert [h["version"] for h in history] == list(range(1, len(history) + 1))
        starts[name] = max(h["event_time"] for h in history if h["event"] == "TaskStarted")
        ends[name] = max(h["event_time"] for h in history if h["event"] == "TaskSucceeded")
    for name, deps in DIAMOND.items():
        for d in deps:
            assert starts[name] >= ends[d]

    # the graph holds the same DAG: one node per task, one DEPENDS_ON edge per dependency
    graph = graph_queries(stack.settings)
    expected_edges = sorted(
        (str(done[n]["task_id"]), str(done[d]["task_id"])) for n, deps in DIAMOND.items() for d in deps
    )
    wait_until(lambda: sorted(graph.edges(sid)) == expected_edges, 60, "the graph's edges")
    wait_until(
        lambda: {st for _, _, st in graph.nodes(sid)} == {"SUCCEEDED"} and len(graph.nodes(sid)) == 7,
        60,
        "the graph's nodes to be succeeded",
    )
    root = str(done["root"]["task_id"])
    assert sorted(graph.blocks(root)) == sorted(str(r["task_id"]) for n, r in done.items() if n != "root")
    assert sorted(graph.needs(str(done["leaf-a"]["task_id"]))) == sorted(
        str(done[n]["task_id"]) for n in ("root", "left", "middle", "right", "join")
    )

    # the same questions through the CLI
    order = json.loads(stack.cli("graph", "order", sid, "--json").stdout)
    position = {by_id[t]: i for i, t in enumerate(order)}
    assert all(position[d] < position[n] for n, deps in DIAMOND.items() for d in deps)
    unblocked = json.loads(stack.cli("graph", "unblocked", str(done["join"]["task_id"]), "--json").stdout)
    assert sorted(by_id[t] for t in unblocked) == ["leaf-a", "leaf-b"]
    cycle = stack.cli("graph", "would-cycle", root, str(done["leaf-b"]["task_id"]), check=False)
    assert cycle.returncode == 1 and "closes a cycle" in cycle.stdout
    path = json.loads(
        stack.cli("graph", "would-cycle", root, str(done["leaf-b"]["task_id"]), "--json", check=False).stdout
    )["cycle"]
    names = [by_id[t] for t in path]
    assert names[:3] == ["root", "leaf-b", "join"] and names[3] in ("left", "middle", "right") and names[4:] == ["root"]
    fine = stack.cli("graph", "would-cycle", str(done["leaf-a"]["task_id"]), str(done["leaf-b"]["task_id"]))
    assert "no cycle" in fine.stdout

    # and the raw stream, as `taskstream tail` shows it to people writing consumers
    tail = stack.cli("tail", "--from-beginning", "--count", "5", "--json", timeout=60)
    rows = [json.loads(line) for line in tail.stdout.splitlines()]
    assert len(rows) == 5 and all({"event", "event_time", "log_time", "node"} <= set(r) for r in rows)

    # prerequisites knew their dependents from the packed admission: no task asked its prerequisites in
    # the same submission to watch it, and each prerequisite told each dependent that it ended
    signals = inputs_about(stack, set(by_id))
    asked = [x for x in signals if isinstance(x.body, WatchPrerequisite)]  # not the rechecks (":<n>")
    assert not [x for x in asked if x.input_id == f"{x.body.dependent}:watch:{x.task_id}"], asked
    ended = {(by_id[x.body.prerequisite], by_id[x.task_id]) for x in signals if isinstance(x.body, PrerequisiteEnded)}
    assert ended == {(d, n) for n, deps in DIAMOND.items() for d in deps}
    # the stack's one worker owns every partition and reads the only lane: its lifecycle claimed each
    # task for it as it queued it (LocalClaims), so no worker sent a claim request
    assert not [x for x in signals if isinstance(x.body, ClaimRequest)]


def inputs_about(stack: Stack, task_ids: set[str]) -> list[Any]:
    """Every committed record on the task-inputs topic addressed to one of `task_ids`, decoded."""
    from taskstream.connectors.kafka import consumer, make_codec
    from taskstream.connectors.reading import read_to_end
    from taskstream.schemas.records import task_inputs

    s = stack.settings
    codec = make_codec(s)
    c = consumer(s, f"inputs-{uuid.uuid4()}")
    try:
        starts = dict.fromkeys(range(s.partitions), 0)
        return [  # a worker's inputs sent together are one record (records.Inputs): unpacked
            one
            for m in read_to_end(c, s.topic("task-inputs"), starts, timeout=60)
            for one in task_inputs(codec.decode("input", m.value()))
            if one.task_id in task_ids
        ]
    finally:
        c.close()


def test_a_failed_task_dead_letters_and_its_dependents_end_cancelled(stack: Stack) -> None:
    tasks = [
        task("breaks", "import sys; print('no'); sys.exit(7)"),
        task("after", "print('never')", ["breaks"]),
        task("after-after", "print('never')", ["after"]),
    ]
    cid = produce_command(stack, "SubmitDag", {"tenant": "acme", "idempotency_key": None, "labels": {}, "tasks": tasks})
    sid, outcome, _ = submission_of(stack, cid)
    assert outcome == "ACCEPTED"
    done = wait_until(lambda: all_terminal(stack, sid, 3), 90, "every task to end")
    assert done["breaks"]["status"] == "DEAD_LETTERED" and done["breaks"]["exit_code"] == 7
    assert done["after"]["status"] == "CANCELLED"
    assert done["after"]["reason"] == f"prerequisite {done['breaks']['task_id']} ended dead_lettered"
    assert done["after-after"]["status"] == "CANCELLED"
    assert attempts(stack, done["after"]["task_id"]) == []  # never ran


def test_nonsense_values_become_a_rejection_that_names_the_field(stack: Stack) -> None:
    tasks = [
        task("a", "pass", ["c"]),
        task("b", "pass", ["a"]),
        task("c", "pass", ["b"]),
        task("d", "pass", resources={"cpu": -1.0, "memory_mb": 64, "gpu": 0}),
    ]
    cid = produce_command(stack, "SubmitDag", {"tenant": "acme", "idempotency_key": None, "labels": {}, "tasks": tasks})
    sid, outcome, extra = submission_of(stack, cid)
    assert outcome == "REJECTED"
    problems = {(p["task"], p["field"]) for p in extra["errors"]}
    assert ("d", "resources.cpu") in problems
    assert rows(stack, sid) == {}  # nothing of a rejected submission is admitted


def test_undecodable_commands_go_to_the_dead_letter_topic_and_nothing_stalls(stack: Stack) -> None:
    s = stack.settings
    p = Producer({"bootstrap.servers": s.bootstrap})
    marker = uuid.uuid4().hex.encode()
    p.produce(s.topic("commands"), key=marker, value=b"not avro at all")
    p.produce(s.topic("commands"), key=marker, value=b"\x00\x00\x00\x7f\xffgarbage")  # unknown schema id
    assert p.flush(30) == 0
    c = Consumer(
        {"bootstrap.servers": s.bootstrap, "group.id": f"t-{marker.decode()}", "auto.offset.reset": "earliest"}
    )
    c.subscribe([s.topic("dead-letters")])
    found: list[Any] = []

    def mine() -> bool:
        for m in c.consume(100, 0.5):
            if not m.error() and m.key() == marker:
                found.append(m)
        return len(found) >= 2

    try:
        wait_until(mine, 60, "two dead letters")
    finally:
        c.close()
    reasons = sorted(dict(m.headers())["taskstream.error"].decode() for m in found)
    assert any("magic byte" in r for r in reasons)
    assert any("schema id 2147483647" in r or "not known to the registry" in r for r in reasons)
    assert sorted(m.value() for m in found) == sorted([b"not avro at all", b"\x00\x00\x00\x7f\xffgarbage"])

    def projected() -> list[Any]:
        with psycopg.connect(s.dsn, autocommit=True) as conn:
            return conn.execute(
                "SELECT source_topic, detected_by, reason, value FROM dead_letters WHERE key = %s "
                "ORDER BY source_offset",
                (marker,),
            ).fetchall()

    dl = wait_until(lambda: len(projected()) == 2 and projected(), 60, "dead letters in PostgreSQL")
    assert {(t, by) for t, by, _, _ in dl} == {(s.topic("commands"), "admission")}
    assert "magic byte 110 is not 0" in dl[0][2] and bytes(dl[0][3]) == b"not avro at all"
    # and a normal submission still goes through
    cid = produce_command(
        stack,
        "SubmitDag",
        {"tenant": "acme", "idempotency_key": None, "labels": {}, "tasks": [task("fine", "print(1)")]},
    )
    sid, outcome, _ = submission_of(stack, cid)
    assert outcome == "ACCEPTED"
    wait_until(lambda: all_terminal(stack, sid, 1), 60, "the task to end")


def test_resubmitting_with_the_same_idempotency_key_admits_nothing_new(stack: Stack) -> None:
    key = f"nightly-{uuid.uuid4().hex[:8]}"
    body = {"tenant": "acme", "idempotency_key": key, "labels": {}, "tasks": [task("once", "print('ran')")]}
    sid1, outcome1, extra1 = submission_of(stack, produce_command(stack, "SubmitDag", body))
    assert sid1 == submission_id_for("acme", key, "any command")
    wait_until(lambda: all_terminal(stack, sid1, 1), 60, "the task to end")
    produce_command(stack, "SubmitDag", body)  # the same submission again, as a new command
    time.sleep(2)  # give a wrongly admitted copy time to show up
    got = rows(stack, sid1)
    assert list(got) == ["once"] and got["once"]["status"] == "SUCCEEDED"
    assert len(attempts(stack, got["once"]["task_id"])) == 1  # it ran once


def test_many_submissions_sent_at_once_are_each_decided_and_run(stack: Stack) -> None:
    """Client.submit_many: one wait for the broker for all of them; each is decided as its own
    submission, and comes back in the order sent."""
    from taskstream.core.submission import parse_document
    from taskstream.sdk import Client

    tag = uuid.uuid4().hex[:6]
    docs = [{"tenant": "acme", "tasks": [{"name": f"{tag}-{i}", "call": "os:getpid"}]} for i in range(6)]
    with Client(stack.settings, issuer="test") as client:
        sent = client.submit_many(parse_document(d) for d in docs)
        assert len({sid for _, sid in sent}) == 6
        outcomes = [client.wait_outcome(sid, 60, cid) for cid, sid in sent]
    assert [o.accepted for o in outcomes] == [True] * 6
    for i, (_, sid) in enumerate(sent):
        got = wait_until(lambda sid=sid: all_terminal(stack, sid, 1), 60, f"submission {i} to end")
        assert list(got) == [f"{tag}-{i}"] and got[f"{tag}-{i}"]["status"] == "SUCCEEDED"


def test_one_task_submissions_decided_together_share_admission_records_and_keep_their_own_submission(
    stack: Stack,
) -> None:
    """24 one-task submissions produced at once to one commands partition are decided in one take, whose
    tasks are admitted packed per events partition (a TasksAdmitted holding several submissions'
    tasks); the owners, PostgreSQL, the graph and the audit each still see every task as its own
    submission's, and every task runs once."""
    from taskstream.connectors.audit import task_history
    from taskstream.connectors.kafka import make_codec
    from taskstream.schemas.records import TasksAdmitted

    s = stack.settings
    tag = uuid.uuid4().hex[:6]
    commands = Commands(stack)
    cids = [
        commands.send(
            "SubmitDag",
            {
                "tenant": "acme",
                "idempotency_key": f"{tag}-{i}",
                "labels": {},
                "tasks": [task(f"{tag}-{i}", "", argv=["true"])],
            },
            key=f"shared-{tag}",
        )
        for i in range(24)
    ]
    commands.flush()
    decided = [submission_of(stack, cid) for cid in cids]
    assert [outcome for _, outcome, _ in decided] == ["ACCEPTED"] * 24
    sids = [sid for sid, _, _ in decided]
    for i, sid in enumerate(sids):
        got = wait_until(lambda sid=sid: all_terminal(stack, sid, 1), 90, f"submission {i} to end")
        assert list(got) == [f"{tag}-{i}"] and got[f"{tag}-{i}"]["status"] == "SUCCEEDED"
        assert len(attempts(stack, got[f"{tag}-{i}"]["task_id"])) == 1
    task_of = {sid: str(rows(stack, sid)[f"{tag}-{i}"]["task_id"]) for i, sid in enumerate(sids)}

    codec = make_codec(s)
    c = Consumer({"bootstrap.servers": s.bootstrap, "group.id": f"p-{uuid.uuid4()}", "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed"})  # fmt: skip
    c.subscribe([s.topic("events")])
    shared: list[set[str]] = []  # per TasksAdmitted holding our tasks: the submissions of those tasks
    admitted: dict[str, str] = {}  # task id -> the submission its TaskSubmitted names

    def read() -> bool:
        for m in c.consume(500, 0.5):
            if m.error() or dict(m.headers() or ()).get("taskstream.event") != b"TasksAdmitted":
                continue
            rec = codec.decode("event", m.value())
            assert isinstance(rec.payload, TasksAdmitted)
            ours = {x.task_id: x.payload.submission_id for x in task_events(rec) if x.kind == "TaskSubmitted"}
            ours = {t: sub for t, sub in ours.items() if sub in task_of}
            if ours:
                shared.append(set(ours.values()))
                admitted.update(ours)
        return len(admitted) == 24

    try:
        wait_until(read, 60, "every task's admission in the log")
    finally:
        c.close()
    assert admitted == {t: sid for sid, t in task_of.items()}
    assert any(len(subs) > 1 for subs in shared), f"no admission record shared by two submissions: {shared}"
    assert len(shared) < 24, "24 submissions of one take in 24 records"

    graph = graph_queries(s)
    for sid, t in task_of.items():
        assert [n[0] for n in wait_until(lambda sid=sid: graph.nodes(sid) or None, 60, "the graph")] == [t]
    last = sids[-1]
    history = task_history(s, task_of[last])
    submitted = [h for h in history if h["event"] == "TaskSubmitted"]
    assert len(submitted) == 1 and submitted[0]["submission_id"] == last, history


def test_submissions_sent_one_call_each_reuse_the_partition_end_and_each_decision_is_found(stack: Stack) -> None:
    """Client.submit one at a time: the end of a decision's partition learnt for one send is taken again
    for the next within END_REUSE_S (no broker round trip each), and an earlier end still finds every
    decision (the client reads on from it to the decision with its command id)."""
    from taskstream.core.submission import parse_document
    from taskstream.sdk import Client

    class Counted:  # the client's reader, its end-offset queries (broker round trips) counted
        def __init__(self, reader: Any) -> None:
            self.reader, self.queries = reader, 0

        def get_watermark_offsets(self, *args: Any, **kwargs: Any) -> Any:
            self.queries += 1
            return self.reader.get_watermark_offsets(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.reader, name)

    tag = uuid.uuid4().hex[:6]
    docs = [{"tenant": "acme", "tasks": [{"name": f"{tag}-{i}", "call": "os:getpid"}]} for i in range(12)]
    with Client(stack.settings, issuer="test") as client:
        sent = [client.submit(parse_document(docs[0]))]
        counted = client._reader = Counted(client._reader)
        sent += [client.submit(parse_document(d)) for d in docs[1:]]
        outcomes = [client.wait_outcome(sid, 60, cid) for cid, sid in sent]
    assert not any(cid in client._marks for cid, _ in sent), "a decision was not read on from its mark"
    assert counted.queries < 11, f"{counted.queries} end-offset queries for 11 sends one after another"
    assert [o.accepted for o in outcomes] == [True] * 12
    assert sorted(n for o in outcomes for n in o.task_ids) == sorted(f"{tag}-{i}" for i in range(12))


def test_a_task_queued_again_after_it_ran_is_not_run_again_and_holds_up_nothing(stack: Stack) -> None:
    """A queue record seen twice (a task queued again by the requeue timer, or a duplicate) is skipped
    by the worker that claimed it: the task runs once, and the worker's executors are free at once
    for other work (a repeat of the winning claim gets no verdict from the owner)."""
    from taskstream.connectors.kafka import make_codec, producer
    from taskstream.schemas.records import QueuedTask

    from taskstream.core.submission import parse_document

    tag = uuid.uuid4().hex[:6]
    cid = produce_command(stack, "SubmitDag", {"tenant": "acme", "idempotency_key": None, "labels": {},
                                               "tasks": [task(f"{tag}-once", "print('ran')")]})  # fmt: skip
    sid, outcome, _ = submission_of(stack, cid)
    assert outcome == "ACCEPTED"
    done = wait_until(lambda: all_terminal(stack, sid, 1), 60, "the task to end")
    tid = str(done[f"{tag}-once"]["task_id"])
    spec = parse_document({"tenant": "acme", "tasks": [{"name": f"{tag}-once", "argv": ["true"]}]}).tasks[0]
    codec, prod = make_codec(stack.settings), producer(stack.settings)
    for _ in range(stack.settings.worker_slots + stack.settings.claim_ahead + 2):  # more than its executors
        again = codec.encode(QueuedTask(tid, 1, "default", 0, spec))
        prod.produce(stack.settings.topic("queue"), key=tid.encode(), value=again)
    assert prod.flush(30) == 0
    cid = produce_command(stack, "SubmitDag", {"tenant": "acme", "idempotency_key": None, "labels": {},
                                               "tasks": [task(f"{tag}-after", "print('ran')")]})  # fmt: skip
    sid2, _, _ = submission_of(stack, cid)
    # without the skip each repeat holds an executor until its claim is given up (60 s and more)
    after = wait_until(lambda: all_terminal(stack, sid2, 1), 30, "a task submitted after the repeats to end")
    assert after[f"{tag}-after"]["status"] == "SUCCEEDED"
    assert len(attempts(stack, tid)) == 1  # it ran once


def test_a_task_over_its_execution_cap_is_killed(stack: Stack) -> None:
    tasks = [task("sleeper", "import time; print('sleeping', flush=True); time.sleep(120)", execution_cap_ms=1500)]
    cid = produce_command(stack, "SubmitDag", {"tenant": "acme", "idempotency_key": None, "labels": {}, "tasks": tasks})
    sid, _, _ = submission_of(stack, cid)
    started = time.monotonic()
    done = wait_until(lambda: all_terminal(stack, sid, 1), 60, "the sleeper to be killed")
    assert time.monotonic() - started < 60
    row = done["sleeper"]
    assert row["status"] == "DEAD_LETTERED"
    (run,) = attempts(stack, row["task_id"])
    assert run["outcome"] == "FAILED" and run["reason"] == "killed: ran over its execution cap of 1.5s"
    assert "sleeping" in run["output_tail"]
    assert 1500 <= run["duration_ms"] < 1500 + 5000 + 2000  # cap + SIGTERM grace + slack


def test_every_event_names_its_kind_in_a_header(stack: Stack) -> None:
    """Consumers can skip events they don't need without decoding them."""
    from taskstream.connectors.kafka import make_codec

    s = stack.settings
    cid = produce_command(
        stack,
        "SubmitDag",
        {"tenant": "acme", "idempotency_key": None, "labels": {}, "tasks": [task("labelled", "print(1)")]},
    )
    sid, _, _ = submission_of(stack, cid)
    wait_until(lambda: all_terminal(stack, sid, 1), 60, "the task to end")
    codec = make_codec(s)
    c = Consumer({"bootstrap.servers": s.bootstrap, "group.id": f"h-{uuid.uuid4()}", "auto.offset.reset": "earliest"})
    c.subscribe([s.topic("events")])
    seen: dict[str, tuple[str, str, tuple[str | None, str | None]]] = {}
    try:

        def read() -> bool:
            for m in c.consume(500, 0.5):
                if m.error():
                    continue
                rec = codec.decode("event", m.value())
                headers = {k: v.decode() for k, v in m.headers() or []}  # type: ignore[union-attr,str-unpack]
                members = task_events(rec) if rec.kind == "TaskEvents" else [rec]
                if any(x.submission_id == sid for x in members):
                    kinds = ",".join(sorted({x.kind for x in members})) if rec.kind == "TaskEvents" else None
                    seen[rec.event_id] = (
                        headers["taskstream.event"],
                        rec.kind,
                        (headers.get("taskstream.kinds"), kinds),
                    )
                    done.update(x.kind for x in members if x.submission_id == sid)
            return "TaskSucceeded" in done

        done: set[str] = set()
        wait_until(read, 60, "the submission's events")
    finally:
        c.close()
    assert all(header == kind for header, kind, _ in seen.values()), seen
    for rec_id, (_, _, (named, kinds)) in seen.items():  # a packed record also names its members' kinds
        assert named == kinds, (rec_id, named, kinds)


@pytest.mark.big_history
def test_a_large_dag_is_admitted_whole_and_both_projections_show_every_node_and_edge(stack: Stack) -> None:
    """4,000 tasks (a ~350 KB command, ~1.5 MB of packed admission records): large enough for the paths
    that stop fetching while a big batch is decided or applied, and for several packed records per
    partition."""
    import random

    from taskstream.core.model import TaskSpec
    from taskstream.core.submission import Submission
    from taskstream.sdk import Client

    rng = random.Random(11)
    n = 4000
    later = int(time.time() * 1000) + 86_400_000  # nothing runs during the test
    specs = tuple(
        TaskSpec(f"t{i}", "bulk", ("true",), dependencies=tuple(sorted({f"t{rng.randrange(i)}" for _ in range(3)}))
                 if i else (), not_before_ms=later)
        for i in range(n)
    )  # fmt: skip
    edges = sum(len(s.dependencies) for s in specs)
    with Client(stack.settings, issuer="test") as client:
        cid, sid = client.submit(Submission("bulk", specs, idempotency_key=f"bulk-{uuid.uuid4()}"))
        out = client.wait_outcome(sid, 120, command_id=cid)
    assert out.accepted and len(out.task_ids) == n
    with psycopg.connect(stack.settings.dsn, autocommit=True) as conn:

        def projected() -> bool:
            row = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE status = 'WAITING') FROM tasks WHERE submission_id = %s",
                (sid,),
            ).fetchone()
            return row is not None and row[0] == row[1] == n  # all admitted, waiting for their start time

        wait_until(projected, 120, "every task in PostgreSQL")
        ids = {str(t) for (t,) in conn.execute("SELECT task_id FROM tasks WHERE submission_id = %s", (sid,))}
    assert ids == set(out.task_ids.values())
    graph = graph_queries(stack.settings)
    wait_until(lambda: graph.counts(sid) == {"nodes": n, "edges": edges}, 120, "every node and edge in the graph")


def batcher_gate(stack: Stack) -> Any:
    """The batcher's gate as last published on the workers topic (None: not yet)."""
    from taskstream.connectors.kafka import consumer
    from taskstream.connectors.reading import read_to_end
    from taskstream.streams.batcher import GATE_KEY, gate_of

    c = consumer(stack.settings, f"gate-{uuid.uuid4()}")
    try:
        said = [m.value() for m in read_to_end(c, stack.settings.topic("workers"), {0: 0}) if m.key() == GATE_KEY]
    finally:
        c.close()
    return gate_of(json.loads(said[-1])) if said else None


def test_ready_tasks_skip_the_batcher_s_round_while_it_has_room_but_never_those_of_a_capped_tenant(
    stack: Stack,
) -> None:
    """While the batcher's last round left room unused, each task of a chain is queued and claimed by its
    owner in the write that makes it ready: no Promote reaches it, and the chain runs in order. The
    tasks of a tenant with a cap of 1 each wait READY for a round's Promote, and never two of them are
    queued, claimed or running at once."""
    from taskstream.schemas import records as r

    from taskstream.core import events as e
    from taskstream.core.submission import parse_document
    from taskstream.sdk import Client
    from tests.test_batcher import most_at_once
    from tests.test_dispatch import history

    stack.cli("tenants", "set", "capped1", "--tier", "free", "--max-running", "1")
    stack.cli("tenants", "set", "chains", "--tier", "standard")
    wait_until(lambda: (g := batcher_gate(stack)) is not None and g.open and "chains" in g.uncapped, 60,
               "the batcher's gate open to tenant chains")  # fmt: skip
    assert "capped1" not in batcher_gate(stack).uncapped
    chain = [{"name": f"c{i}", "call": "os:getpid", "dependencies": [f"c{i - 1}"] if i else []} for i in range(6)]
    capped = [{"name": f"k{i}", "call": "time:sleep", "args": [0.3]} for i in range(3)]
    ids: dict[str, str] = {}
    with Client(stack.settings) as client:
        for tenant, tasks in (("chains", chain), ("capped1", capped)):
            cid, sid = client.submit(parse_document({"tenant": tenant, "tasks": tasks}))
            out = client.wait_outcome(sid, 60, command_id=cid)
            assert out.accepted, out
            ids.update({name: tid for name, tid in out.task_ids.items()})
    log: dict[str, list[r.EventRecord]] = {}

    def ended() -> bool:
        log.update(history(stack, set(ids.values())))
        return all(any(isinstance(ev.payload, e.TaskSucceeded) for ev in log[t]) for t in ids.values())

    wait_until(ended, 120, "every task to succeed")
    promoted = {x.task_id for x in inputs_about(stack, set(ids.values())) if isinstance(x.body, r.Promote)}

    def at(name: str, kind: type) -> int:
        return next(ev.event_ms for ev in log[ids[name]] if isinstance(ev.payload, kind))

    for i in range(6):
        name = f"c{i}"
        kinds = [type(ev.payload).__name__ for ev in log[ids[name]]]
        step = kinds.index("TaskReady")
        assert kinds[step : step + 3] == ["TaskReady", "TaskQueued", "TaskClaimed"], (name, kinds)
        assert at(name, e.TaskReady) == at(name, e.TaskClaimed), name  # decided in one step
        assert ids[name] not in promoted, name
        if i:
            assert at(name, e.TaskStarted) >= at(f"c{i - 1}", e.TaskSucceeded), name
    for i in range(3):
        assert ids[f"k{i}"] in promoted  # each waited for a round
        assert at(f"k{i}", e.TaskQueued) > at(f"k{i}", e.TaskReady)
    spans = [(at(f"k{i}", e.TaskQueued), at(f"k{i}", e.TaskSucceeded), 1.0) for i in range(3)]
    assert most_at_once(spans) == 1, spans


def test_the_workers_group_commits_past_every_admission_its_lifecycle_has_read(stack: Stack) -> None:
    """600 one-task submissions at 100/s, each its own admission transaction: on the events topic each
    admission the lifecycle reads comes after a gap (the transaction's marker, the lifecycle's own
    writing it leaves out). Once every task has succeeded, the workers' group commits past the last
    record the lifecycle acts on in each partition within seconds. With Faust 0.15.3's commits alone
    it fell behind by a repeated offset per commit (connectors/faust_patches.commit_past_gaps_at_once):
    at 100/s, ~2,100 records a partition after 20 s, which took minutes to catch up on once idle."""
    from taskstream.connectors.kafka import consumer, faust_app_id
    from taskstream.connectors.reading import end_offsets, read_to_end
    from taskstream.streams.lifecycle import not_for_the_lifecycle

    from taskstream.core.submission import parse_document
    from taskstream.sdk import Client

    s = stack.settings
    tag, n, rate = uuid.uuid4().hex[:6], 600, 100.0
    with Client(s, issuer="test") as client:
        start = time.monotonic()
        for i in range(n):  # open loop: each sent at its time, however long the one before took
            time.sleep(max(0.0, start + i / rate - time.monotonic()))
            doc = {"tenant": "acme", "tasks": [{"name": f"{tag}-{i}", "call": "os:getpid"}]}
            client.submit_many([parse_document(doc)])
    with psycopg.connect(s.dsn, autocommit=True) as conn:
        ended = "SELECT count(*) FROM tasks WHERE name LIKE %s AND status = 'SUCCEEDED'"
        wait_until(lambda: conn.execute(ended, (f"{tag}-%",)).fetchone()[0] == n, 120, "every task to succeed")  # type: ignore[index]
    topic = s.topic("events")
    reader = consumer(s, f"test-{tag}")
    try:
        partitions = sorted(end_offsets(reader, topic, list(range(s.partitions))))
        last: dict[int, int] = {}
        for m in read_to_end(reader, topic, dict.fromkeys(partitions, 0)):
            if not not_for_the_lifecycle(m.headers()):
                last[m.partition()] = m.offset()
    finally:
        reader.close()
    group = Consumer({"bootstrap.servers": s.bootstrap, "group.id": faust_app_id(s), "enable.auto.commit": False})
    try:

        def committed() -> dict[int, int]:
            tps = [TopicPartition(topic, p) for p in sorted(last)]
            return {tp.partition: tp.offset for tp in group.committed(tps, timeout=10)}

        wait_until(
            lambda: all(committed()[p] > offset for p, offset in last.items()),
            5,
            "the workers' group to commit past the last admission of each events partition",
            every=0.5,
            show=lambda: {"committed": committed(), "last admission": last},
        )
    finally:
        group.close()
