"""Benchmark: how soon a worker takes work, added to a busy one or restarted after a SIGKILL.

- added: one Faust worker busy with a DAG of 40 independent `sleep 3` tasks; a second worker is
  started. Measured from its start: until it is ready (its process up, the app built), and until the
  first task starts on it (the group rebalanced and gave it partitions with queued tasks).
- restarted: the only worker is SIGKILLed while it runs tasks of a DAG of 80 and started again at
  once (as the supervisor does). Measured from the SIGKILL: until a task starts on the new process;
  until the dead one's leases have expired (lease_ms + lease_grace_ms after its last heartbeat, 12 s
  by default); and until every task it had started has started again (on a worker whose 4 slots are
  busy with 3 s tasks, so they queue behind its other claims).

Each case runs on a stack of its own.

Repeated --runs times per engine pair; writes median and range to bench/results/worker-join-<pair>.json.

    python bench/worker_join_bench.py [--engines kafka|fallback|both] [--runs 3] [--session-ms 6000]
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _stack import embedded_stack, kinds, settings_of, start_worker, summary, when, write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
GIVE_UP_S = 120.0
# 4 slots: half a minute of work for one worker, then a minute
ADDED_TASKS = [{"name": f"t{i}", "argv": ["sleep", "3"]} for i in range(40)]
RESTARTED_TASKS = [{"name": f"t{i}", "argv": ["sleep", "3"]} for i in range(80)]


class Workers:
    def __init__(self, env: dict[str, str], s: Any) -> None:
        self.env, self.s = env, s
        self.procs: list[tuple[subprocess.Popen[bytes], Any]] = []

    def start(self, index: int) -> subprocess.Popen[bytes]:
        from taskstream.connectors.services import ready_file

        ready_file(self.s, f"worker-{index}").unlink(missing_ok=True)
        proc, log = start_worker(self.env, index)
        self.procs.append((proc, log))
        return proc

    def ready(self, index: int) -> bool:
        from taskstream.connectors.services import ready_file

        return ready_file(self.s, f"worker-{index}").exists()

    def stop(self) -> None:
        for p, _ in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p, log in self.procs:
            try:
                p.wait(40)
            except subprocess.TimeoutExpired:
                p.kill()
            log.close()


def started_on(conn: Any, sid: str, pid: int) -> bool:
    return bool(started_tasks(conn, sid, pid))


def started_tasks(conn: Any, sid: str, pid: int, unfinished: bool = False) -> set[str]:
    """The tasks an attempt on the worker process `pid` started; `unfinished`: those it did not finish."""
    rows = conn.execute(
        "SELECT DISTINCT a.task_id FROM attempts a JOIN tasks t USING (task_id) WHERE t.submission_id = %s "
        "AND a.started_at IS NOT NULL AND a.worker LIKE %s AND (NOT %s OR a.outcome IS DISTINCT FROM 'SUCCEEDED')",
        (sid, f"%-{pid}-w%", unfinished),
    ).fetchall()
    return {str(r[0]) for r in rows}


def running_on(conn: Any, sid: str, pid: int) -> bool:
    """Whether an attempt on the worker process `pid` has started and not ended (as the read model has it)."""
    (n,) = conn.execute(
        "SELECT count(*) FROM attempts a JOIN tasks t USING (task_id) WHERE t.submission_id = %s "
        "AND a.started_at IS NOT NULL AND a.ended_at IS NULL AND a.worker LIKE %s",
        (sid, f"%-{pid}-w%"),
    ).fetchone()
    return bool(n)


def wait_for(check: Any, limit: float = GIVE_UP_S) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        if check():
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


@contextlib.contextmanager
def stack_without_workers(kind: str, args: argparse.Namespace) -> Iterator[tuple[Any, Workers, Any]]:
    """A fresh embedded stack with no worker of its own: its settings, a way to start workers, a connection."""
    import psycopg

    with embedded_stack(kind, workers="0", worker_session_timeout_ms=str(args.session_ms)) as env:
        s = settings_of(env)
        workers = Workers(env, s)
        conn = psycopg.connect(s.dsn, autocommit=True)
        try:
            yield s, workers, conn
        finally:
            conn.close()
            workers.stop()


def submit(s: Any, tasks: list[dict[str, Any]]) -> str:
    from taskstream.core.submission import parse_document
    from taskstream.sdk import Client

    with Client(s) as client:
        _, sid = client.submit(parse_document({"tenant": "bench", "tasks": tasks}))
    return str(sid)


def added(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """A second worker started beside a busy one: seconds until it is ready, and until it starts a task."""
    with stack_without_workers(kind, args) as (s, workers, conn):
        first = workers.start(0)
        wait_for(lambda: workers.ready(0), 90)
        time.sleep(3)  # in the group and assigned
        sid = submit(s, ADDED_TASKS)
        if wait_for(lambda: started_on(conn, sid, first.pid), 60) is None:
            raise RuntimeError("the first worker started no task within 60 s")
        t0 = time.monotonic()
        second = workers.start(1)
        ready = wait_for(lambda: workers.ready(1), 90)
        took = wait_for(lambda: started_on(conn, sid, second.pid))
        return {
            "added_ready_s": round(ready, 2) if ready is not None else None,
            "added_first_task_started_s": round(time.monotonic() - t0, 2) if took is not None else None,
        }


def restarted(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """The only worker SIGKILLed while it runs tasks and started again at once: seconds from the kill."""
    with stack_without_workers(kind, args) as (s, workers, conn):
        only = workers.start(0)
        wait_for(lambda: workers.ready(0), 90)
        time.sleep(3)
        sid = submit(s, RESTARTED_TASKS)
        if wait_for(lambda: started_on(conn, sid, only.pid), 60) is None:
            raise RuntimeError("the only worker started no task within 60 s")
        only.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        only.wait(10)
        again = workers.start(0)
        # the dead worker's tasks are read each time: its last reports may still be on their way
        checks = {
            "restarted_first_task_started_s": lambda: started_on(conn, sid, again.pid),
            "killed_leases_expired_s": lambda: not running_on(conn, sid, only.pid),
            "killed_tasks_started_again_s": lambda: (
                started_tasks(conn, sid, only.pid, unfinished=True) <= started_tasks(conn, sid, again.pid)
            ),
        }
        out: dict[str, Any] = dict.fromkeys(checks)
        while time.monotonic() - t0 < GIVE_UP_S and None in out.values():
            for key, check in checks.items():
                if out[key] is None and check():
                    out[key] = round(time.monotonic() - t0, 2)
            time.sleep(0.05)
        out["killed_tasks"] = len(started_tasks(conn, sid, only.pid, unfinished=True))
        return out


def once(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """Each case on a stack of its own: on noida-db the added case can leave its group unsettled."""
    return {**added(kind, args), **restarted(kind, args)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", choices=("kafka", "fallback", "both"), default="both")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--session-ms", type=int, default=6000)
    args = ap.parse_args()
    keys = (
        "added_ready_s",
        "added_first_task_started_s",
        "restarted_first_task_started_s",
        "killed_leases_expired_s",
        "killed_tasks_started_again_s",
    )
    for kind in kinds(args.engines):
        runs = []
        for i in range(args.runs):
            runs.append(once(kind, args))
            print(f"{kind} run {i + 1}: {runs[-1]}", flush=True)
        report = {
            "benchmark": "a worker added beside a busy one, and the only worker SIGKILLed and restarted at once",
            "engines": kind,
            "session_timeout_ms": args.session_ms,
            "gave_up_after_s": GIVE_UP_S,
            "runs": args.runs,
            **{k: summary([r[k] for r in runs]) for k in keys},
            "runs_without_the_figure_within_the_limit": {k: sum(r[k] is None for r in runs) for k in keys},
            "each_run": runs,
            "when": when(),
        }
        write_report(RESULTS / f"worker-join-{kind}.json", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
