"""Dispatch under failure, on a real stack with real processes and real signals: leases, a SIGKILLed
worker whose tasks run again elsewhere (each ending exactly once, as the log says), its task processes
dying with it, and a worker told to stop handing back what it cannot finish.

The stack here runs no Faust worker of its own; each test starts the workers it kills. Leases are
short (3 s, heartbeats every second) so that expiry shows within seconds; the sessions of the Faust
consumer group time out after 4 s (6 s on noida-db).
"""

from __future__ import annotations

import json
import os
import re
import signal
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
from confluent_kafka import ConsumerGroupState
from taskstream.connectors.kafka import admin, consumer, make_codec
from taskstream.connectors.reading import end_offsets, read_to_end
from taskstream.connectors.services import ready_file
from taskstream.schemas import records as r

from taskstream.core import events as e
from taskstream.core.submission import parse_document
from taskstream.sdk import Client
from tests.conftest import Stack, gated, running, wait_until

pytestmark = pytest.mark.stack
SESSION_MS = 4000
NOIDA_SESSION_MS = 6000  # noida-db refuses a shorter session (InvalidSessionTimeout): Kafka's default minimum


@pytest.fixture(scope="module")
def workerless(tmp_path_factory: pytest.TempPathFactory, stack_kind: str) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp(f"dispatch-{stack_kind}") / "state", stack_kind)
    s.env.update(
        TASKSTREAM_WORKERS="0",
        TASKSTREAM_LEASE_MS="3000",
        TASKSTREAM_HEARTBEAT_MS="1000",
        TASKSTREAM_LEASE_GRACE_MS="1000",
        TASKSTREAM_WORKER_SESSION_TIMEOUT_MS=str(SESSION_MS if stack_kind == "kafka" else NOIDA_SESSION_MS),
        TASKSTREAM_DRAIN_MS="2000",
    )
    with running(s):
        yield s


