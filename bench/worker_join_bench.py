"""Benchmark: how soon a worker takes work, added to a busy one or restarted after a SIGKILL.

- added: one Faust worker busy with a DAG of 80 independent `sleep 3` tasks; a second worker is
  started. Measured from its start: until it is ready (its process up, the app built), and until the
  first task starts on it (the group rebalanced and gave it partitions with queued tasks).
- restarted: the only worker is SIGKILLed while the DAG runs and started again at once (as the
  supervisor does). Measured from the SIGKILL: until a task starts on the new process.

Repeated --runs times per engine pair; writes median and range to bench/results/worker-join-<pair>.json.

    python bench/worker_join_bench.py [--engines kafka|fallback|both] [--runs 3] [--session-ms 6000]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _stack import embedded_stack, kinds, settings_of, start_worker, summary, when, write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
GIVE_UP_S = 120.0
TASKS = [{"name": f"t{i}", "argv": ["sleep", "3"]} for i in range(80)]  # a minute of work for one worker


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
    (n,) = conn.execute(
        "SELECT count(*) FROM attempts a JOIN tasks t USING (task_id) WHERE t.submission_id = %s "
        "AND a.started_at IS NOT NULL AND a.worker LIKE %s",
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


def once(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    import psycopg

    from taskstream.core.submission import parse_document
    from taskstream.sdk import Client

    out: dict[str, Any] = {}
    extra = {"workers": "0", "worker_session_timeout_ms": str(args.session_ms)}
    with embedded_stack(kind, **extra) as env:
        s = settings_of(env)
        workers = Workers(env, s)
        conn = psycopg.connect(s.dsn, autocommit=True)
        try:
            # added: a second worker beside a busy one
            first = workers.start(0)
            wait_for(lambda: workers.ready(0), 90)
            time.sleep(3)  # in the group and assigned
            with Client(s) as client:
                _, sid = client.submit(parse_document({"tenant": "bench", "tasks": TASKS}))
            wait_for(lambda: started_on(conn, sid, first.pid), 60)
            t0 = time.monotonic()
            second = workers.start(1)
            ready = wait_for(lambda: workers.ready(1), 90)
            took = wait_for(lambda: started_on(conn, sid, second.pid))
            out["added_ready_s"] = round(ready, 2) if ready is not None else None
            out["added_first_task_started_s"] = round(time.monotonic() - t0, 2) if took is not None else None
            for p in (first, second):
                p.send_signal(signal.SIGTERM)
                p.wait(60)
            # restarted: the only worker, SIGKILLed mid-DAG and started again at once
            only = workers.start(0)
            wait_for(lambda: workers.ready(0), 90)
            time.sleep(3)
            with Client(s) as client:
                _, sid = client.submit(parse_document({"tenant": "bench", "tasks": TASKS}))
            wait_for(lambda: started_on(conn, sid, only.pid), 60)
            only.send_signal(signal.SIGKILL)
            t0 = time.monotonic()
            only.wait(10)
            again = workers.start(0)
            took = wait_for(lambda: started_on(conn, sid, again.pid))
            out["restarted_first_task_started_s"] = round(time.monotonic() - t0, 2) if took is not None else None
        finally:
            conn.close()
            workers.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", choices=("kafka", "fallback", "both"), default="both")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--session-ms", type=int, default=6000)
    args = ap.parse_args()
    keys = ("added_ready_s", "added_first_task_started_s", "restarted_first_task_started_s")
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
