"""Invariant 7 under fire: thousands of bad commands on the commands topic. Undecodable bytes and unknown
schema ids must reach the dead-letter topic with the reason; valid Avro with nonsensical values must
become a decision (accepted or rejected) per command; the agents keep going; a normal DAG still runs.

Fuzzed submissions that happen to be valid must not run anything: their tasks run `true` and start a
day from now.
"""

from __future__ import annotations

import struct
import time
import uuid
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskstream.core.submission import submission_id_for
from tests.conftest import Stack, wait_until
from tests.test_e2e import Commands, all_terminal, produce_command, submission_of, task

pytestmark = [pytest.mark.stack, pytest.mark.fallback]
RUN_ID = uuid.uuid4().hex[:8]
TOMORROW = int(time.time() * 1000) + 86_400_000

words = st.text(max_size=12)
small = st.integers(-(2**31), 2**31 - 1)


@st.composite
def nonsense_task(draw: st.DrawFn, names: list[str]) -> dict[str, Any]:
    name = draw(st.sampled_from(names))
    return {
        "name": name, "tenant": draw(st.sampled_from(["acme", "", "a b", "x" * 200])),
        "argv": ["true", *draw(st.lists(words, max_size=2))] if draw(st.booleans()) else [],
        "env": draw(st.dictionaries(st.sampled_from(["OK", "1BAD", ""]), words, max_size=2)),
        "working_dir": draw(st.none() | st.just("")),
        "resources": {"cpu": draw(st.floats(-10, 10, allow_nan=False)), "memory_mb": draw(small), "gpu": draw(small)},
        "execution_cap_ms": draw(st.integers(-(2**40), 2**40)), "retry_limit": draw(small),
        "backoff": {"initial_ms": draw(small), "factor": draw(st.floats(-5, 500, allow_nan=False)),
                    "max_ms": draw(small), "jitter": draw(st.floats(-1, 2, allow_nan=False))},
        "delay_tolerance_ms": draw(small), "priority": draw(small),
        "dependencies": draw(st.lists(st.sampled_from([*names, "ghost"]), max_size=3)),
        "not_before_ms": TOMORROW, "labels": draw(st.dictionaries(words, words, max_size=2)),
    }  # fmt: skip


@st.composite
def nonsense_submission(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d", "a b", ""]), min_size=1, max_size=4))
    tasks = [draw(nonsense_task(names)) for _ in range(draw(st.integers(0, 4)))]
    return {
        "tenant": draw(st.sampled_from(["acme", ""])),
        "idempotency_key": draw(st.none() | words),
        "labels": {},
        "tasks": tasks,
    }


def raw_garbage() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=64).filter(lambda b: len(b) < 5 or b[0] != 0),  # not the wire format
        st.binary(max_size=64).map(lambda b: struct.pack(">bI", 0, 900_000 + len(b)) + b),  # unknown schema id
    )


def test_bad_commands_are_dead_lettered_or_decided_and_nothing_stops(stack: Stack) -> None:
    s = stack.settings
    producer = Producer({"bootstrap.servers": s.bootstrap, "linger.ms": 20})
    garbage_key = f"fuzz-{RUN_ID}".encode()
    sent_garbage: list[bytes] = []
    sent_commands: list[tuple[str, str, str | None]] = []

    @settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
    @given(raw_garbage())
    def throw_garbage(data: bytes) -> None:
        producer.produce(s.topic("commands"), key=garbage_key, value=data)
        sent_garbage.append(data)

    commands = Commands(stack)

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(nonsense_submission())
    def throw_nonsense(body: dict[str, Any]) -> None:
        cid = commands.send("SubmitDag", body)
        sent_commands.append((cid, body["tenant"], body["idempotency_key"]))

    throw_garbage()
    assert producer.flush(60) == 0
    throw_nonsense()
    commands.flush()

    def dead_lettered() -> int:
        with psycopg.connect(s.dsn, autocommit=True) as conn:
            return conn.execute("SELECT count(*) FROM dead_letters WHERE key = %s", (garbage_key,)).fetchone()[0]

    wait_until(lambda: dead_lettered() == len(sent_garbage), 240, f"{len(sent_garbage)} dead letters", every=1.0)

    # Every command was decided: its submission id (a function of tenant and key, or of the command id)
    # has an ACCEPTED or REJECTED row. Commands sharing a tenant and key share one submission.
    expected = {submission_id_for(tenant, key, cid) for cid, tenant, key in sent_commands}

    def undecided() -> set[str]:
        with psycopg.connect(s.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT submission_id::text FROM submissions WHERE submission_id::text = ANY(%s)", (list(expected),)
            ).fetchall()
        return expected - {r[0] for r in rows}

    wait_until(lambda: not undecided(), 240, f"decisions on {len(expected)} submissions", every=1.0)

    # the agents are still the ones that started (none crashed) and still work
    ok = produce_command(
        stack,
        "SubmitDag",
        {
            "tenant": "acme",
            "idempotency_key": None,
            "labels": {},
            "tasks": [task("after-the-storm", "print('still here')")],
        },
    )
    sid, outcome, _ = submission_of(stack, ok)
    assert outcome == "ACCEPTED"
    wait_until(lambda: all_terminal(stack, sid, 1), 120, "the normal task to end")