class Workers:
    """Faust worker processes started by a test (`taskstream serve worker`); all stopped at its end."""

    def __init__(self, stack: Stack, tmp: Path) -> None:
        self.stack, self.tmp = stack, tmp
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, index: int, *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Worker `index`: `taskstream serve worker` (as the supervisor starts them), or the command
        `argv` (e.g. `taskstream worker ...`, which must start that index); `env`: settings of its own."""
        ready = ready_file(self.stack.settings, f"worker-{index}")
        ready.unlink(missing_ok=True)
        log = (self.tmp / f"worker-{index}.log").open("ab")
        proc = subprocess.Popen(
            list(argv) or [sys.executable, "-m", "taskstream", "serve", "worker", "--index", str(index)],
            env={**self.stack.env, **(env or {})},
            cwd=self.stack.settings.state_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs[index] = proc
        try:
            wait_until(lambda: ready.exists() or proc.poll() is not None, 90, f"worker-{index} ready")
            assert proc.poll() is None, f"worker-{index} exited {proc.returncode} before it was ready"
        except AssertionError:  # what the worker was doing, and the stack's own logs
            print(f"--- worker-{index}.log\n" + "\n".join(self.log(index).splitlines()[-80:]))
            print(self.stack.logs())
            raise
        return proc

    def log(self, index: int) -> str:
        return (self.tmp / f"worker-{index}.log").read_text(errors="replace")

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def workers(workerless: Stack, tmp_path: Path) -> Iterator[Workers]:
    w = Workers(workerless, tmp_path)
    yield w
    w.stop()


def group_members(stack: Stack) -> int:
    s = stack.settings
    group = f"{s.topic_prefix}-scheduler"
    client = admin(s)
    desc = client.describe_consumer_groups([group], request_timeout=10)[group].result(15)
    return 0 if desc.state in (ConsumerGroupState.DEAD, ConsumerGroupState.EMPTY) else len(desc.members)


def submit(stack: Stack, tasks: list[dict[str, Any]]) -> tuple[str, dict[str, str]]:
    with Client(stack.settings) as client:
        cid, sid = client.submit(parse_document({"tenant": "dispatch", "tasks": tasks}))
        out = client.wait_outcome(sid, 60, command_id=cid)
    assert out.accepted, out
    return sid, out.task_ids


def rows(stack: Stack, sid: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(stack.settings.dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT t.name, t.status, a.attempt, a.worker, a.pid, a.ended_at FROM tasks t "
            "LEFT JOIN attempts a USING (task_id) WHERE t.submission_id = %s ORDER BY t.name, a.attempt",
            (sid,),
        ).fetchall()


def history(stack: Stack, task_ids: set[str], forks: bool = False) -> dict[str, list[r.EventRecord]]:
    """Every committed event of these tasks, from the log, in log order per task, each version once
    (`forks`: and a different event under a version already seen, instead of failing on it)."""
    s = stack.settings
    codec = make_codec(s)
    c = consumer(s, f"dispatch-{uuid.uuid4()}")
    out: dict[str, list[r.EventRecord]] = {t: [] for t in task_ids}
    seen: dict[str, r.EventRecord] = {}
    try:
        topic = s.topic("events")
        ends = end_offsets(c, topic, list(range(s.partitions)))
        for m in read_to_end(c, topic, dict.fromkeys(range(s.partitions), 0), ends=ends, timeout=60):
            for ev in r.task_events(codec.decode("event", m.value())):
                if ev.task_id not in out:
                    continue
                # a record written again after a takeover is the same event (ids are <task>:<version>);
                # readers skip it. Two different events under one version would be a fork of the history.
                if ev.event_id in seen and forks and seen[ev.event_id].payload != ev.payload:
                    out[ev.task_id].append(ev)
                    continue
                if ev.event_id in seen:
                    assert seen[ev.event_id].payload == ev.payload, f"version fork: {seen[ev.event_id]} vs {ev}"
                    continue
                seen[ev.event_id] = ev
                out[ev.task_id].append(ev)
    finally:
        c.close()
    return out


def story(stack: Stack, task_id: str) -> str:
    """A task's history, one line per version (for a failing test's message)."""
    return "\n".join(
        f"v{ev.version} {type(ev.payload).__name__} by {ev.node} at {ev.event_ms}: {ev.payload}"
        for ev in history(stack, {task_id}, forks=True)[task_id]
    )


def running_on(stack: Stack, sid: str, worker: subprocess.Popen[bytes]) -> list[int] | None:
    """The pids of the submission's tasks running on this worker process now (None: there are none)."""
    mine = [pid for _, st, _, w, pid, _ in rows(stack, sid) if st == "RUNNING" and w and f"-{worker.pid}-" in w]
    return [p for p in mine if p] or None


