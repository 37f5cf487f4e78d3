"""Reading to the end of a partition (connectors/reading.py), on both brokers: a log that ends on a
transaction's commit or abort marker, or on an open transaction, ends the read; `taskstream audit` of a
task whose partition ends on a marker comes back (it used to spin until another record landed)."""

from __future__ import annotations

import json
import time
import uuid

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic
from taskstream.connectors.kafka import admin, consumer
from taskstream.connectors.partitioning import partition_for
from taskstream.connectors.reading import end_offsets, read_to_end, records_between

from tests.conftest import ROOT, Stack

pytestmark = [pytest.mark.stack, pytest.mark.fallback]


def fresh_topic(stack: Stack) -> str:
    name = f"reading-{uuid.uuid4().hex[:8]}"
    client = admin(stack.settings)
    client.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    return name


def transactional(stack: Stack) -> Producer:
    p = Producer({"bootstrap.servers": stack.settings.bootstrap, "transactional.id": f"t-{uuid.uuid4()}"})
    p.init_transactions(30)
    return p


def read(stack: Stack, topic: str, start: int = 0, timeout: float = 20) -> tuple[list[bytes], float]:
    c = consumer(stack.settings, f"reading-{uuid.uuid4()}")
    t0 = time.monotonic()
    try:
        values = [m.value() for m in read_to_end(c, topic, {0: start}, timeout=timeout)]
    finally:
        c.close()
    return values, time.monotonic() - t0


def test_a_log_ending_on_a_commit_marker_is_read_to_its_end(stack: Stack) -> None:
    topic = fresh_topic(stack)
    p = transactional(stack)
    p.begin_transaction()
    for v in (b"a", b"b"):
        p.produce(topic, v)
    p.commit_transaction(30)  # the log is now a, b, commit marker
    values, took = read(stack, topic)
    assert values == [b"a", b"b"]
    assert took < 10, f"the read took {took:.1f}s: it waited for a record after the marker"


def test_aborted_records_and_their_marker_at_the_end_are_skipped(stack: Stack) -> None:
    topic = fresh_topic(stack)
    p = transactional(stack)
    p.begin_transaction()
    p.produce(topic, b"kept")
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(topic, b"aborted")
    p.flush(10)
    p.abort_transaction(30)
    values, took = read(stack, topic)
    assert values == [b"kept"] and took < 10


def test_an_open_transaction_at_the_end_does_not_hold_the_read(stack: Stack) -> None:
    topic = fresh_topic(stack)
    p = transactional(stack)
    p.begin_transaction()
    p.produce(topic, b"committed")
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(topic, b"not yet")
    p.flush(10)
    try:
        values, took = read(stack, topic)
        assert values == [b"committed"] and took < 10  # the end a read_committed reader has: the stable offset
    finally:
        p.abort_transaction(30)


def test_markers_are_not_counted_as_records_behind(stack: Stack) -> None:
    topic = fresh_topic(stack)
    p = transactional(stack)
    for _ in range(3):
        p.begin_transaction()
        p.produce(topic, b"x")
        p.commit_transaction(30)
    c = consumer(stack.settings, f"reading-{uuid.uuid4()}")
    try:
        end = end_offsets(c, topic, [0])[0]
        assert end == 6  # three records, three markers
        assert records_between(c, topic, 0, 0, end) == 3
        assert records_between(c, topic, 0, 5, end) == 0  # a checkpoint after the last record: not behind
        assert list(read_to_end(c, topic, {0: end})) == []
    finally:
        c.close()


def test_audit_of_a_task_whose_partition_ends_on_a_marker_comes_back(stack: Stack) -> None:
    out = stack.cli("submit", str(ROOT / "examples" / "hello.yaml"), "--follow", "--timeout", "90")
    sid = out.stdout.split("accepted submission ")[1].split(":")[0]
    with psycopg.connect(stack.settings.dsn) as conn:
        row = conn.execute("SELECT task_id::text FROM tasks WHERE submission_id = %s", (sid,)).fetchone()
    assert row is not None
    task_id = row[0]
    # end the task's events partition on an abort marker: an aborted record nobody can see, then the marker
    s = stack.settings
    part = partition_for(task_id.encode(), s.partitions)
    p = transactional(stack)
    p.begin_transaction()
    p.produce(s.topic("events"), b"invisible", key=b"reading-test", partition=part)
    p.flush(10)
    p.abort_transaction(30)
    t0 = time.monotonic()
    audit = stack.cli("audit", task_id, "--json", timeout=60)
    assert time.monotonic() - t0 < 30
    events = [json.loads(line)["event"] for line in audit.stdout.splitlines() if line.startswith("{")]
    assert events[:2] == ["TaskSubmitted", "TaskAdmitted"] and events[-1] == "TaskSucceeded", events
