"""The PostgreSQL projection on a real server (the stack's), in a database of its own per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from taskstream.projections.migrate import migrate, migrations
from taskstream.projections.pg import PgProjection
from taskstream.projections.runner import Batch, Item
from taskstream.schemas.records import EventRecord

from taskstream.core import events as e
from taskstream.core.model import TaskSpec
from tests.conftest import Stack

pytestmark = pytest.mark.stack


@pytest.fixture()
def dsn(stack: Stack) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = stack.settings.dsn.replace("dbname=taskstream", "dbname=postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = stack.settings.dsn.replace("dbname=taskstream", f"dbname={name}")
    assert migrate(dsn) == [name for _, name, _ in migrations()] and len(migrations()) >= 2
    assert migrate(dsn) == []  # idempotent
    yield dsn
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def history() -> list[EventRecord]:
    sid = str(uuid.uuid4())
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    spec_a = TaskSpec("a", "acme", ("echo", "a"))
    spec_b = TaskSpec("b", "acme", ("echo", "b"), dependencies=(a,), retry_limit=1)
    evs: list[tuple[str, list[e.Event]]] = [
        (
            a,
            [
                e.TaskSubmitted(sid, spec_a),
                e.TaskAdmitted("n"),
                e.TaskReady("r"),
                e.TaskQueued(1, "default"),
                e.TaskClaimed(1, "w", "c1"),
                e.TaskStarted("c1", "w", 10),
                e.TaskSucceeded("c1", 0, "a out", 5),
            ],
        ),
        (
            b,
            [
                e.TaskSubmitted(sid, spec_b),
                e.TaskAdmitted("n"),
                e.TaskReady("r"),
                e.TaskQueued(1, "default"),
                e.TaskClaimed(1, "w", "c2"),
                e.TaskStarted("c2", "w", 11),
                e.TaskFailed("c2", 3, "b out", 4, "exit status 3"),
                e.TaskRetryScheduled(2, 50, 10),
                e.TaskReady("retry"),
                e.TaskQueued(2, "default"),
                e.TaskClaimed(2, "w", "c3"),
                e.TaskStarted("c3", "w", 12),
                e.TaskSucceeded("c3", 0, "b ok", 3),
            ],
        ),
    ]
    out = []
    for tid, payloads in evs:
        out.extend(EventRecord(f"{tid}:{v}", tid, sid, v, 1000 + v, "n", p) for v, p in enumerate(payloads, 1))
    return out


def snapshot(dsn: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    with psycopg.connect(dsn) as conn:
        tasks = conn.execute(
            "SELECT name, status, version, attempt, exit_code, reason FROM tasks ORDER BY name"
        ).fetchall()
        attempts = conn.execute(
            "SELECT t.name, a.attempt, a.outcome, a.exit_code, a.output_tail FROM attempts a "
            "JOIN tasks t USING (task_id) ORDER BY 1, 2"
        ).fetchall()
    return tasks, attempts


def test_rows_reflect_the_history(dsn: str) -> None:
    proj = PgProjection(dsn)
    evs = history()
    proj.apply(Batch("events", [Item(0, i, 0, r) for i, r in enumerate(evs)], {0: len(evs)}))
    tasks, attempts = snapshot(dsn)
    assert tasks == [("a", "SUCCEEDED", 7, 1, 0, ""), ("b", "SUCCEEDED", 13, 2, 0, "")]
    assert attempts == [
        ("a", 1, "SUCCEEDED", 0, "a out"),
        ("b", 1, "FAILED", 3, "b out"),
        ("b", 2, "SUCCEEDED", 0, "b ok"),
    ]
    assert proj.checkpoints("events") == {0: len(evs)}


def test_every_event_twice_or_replayed_from_earlier_leaves_the_rows_unchanged(dsn: str) -> None:
    evs = history()
    once = PgProjection(dsn)
    once.apply(Batch("events", [Item(0, i, 0, r) for i, r in enumerate(evs)], {0: len(evs)}))
    expected = snapshot(dsn)
    twice = [Item(0, i, 0, r) for i, r in enumerate(x for rec in evs for x in (rec, rec))]
    once.apply(Batch("events", twice, {0: len(evs)}))
    assert snapshot(dsn) == expected
    once.apply(
        Batch("events", [Item(0, i, 0, r) for i, r in enumerate(evs[5:])], {0: len(evs)})
    )  # from an earlier offset
    assert snapshot(dsn) == expected


def test_a_packed_admission_projects_to_the_rows_its_events_do(dsn: str) -> None:
    from taskstream.schemas.records import AdmittedTask, TasksAdmitted, task_events

    sid = str(uuid.uuid4())
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    packed = EventRecord(
        f"{sid}:admitted:0:0",
        None,
        sid,
        0,
        1_000,
        "n",
        TasksAdmitted(
            "n",
            (
                AdmittedTask(a, TaskSpec("a", "acme", ("echo", "a"), env={"K": "v"}, labels={"l": "1"}), (b,)),
                AdmittedTask(b, TaskSpec("b", "acme", ("echo", "b"), dependencies=(a,), priority=3)),
            ),
        ),
    )
    ready = EventRecord(f"{a}:3", a, sid, 3, 2_000, "n", e.TaskReady("no prerequisites"))

    def rows() -> list[tuple[object, ...]]:
        with psycopg.connect(dsn) as conn:
            return conn.execute("SELECT * FROM tasks ORDER BY name").fetchall()

    proj = PgProjection(dsn)
    for i, batch in enumerate(([packed, ready], [packed], [packed, packed])):  # with later events; alone; twice
        proj.apply(Batch("events", [Item(0, j, 0, x) for j, x in enumerate(batch)], {0: len(batch)}))
        got = rows()
        with psycopg.connect(dsn) as conn:
            conn.execute("TRUNCATE tasks CASCADE")
        unpacked = [x for rec in batch for x in task_events(rec)]
        proj.apply(Batch("events", [Item(0, j, 0, x) for j, x in enumerate(unpacked)], {0: len(unpacked)}))
        assert rows() == got, i
        assert [(r[2], r[4], r[5]) for r in got] == [("a", "READY" if i == 0 else "WAITING", 3 if i == 0 else 2),
                                                      ("b", "WAITING", 2)]  # fmt: skip
        with psycopg.connect(dsn) as conn:
            conn.execute("TRUNCATE tasks CASCADE")


def test_tenants_and_workers_rows_do_not_depend_on_where_batches_end(dsn: str) -> None:
    """A record can be in the log twice: a worker that took a partition over decides an input again and
    writes the same event (same id and version) a little later. Live, the copy comes in a batch of its
    own; a replay reads both in one. The tenants' and workers' first and last times count every copy,
    so both give the same rows (a replay once found a tenant's last_submission differing from live)."""
    evs = history()
    late = [
        EventRecord(rec.event_id, rec.task_id, rec.submission_id, rec.version, rec.event_ms + 5_000, "n2", rec.payload)
        for rec in evs
        if isinstance(rec.payload, e.TaskSubmitted | e.TaskClaimed)
    ]
    log = evs + late

    def rows() -> list[tuple[object, ...]]:
        with psycopg.connect(dsn) as conn:
            got = conn.execute("SELECT tenant, first_seen, last_submission FROM tenants ORDER BY 1").fetchall()
            got += conn.execute("SELECT worker_id, first_seen, last_seen FROM workers ORDER BY 1").fetchall()
            conn.execute("TRUNCATE tasks, attempts, tenants, workers CASCADE")
        return got

    proj = PgProjection(dsn)
    proj.apply(Batch("events", [Item(0, i, 0, r) for i, r in enumerate(log)], {0: len(log)}))  # a replay
    together = rows()
    for i, rec in enumerate(log):  # live: one record at a time
        proj.apply(Batch("events", [Item(0, i, 0, rec)], {0: i + 1}))
    assert rows() == together
    assert [r[2].timestamp() * 1000 for r in together] == [1_001 + 5_000, 1_011 + 5_000]  # the copies' times


def test_a_task_handed_back_keeps_its_deadline_and_a_retry_is_ranked_anew(dsn: str) -> None:
    """The batcher ranks ready tasks by promote_by (ready time + delay tolerance, to the second). A task
    made ready again by an expired lease or a release keeps the deadline it had, rather than going behind
    every task that became ready while it was claimed; a retry after a failure gets a deadline from the
    time it is due. The same, folded in one batch or one record at a time."""
    sid, t = str(uuid.uuid4()), str(uuid.uuid4())
    spec = TaskSpec("t", "acme", ("true",), delay_tolerance_ms=2_000, retry_limit=1)
    payloads: list[tuple[int, e.Event]] = [
        (1_000, e.TaskSubmitted(sid, spec)),
        (1_000, e.TaskAdmitted("n")),
        (1_500, e.TaskReady("no prerequisites")),
        (1_600, e.TaskQueued(1, "default")),
        (1_700, e.TaskClaimed(1, "w1", "c1")),
        (1_800, e.TaskStarted("c1", "w1", 10)),
        (61_000, e.TaskLeaseExpired("c1", "w1", 1, "expired")),
        (61_000, e.TaskReady("expired: run again", handed_back=True)),
        (61_100, e.TaskQueued(2, "default")),
        (61_200, e.TaskClaimed(2, "w2", "c2")),
        (90_000, e.TaskReleased("c2", "w2", "worker stopping")),
        (90_000, e.TaskReady("released by its worker: worker stopping", handed_back=True)),
    ]
    retry: list[tuple[int, e.Event]] = [
        (90_100, e.TaskQueued(3, "default")),
        (90_200, e.TaskClaimed(3, "w2", "c3")),
        (90_300, e.TaskStarted("c3", "w2", 11)),
        (90_400, e.TaskFailed("c3", 1, "", 100, "exit status 1")),
        (90_400, e.TaskRetryScheduled(4, 120_000, 29_600)),
        (120_000, e.TaskReady("retry 4 due")),
    ]

    def records(items: list[tuple[int, e.Event]], start: int) -> list[EventRecord]:
        return [EventRecord(f"{t}:{v}", t, sid, v, ms, "n", p) for v, (ms, p) in enumerate(items, start)]

    def deadline() -> tuple[float, float]:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT ready_at, promote_by, status FROM tasks").fetchone()
        assert row is not None and row[2] == "READY"
        return row[0].timestamp(), row[1].timestamp()

    proj = PgProjection(dsn)
    handed, retried = records(payloads, 1), records(retry, len(payloads) + 1)
    for batches in ([handed], [[x] for x in handed]):  # one batch; one record at a time
        for batch in batches:
            proj.apply(Batch("events", [Item(0, i, 0, x) for i, x in enumerate(batch)], {0: len(batch)}))
        assert deadline() == (1.5, 3.0)  # ready at 1.5 s, 2 s tolerance, to the second: as before
        proj.apply(Batch("events", [Item(0, i, 0, x) for i, x in enumerate(retried)], {0: len(retried)}))
        assert deadline() == (120.0, 122.0)  # the retry's own
        with psycopg.connect(dsn) as conn:
            conn.execute("TRUNCATE tasks, attempts, tenants, workers CASCADE")