def exactly_once(stack: Stack, ids: dict[str, str]) -> dict[str, list[r.EventRecord]]:
    """Assert from the log that every task succeeded once, and never under a claim whose lease expired;
    returns the tasks' histories."""
    log = history(stack, set(ids.values()))
    name_of = {v: k for k, v in ids.items()}
    successes = Counter(name_of[t] for t, evs in log.items() for ev in evs if isinstance(ev.payload, e.TaskSucceeded))
    assert successes == Counter(dict.fromkeys(ids, 1)), successes
    expired = [t for t, evs in log.items() if any(isinstance(ev.payload, e.TaskLeaseExpired) for ev in evs)]
    assert expired, "a task of the killed worker should have had its lease expire"
    for t in expired:
        evs = log[t]
        lost = next(ev.payload.claim_id for ev in evs if isinstance(ev.payload, e.TaskLeaseExpired))
        won = next(ev.payload.claim_id for ev in evs if isinstance(ev.payload, e.TaskSucceeded))
        assert won != lost, "the task succeeded under the claim whose lease expired"
    return log


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_a_sigkilled_worker_s_tasks_run_again_elsewhere_and_each_ends_exactly_once(
    workerless: Stack, workers: Workers
) -> None:
    a = workers.start(0)
    workers.start(1)
    wait_until(lambda: group_members(workerless) == 2, 60, "both workers in the group")
    marker = uuid.uuid4().hex[:8]
    tasks: list[dict[str, Any]] = [{"name": f"root{i}", "argv": ["sh", "-c", f"sleep 3 # {marker}"]} for i in range(4)]
    tasks += [
        {"name": f"mid{i}", "argv": ["sh", "-c", f"sleep 1 # {marker}"], "dependencies": [f"root{i % 4}"]}
        for i in range(8)
    ]
    tasks.append({"name": "join", "argv": ["true"], "dependencies": [f"mid{i}" for i in range(8)]})
    sid, ids = submit(workerless, tasks)

    pids = wait_until(lambda: running_on(workerless, sid, a), 60, "a task running on worker 0", every=0.2)
    a.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    a.wait(10)
    wait_until(lambda: not any(alive(p) for p in pids), 10, "the killed worker's task processes to die")
    wait_until(lambda: group_members(workerless) == 1, 60, "the dead worker to leave the group")
    print(f"\nthe group had the survivor alone {time.monotonic() - killed:.1f}s after the SIGKILL")

    def all_succeeded() -> bool | dict[str, str]:
        got = {name: st for name, st, *_ in rows(workerless, sid)}
        if len(got) == len(tasks) and all(st == "SUCCEEDED" for st in got.values()):
            return True
        seen.update(got)
        return False

    seen: dict[str, str] = {}
    try:
        wait_until(all_succeeded, 180, "every task to succeed", every=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the tasks: {seen}; survivor's log:\n{workers.log(1)[-6000:]}") from None
    print(f"every task succeeded {time.monotonic() - killed:.1f}s after the SIGKILL")
    assert not [p for p in subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()]

    # exactly once, as the log says: one success per task, never under a fenced claim, in order
    log = exactly_once(workerless, ids)
    done_at = {t: next(ev.event_ms for ev in evs if isinstance(ev.payload, e.TaskSucceeded)) for t, evs in log.items()}
    for spec in tasks:
        started = [ev.event_ms for ev in log[ids[spec["name"]]] if isinstance(ev.payload, e.TaskStarted)]
        for dep in spec.get("dependencies", []):
            assert min(started) >= done_at[ids[dep]], f"{spec['name']} started before {dep} succeeded"


@pytest.mark.fallback
def test_the_only_worker_restarted_after_a_sigkill_takes_its_work_back(workerless: Stack, workers: Workers) -> None:
    """On noida-db too, which never expires the dead worker's group session: the restarted worker leaves
    the group for it (connectors/noida.py) and is given the partitions."""
    a = workers.start(0)
    marker = uuid.uuid4().hex[:8]
    tasks: list[dict[str, Any]] = [{"name": f"t{i}", "argv": ["sh", "-c", f"sleep 2 # {marker}"]} for i in range(3)]
    sid, ids = submit(workerless, tasks)
    pids = wait_until(lambda: running_on(workerless, sid, a), 60, "a task running on the worker", every=0.2)
    a.send_signal(signal.SIGKILL)
    a.wait(10)
    wait_until(lambda: not any(alive(p) for p in pids), 10, "the killed worker's task processes to die")
    b = workers.start(0)
    ready = time.monotonic()
    try:
        wait_until(lambda: running_on(workerless, sid, b) or all_succeeded(workerless, sid, len(tasks)), 90,
                   "a task running on the restarted worker", every=0.2)  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its log:\n{workers.log(0)[-6000:]}") from None
    print(f"\nthe restarted worker ran a task {time.monotonic() - ready:.1f}s after it was ready")
    wait_until(lambda: all_succeeded(workerless, sid, len(tasks)), 120, "every task to succeed", every=0.5)
    exactly_once(workerless, ids)
    assert any(f"-{b.pid}-" in (w or "") for _, st, _, w, *_ in rows(workerless, sid) if st == "SUCCEEDED")


def test_a_worker_started_again_under_its_index_has_its_dead_predecessor_s_claims_expired_at_once(
    workerless: Stack, workers: Workers
) -> None:
    """A lone worker claims ahead for itself (dozens of tasks); SIGKILLed, its claims would wait out a
    lease. Its successor under the same index (the lock was free: the process is gone) sends each of them
    to its owner as HolderGone, and the owner expires them at once. With a 2-minute lease, every task
    still runs again within a minute, each succeeding once, and the expiries are recorded."""
    long_lease = {"TASKSTREAM_LEASE_MS": "120000"}
    a = workers.start(0, env=long_lease)
    marker = uuid.uuid4().hex[:8]
    tasks: list[dict[str, Any]] = [{"name": f"t{i}", "argv": ["sh", "-c", f"sleep 2 # {marker}"]} for i in range(8)]
    sid, ids = submit(workerless, tasks)
    wait_until(lambda: running_on(workerless, sid, a), 60, "a task running on the worker", every=0.2)
    held = {name for name, st, _, w, *_ in rows(workerless, sid) if st in ("CLAIMED", "RUNNING") and f"-{a.pid}-" in w}
    a.send_signal(signal.SIGKILL)
    a.wait(10)
    b = workers.start(0, env=long_lease)
    restarted = time.monotonic()
    try:
        wait_until(lambda: all_succeeded(workerless, sid, len(tasks)), 60, "every task to succeed", every=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its log:\n{workers.log(0)[-6000:]}") from None
    print(f"\nevery task succeeded {time.monotonic() - restarted:.1f}s after the restarted worker was ready")
    assert re.search(rf"([1-9]\d*) claim\(s\) of \S+-{a.pid}-w0, gone, sent to be expired now", workers.log(0))
    stories = exactly_once(workerless, ids)
    lost = {tid for tid, evs in stories.items() if any(isinstance(ev.payload, e.TaskLeaseExpired) for ev in evs)}
    expired = {name for name, tid in ids.items() if tid in lost}
    assert held and held <= expired, (held, expired)
    ran_again = {name for name, _, _, w, *_ in rows(workerless, sid) if f"-{b.pid}-" in (w or "")}
    assert held <= ran_again, (held, ran_again)


def all_succeeded(stack: Stack, sid: str, n: int) -> bool:
    got = [st for _, st, *_ in rows(stack, sid)]
    return len(got) >= n and all(st == "SUCCEEDED" for st in got)


def test_a_report_under_an_expired_lease_is_refused_and_recorded(workerless: Stack, workers: Workers) -> None:
    """A worker that lost its claim (here: SIGSTOPped past its lease, then let go on) finds its late
    report refused and recorded; the task's success is the other attempt's."""
    a = workers.start(0)
    workers.start(1)
    wait_until(lambda: group_members(workerless) == 2, 60, "both workers in the group")
    sid, ids = submit(workerless, [{"name": "slow", "argv": ["sh", "-c", "sleep 4"]}])
    tid = ids["slow"]

    def runner() -> str | None:
        return next((w for _, st, _, w, *_ in rows(workerless, sid) if st == "RUNNING" and w), None)

    holder = wait_until(runner, 60, "the task to run", every=0.2)
    victim = a if f"-{a.pid}-" in holder else workers.procs[1]
    # frozen, it holds the claim and sends nothing: its lease runs out (and, if it owned the task's
    # partition too, its group session: the other worker takes that over and expires the lease)
    victim.send_signal(signal.SIGSTOP)
    try:
        wait_until(
            lambda: any(isinstance(ev.payload, e.TaskLeaseExpired) for ev in history(workerless, {tid})[tid]),
            60,
            "the lease to expire",
            every=1.0,
        )
    except AssertionError as err:
        logs = "\n".join(f"--- worker-{i}\n" + workers.log(i)[-6000:] for i in (0, 1))
        raise AssertionError(
            f"{err}; holder {holder}, frozen pid {victim.pid}\n{story(workerless, tid)}\n{logs}"
        ) from None
    finally:
        victim.send_signal(signal.SIGCONT)
    try:
        wait_until(lambda: any(st == "SUCCEEDED" for _, st, *_ in rows(workerless, sid)), 90, "the task to succeed")
    except AssertionError as err:
        logs = "\n".join(workers.log(i)[-4000:] for i in (0, 1))
        raise AssertionError(f"{err}\n{story(workerless, tid)}\n{logs}") from None

    # the frozen worker's process ran on and ended; thawed, the worker reports under the expired claim
    def refused() -> list[Any]:
        return [ev for ev in history(workerless, {tid})[tid] if isinstance(ev.payload, e.CompletionRejected)]

    late = wait_until(refused, 60, "the late report to be refused", every=1.0)
    assert "lease" in late[0].payload.reason and "expired" in late[0].payload.reason
    log = history(workerless, {tid})[tid]
    assert sum(isinstance(ev.payload, e.TaskSucceeded) for ev in log) == 1


def test_a_stopping_worker_hands_back_what_it_cannot_finish(
    workerless: Stack, workers: Workers, tmp_path: Path
) -> None:
    """SIGTERM: no new work; a running task gets drain_ms (2 s here) to finish, then is killed and
    handed back, and runs again on the other worker without using up a retry. Worker 0 starts alone, so
    the tasks are its own (with both running first, every task could land on worker 1's partitions and
    within its slots and claim_ahead: CI saw that at 2ebf9ea); their gate opens only once it is gone."""
    gate = tmp_path / "go"
    a = workers.start(0)
    sid, ids = submit(workerless, [{"name": f"t{i}", "argv": gated(gate)} for i in range(8)])

    def states() -> list[tuple[str, str | None]]:
        return [(st, wid) for _, st, _, wid, *_ in rows(workerless, sid)]

    try:
        pids = wait_until(lambda: running_on(workerless, sid, a), 60, "a task on worker 0", every=0.2, show=states)
        workers.start(1)
        wait_until(lambda: group_members(workerless) == 2, 60, "both workers in the group")
        a.send_signal(signal.SIGTERM)
        assert a.wait(40) is not None
        assert not any(alive(p) for p in pids), "a task outlived its stopped worker"
    finally:
        gate.touch()
    wait_until(lambda: all_succeeded(workerless, sid, 8), 120, "every task to succeed", every=1.0, show=states)
    log = history(workerless, set(ids.values()))
    released = [t for t, evs in log.items() if any(isinstance(ev.payload, e.TaskReleased) for ev in evs)]
    assert released, f"nothing was handed back; worker log:\n{workers.log(0)[-3000:]}"
    for t in released:
        assert sum(isinstance(ev.payload, e.TaskSucceeded) for ev in log[t]) == 1
        assert not any(isinstance(ev.payload, e.TaskRetryScheduled) for ev in log[t])  # no retry used up


def test_a_worker_alone_claims_ahead_for_itself_and_gives_the_excess_back_when_another_comes(
    workerless: Stack, workers: Workers, tmp_path: Path
) -> None:
    """Worker 0 alone on the lane: its lifecycle claims the promoted tasks for it as it queues them,
    beyond its 4 slots and 4 claimed ahead (LocalClaims). Then worker 1 starts: worker 0 gives back the
    claims beyond 8 that wait for a slot (TaskReleased, no retry used up), and worker 1 runs some of
    them. From the log, every task succeeds once; the first claims were decided with their queuing,
    by worker 0's own lifecycle."""
    gate = tmp_path / "go"  # every task waits for it: worker 0's slots stay full until worker 1 ran some
    a = workers.start(0)
    tasks = [{"name": f"s{i}", "argv": gated(gate)} for i in range(30)]
    sid, ids = submit(workerless, tasks)

    def claimed_by(w: subprocess.Popen[bytes], states: tuple[str, ...]) -> int:
        return sum(1 for _, st, _, wid, *_ in rows(workerless, sid) if st in states and wid
                   and f"-{w.pid}-" in wid)  # fmt: skip

    held = wait_until(lambda: claimed_by(a, ("CLAIMED", "RUNNING")) > 8 or None, 60,
                      "worker 0 holding more claims than its slots and claim_ahead")  # fmt: skip
    b = workers.start(1)
    try:  # with worker 0's slots held by the gate, worker 1 can only run what worker 0 gave back
        wait_until(lambda: claimed_by(b, ("RUNNING",)) > 0, 120, "worker 1 running a task given back")
    finally:
        gate.touch()
    wait_until(lambda: all_succeeded(workerless, sid, len(tasks)), 120, "every task to succeed")
    log = history(workerless, set(ids.values()))
    name_of = {v: k for k, v in ids.items()}
    succeeded = Counter(name_of[t] for t, evs in log.items() for ev in evs if isinstance(ev.payload, e.TaskSucceeded))
    assert succeeded == Counter(dict.fromkeys(ids, 1)), succeeded
    given = [t for t, evs in log.items() for ev in evs if isinstance(ev.payload, e.TaskReleased)
             and "held more claims than it has room for" in ev.payload.reason]  # fmt: skip
    assert given, f"worker 0 held {held} claims and gave none back"
    on_b = [t for t, evs in log.items() for ev in evs if isinstance(ev.payload, e.TaskStarted)
            and f"-{b.pid}-" in ev.payload.worker]  # fmt: skip
    assert on_b, "worker 1 ran none of the tasks"
    for t in given:
        assert not any(isinstance(ev.payload, e.TaskRetryScheduled) for ev in log[t]), story(workerless, t)
    first = [evs for evs in log.values() if evs and f"-{a.pid}-" in next(
        (ev.payload.worker for ev in evs if isinstance(ev.payload, e.TaskClaimed)), "")]  # fmt: skip
    local = [evs for evs in first if any(
        isinstance(x.payload, e.TaskQueued) and isinstance(y.payload, e.TaskClaimed) and y.version == x.version + 1
        and x.event_ms == y.event_ms for x, y in zip(evs, evs[1:], strict=False))]  # fmt: skip
    assert local, "no claim decided with its queuing"


def test_taskstream_worker_joins_the_stack_runs_tasks_in_its_slots_and_refuses_a_taken_index(
    workerless: Stack, workers: Workers
) -> None:
    """The public command: a worker started by hand (index and slots given) runs the stack's tasks, never
    more at once than its slots (from the attempts' times); a second one under the same index is
    refused with the first one's pid; SIGTERM stops it cleanly."""
    cmd = [sys.executable, "-m", "taskstream", "worker"]
    proc = workers.start(3, *cmd, "--index", "3", "--slots", "2")
    again = subprocess.run(
        [*cmd, "--index", "3"],
        env={**workerless.env, "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 2, again.stderr
    assert f"worker 3 of {workerless.settings.state_dir} is already running (pid {proc.pid})" in again.stderr
    assert "Traceback" not in again.stderr and "joining" not in again.stderr

    tasks: list[dict[str, Any]] = [{"name": f"t{i}", "argv": ["sleep", "1"]} for i in range(6)]
    sid, ids = submit(workerless, tasks)
    wait_until(lambda: all_succeeded(workerless, sid, len(tasks)), 90, "every task to succeed", every=0.5)
    with psycopg.connect(workerless.settings.dsn, autocommit=True) as conn:
        runs = conn.execute(
            "SELECT worker, started_at, ended_at FROM attempts "
            "WHERE task_id = ANY(%s::uuid[]) AND outcome = 'SUCCEEDED'",
            (list(ids.values()),),
        ).fetchall()
    assert len(runs) == len(tasks) and all(w.endswith(f"-{proc.pid}-w3") for w, _, _ in runs), runs
    starts = sorted(start for _, start, _ in runs)
    most = max(sum(1 for _, a, b in runs if a <= t < b) for t in starts)
    assert most == 2, f"at most 2 at once (its slots), and 6 one-second tasks fill both: {runs}"

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(40) == 0


HOG = """
import os, sys, time
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("growing", flush=True)
grown = b"x" * (320 << 20)  # resident: 320 MB written
time.sleep(120)
"""


def test_killing_the_node_that_watches_a_worker_hands_the_watching_on_and_an_over_limit_task_is_killed(
    workerless: Stack, workers: Workers, tmp_path: Path
) -> None:
    """Three workers, each a resource manager node. A task asking for 64 MB that only worker 0 may run
    (label role=hog; the batcher routes it to the lane only worker 0 reads) waits for a file, then holds
    320 MB. The node watching worker 0 (never worker 0 itself) is SIGKILLed and not restarted; then the
    file appears. The other node takes the watching over and orders the kill: from the log,
    TaskLimitExceeded by that node, the attempt failed with the reason, no retry left so the task is
    dead-lettered, and its process is gone. `taskstream workers` says who watches whom before and after."""
    hogs = {"TASKSTREAM_WORKER_LABELS": "role=hog", "TASKSTREAM_WORKER_LANES": "hog"}  # its own lane: only it reads
    procs = {0: workers.start(0, env=hogs), 1: workers.start(1), 2: workers.start(2)}
    name_of = {f"-{p.pid}-w{i}": i for i, p in procs.items()}

    def index(worker: str) -> int:
        return next(i for tail, i in name_of.items() if worker.endswith(tail))

    def watched(live: int) -> dict[int, list[int]] | None:
        """Live worker -> the nodes that say they watch it, once there are `live` and each has one."""
        rows = [w for w in json.loads(workerless.cli("workers", "--json").stdout) if w["live"]]
        got = {index(w["worker"]): sorted(index(n) for n in w["watched_by"]) for w in rows}
        return got if len(got) == live and all(len(v) == 1 for v in got.values()) else None

    before = wait_until(lambda: watched(3), 60, "three live workers, each watched by one node")
    (watcher,) = before[0]
    assert watcher != 0 and all(i not in v for i, v in before.items()), before  # a node never watches itself
    (survivor,) = {1, 2} - {watcher}

    go = tmp_path / "go"
    hog = {"name": "hog", "argv": [sys.executable, "-c", HOG, str(go)], "retry_limit": 0,
           "resources": {"memory_mb": 64, "labels": {"role": "hog"}}}  # fmt: skip
    sid, ids = submit(workerless, [hog])
    tid = ids["hog"]
    pid = wait_until(lambda: running_on(workerless, sid, procs[0]), 60, "the task running on worker 0")[0]
    procs[watcher].send_signal(signal.SIGKILL)
    procs[watcher].wait(10)
    go.touch()  # it grows while its watcher is down
    killed = time.monotonic()
    wait_until(lambda: not alive(pid), 60, "the over-limit task's process to be killed", every=0.2)
    print(f"\nthe task was killed {time.monotonic() - killed:.1f}s after it grew with its watcher dead")

    def ended() -> list[r.EventRecord] | None:
        evs = history(workerless, {tid})[tid]
        return evs if any(isinstance(ev.payload, e.TaskDeadLettered) for ev in evs) else None

    evs = wait_until(ended, 60, "the task dead-lettered")
    (order,) = [ev.payload for ev in evs if isinstance(ev.payload, e.TaskLimitExceeded)]
    assert order.limit == "memory" and index(order.watcher) == survivor and index(order.worker) == 0, order
    limit = r"over its memory limit: (\d+) MB resident, the limit is 128 MB \(2 x the 64 MB it asked for\)"
    grown = re.fullmatch(limit, order.reason)
    assert grown and int(grown[1]) > 128, order  # sampled while it grows: over the limit, not yet at 320
    (failed,) = [ev.payload for ev in evs if isinstance(ev.payload, e.TaskFailed)]
    assert failed.reason.startswith("killed: over its memory limit") and failed.exit_code in (
        -signal.SIGTERM, -signal.SIGKILL), failed  # fmt: skip
    assert "growing" in failed.output_tail and not any(isinstance(ev.payload, e.TaskSucceeded) for ev in evs)
    after = wait_until(lambda: watched(2), 30, "two live workers, each watched by the other")
    assert after == {0: [survivor], survivor: [0]}, after
