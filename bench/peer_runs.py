"""One workload on one peer scheduler, run inside the peers' own environment (bench/peers.py makes it).

    python bench/peer_runs.py SYSTEM WORKLOAD --n N --pg DSN --redis URL --concurrency C

SYSTEM is celery, pgqueuer or procrastinate; WORKLOAD one of WORKLOADS. It prepares the system's
storage, starts one worker process (the system's own CLI, `C` tasks at a time), sends the workload,
waits for the last task to end, stops the worker and prints one JSON line: seconds from the first
send (or, pre-enqueued, from the worker's start) to the last completion, how many tasks ran, and the
worker's CPU seconds and peak RSS (all its processes). A workload a system cannot express prints
{"unable": why}. The tasks do nothing but record that they ran where the driver can count them.

burn_single sends its N tasks one call each (the system's plain submit, no batch API). latency sends
one-call tasks open loop at each of --rates (tasks/s) for --seconds: task i of a level is due at the
level's start + i / rate and sent then (late if the sender fell behind: the lateness counts). Each
latency task appends its intended send time and its start time to BENCH_LATENCY_FILE; a level's
submit -> start latencies are start - intended, and the next level begins when every task of this
one has run.

This module is also the peers' application: the workers import `celery_app`, `pgqueuer_main` and
`procrastinate_app` from it (each made on first use, so one peer's imports never need another's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _stack import open_loop, percentiles_ms, tree_rss  # noqa: E402 (bench/'s own helpers, stdlib only)

WORKLOADS = ("burn_pre", "burn_live", "burn_single", "latency", "chain", "fan")
QUEUE = "bench"


# -- the applications, as each system's worker imports them ---------------------------------------------
def started(intended: float) -> None:
    """A latency task's first act: its intended send time and now, one line appended (a line of a few
    dozen bytes written with O_APPEND is not interleaved with another process's)."""
    line = f"{float(intended)!r} {time.time()!r}\n".encode()
    fd = os.open(os.environ["BENCH_LATENCY_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _celery() -> Any:
    import redis
    from celery import Celery

    url = os.environ["BENCH_REDIS"]
    app = Celery("bench", broker=url, backend=url)
    app.conf.update(
        task_acks_late=True,  # acknowledged after the task ran: a worker that dies gives it back
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    done = redis.Redis.from_url(url)

    def ran() -> None:
        pipe = done.pipeline(transaction=False)
        pipe.incr("bench:done")
        pipe.set("bench:last", repr(time.time()))
        pipe.execute()

    @app.task(name="noop", ignore_result=True)
    def noop() -> None:
        ran()

    @app.task(name="lat", ignore_result=True)
    def lat(intended: float) -> None:
        started(intended)
        ran()

    @app.task(name="step", ignore_result=False)
    def step(*_: Any) -> None:  # a link of a chain or a chord: its result is what the next one waits on
        ran()

    return app


@contextlib.asynccontextmanager
async def _pgqueuer() -> Any:
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(os.environ["BENCH_PG"])
    pgq = PgQueuer(AsyncpgDriver(conn))
    other = await asyncpg.connect(os.environ["BENCH_PG"])  # the worker's connection is busy dequeuing
    queries = Queries(AsyncpgDriver(other))

    @pgq.entrypoint("noop")
    async def noop(job: Any) -> None:
        return None

    @pgq.entrypoint("lat")
    async def lat(job: Any) -> None:
        started(float(job.payload))

    @pgq.entrypoint("chain")
    async def chain(job: Any) -> None:  # each link enqueues the next: pgqueuer has no chains
        left = int(job.payload or b"0")
        if left > 1:
            await queries.enqueue("chain", str(left - 1).encode())

    try:
        yield pgq
    finally:
        await other.close()
        await conn.close()


def _procrastinate() -> Any:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=os.environ["BENCH_PG"]))

    @app.task(name="noop", queue=QUEUE)
    def noop() -> None:
        return None

    @app.task(name="lat", queue=QUEUE)
    def lat(intended: float) -> None:
        started(intended)

    # each link defers the next: procrastinate has no chains. (A sync task: an async one deferring
    # with defer_async took 1 s a link here, against 0.27 s.)
    @app.task(name="chain", queue=QUEUE)
    def chain(left: int) -> None:
        if left > 1:
            app.configure_task("chain", queue=QUEUE).defer(left=left - 1)

    return app


_MADE: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    makers = {"celery_app": _celery, "procrastinate_app": _procrastinate}
    if name == "pgqueuer_main":
        return _pgqueuer
    if name in makers:
        if name not in _MADE:
            _MADE[name] = makers[name]()
        return _MADE[name]
    raise AttributeError(name)


# -- the worker process ------------------------------------------------------------------------------------
def worker_argv(system: str, concurrency: int) -> list[str]:
    bin_dir = Path(sys.executable).parent
    if system == "celery":
        return [str(bin_dir / "celery"), "-A", "peer_runs:celery_app", "worker", "--pool", "prefork",
                "--concurrency", str(concurrency), "-Q", QUEUE, "-O", "fair", "--without-gossip",
                "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING"]  # fmt: skip
    if system == "pgqueuer":
        # pgqueuer's own runner (`pgq run` 1.6.0 fails on its default log level under typer 0.29)
        return [sys.executable, str(HERE / "peer_runs.py"), "serve-pgqueuer", "--concurrency", str(concurrency)]
    if system == "procrastinate":
        return [str(bin_dir / "procrastinate"), "--app", "peer_runs.procrastinate_app", "worker",
                "--concurrency", str(concurrency), "--queues", QUEUE]  # fmt: skip
    raise SystemExit(f"unknown system {system!r}")


class Worker:
    """The system's worker, its processes' peak RSS sampled while it runs, its CPU from wait4."""

    def __init__(self, system: str, concurrency: int, log: Path) -> None:
        env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.log = log.open("ab")
        self.proc = subprocess.Popen(worker_argv(system, concurrency), env=env, cwd=HERE, stdout=self.log,
                                     stderr=subprocess.STDOUT)  # fmt: skip
        self.started = time.time()
        self.peak = 0.0

    def sample(self) -> None:
        self.peak = max(self.peak, tree_rss(self.proc.pid))
        if self.proc.poll() is not None:
            raise SystemExit(f"the worker exited ({self.proc.returncode}); its log: {self.log.name}")

    def stop(self) -> dict[str, float]:
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pid, _, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.proc.returncode = 0
                self.log.close()
                return {"worker_cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
                        "worker_peak_rss_mib": round(self.peak, 1)}  # fmt: skip
            time.sleep(0.1)
        self.proc.kill()
        _, _, usage = os.wait4(self.proc.pid, 0)
        self.log.close()
        return {"worker_cpu_s": round(usage.ru_utime + usage.ru_stime, 3), "worker_peak_rss_mib": round(self.peak, 1)}


# -- each system: prepare, send, count ---------------------------------------------------------------------
class Celery:
    unable: dict[str, str] = {}

    def __init__(self, args: Any) -> None:
        import redis

        self.redis = redis.Redis.from_url(args.redis)
        self.redis.flushdb()
        self.app = __getattr__("celery_app")

    def done(self) -> tuple[int, float | None]:
        n, last = self.redis.get("bench:done"), self.redis.get("bench:last")
        return int(n or 0), float(last) if last else None

    def send(self, workload: str, n: int) -> int:
        """Sends the workload; the number of tasks it runs."""
        noop, step = self.app.tasks["noop"], self.app.tasks["step"]
        if workload == "burn_single":
            for _ in range(n):
                noop.delay()
            return n
        if workload in ("burn_pre", "burn_live"):
            with self.app.producer_or_acquire() as producer:
                for _ in range(n):
                    noop.apply_async(producer=producer)
            return n
        if workload == "chain":
            from celery import chain

            chain(*(step.si() for _ in range(n))).apply_async()
            return n
        from celery import chord, group

        # fan-out and fan-in: a head, n tasks after it, one after them all (a chord: results in Redis)
        (step.si() | chord(group(step.si() for _ in range(n)), step.si())).apply_async()
        return n + 2

    def one(self, intended: float) -> None:
        self.app.tasks["lat"].delay(intended)

    def close(self) -> None:
        pass


class PgQueuer:
    unable = {"fan": "no way to run a task after a group of others (no chords, no dependencies)"}

    def __init__(self, args: Any) -> None:
        self.dsn = args.pg
        env = {**os.environ, **_pg_env(args.pg)}
        pgq = str(Path(sys.executable).parent / "pgq")
        subprocess.run([pgq, "uninstall"], env=env, capture_output=True, check=False)
        subprocess.run([pgq, "install"], env=env, capture_output=True, check=True)
        self.loop = asyncio.new_event_loop()  # one connection for calls one at a time (burn_single, latency)
        self.conn: Any = None
        self.queries: Any = None

    def _call(self, entrypoint: str, payload: bytes | None) -> None:
        async def go() -> None:
            if self.queries is None:
                import asyncpg
                from pgqueuer.db import AsyncpgDriver
                from pgqueuer.queries import Queries

                self.conn = await asyncpg.connect(self.dsn)
                self.queries = Queries(AsyncpgDriver(self.conn))
            await self.queries.enqueue(entrypoint, payload)

        self.loop.run_until_complete(go())

    def one(self, intended: float) -> None:
        self._call("lat", repr(intended).encode())

    def close(self) -> None:
        if self.conn is not None:
            self.loop.run_until_complete(self.conn.close())
        self.loop.close()

    def done(self) -> tuple[int, float | None]:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            n, last = conn.execute(
                "SELECT count(*), extract(epoch FROM max(created)) FROM pgqueuer_log WHERE status = 'successful'"
            ).fetchone()  # type: ignore[misc]
        return int(n), float(last) if last is not None else None

    def send(self, workload: str, n: int) -> int:
        if workload == "burn_single":
            for _ in range(n):
                self._call("noop", None)
            return n

        async def go() -> None:
            import asyncpg
            from pgqueuer.db import AsyncpgDriver
            from pgqueuer.queries import Queries

            conn = await asyncpg.connect(self.dsn)
            try:
                q = Queries(AsyncpgDriver(conn))
                if workload == "chain":
                    await q.enqueue("chain", str(n).encode())
                else:
                    for i in range(0, n, 1000):  # batch inserts, 1,000 jobs a statement
                        k = min(1000, n - i)
                        await q.enqueue(["noop"] * k, [None] * k, [0] * k)
            finally:
                await conn.close()

        asyncio.run(go())
        return n


class Procrastinate:
    unable = {"fan": "no way to run a task after a group of others (no chords, no dependencies)"}

    def __init__(self, args: Any) -> None:
        import psycopg

        with psycopg.connect(args.pg, autocommit=True) as conn:
            conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        self.dsn = args.pg
        self.app = __getattr__("procrastinate_app")
        with self.app.open():
            self.app.schema_manager.apply_schema()
        self.opened: Any = None  # kept open for calls one at a time (latency)

    def done(self) -> tuple[int, float | None]:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            n, last = conn.execute(
                "SELECT count(*), extract(epoch FROM max(at)) FROM procrastinate_events WHERE type = 'succeeded'"
            ).fetchone()  # type: ignore[misc]
        return int(n), float(last) if last is not None else None

    def send(self, workload: str, n: int) -> int:
        with self.app.open():
            if workload == "chain":
                self.app.tasks["chain"].defer(left=n)
            elif workload == "burn_single":
                noop = self.app.tasks["noop"]
                for _ in range(n):
                    noop.defer()
            else:
                noop = self.app.tasks["noop"]
                for i in range(0, n, 1000):
                    noop.batch_defer(*([{}] * min(1000, n - i)))
        return n

    def one(self, intended: float) -> None:
        if not self.opened:
            self.opened = self.app.open()
        self.app.tasks["lat"].defer(intended=intended)

    def close(self) -> None:
        if self.opened:
            self.app.close()


SYSTEMS: dict[str, Any] = {"celery": Celery, "pgqueuer": PgQueuer, "procrastinate": Procrastinate}


def _pg_env(dsn: str) -> dict[str, str]:
    """libpq's variables for a postgresql:// URL (pgq's CLI reads these)."""
    from urllib.parse import urlsplit

    u = urlsplit(dsn)
    env = {"PGHOST": u.hostname or "", "PGPORT": str(u.port or 5432), "PGUSER": u.username or "",
           "PGDATABASE": u.path.lstrip("/")}  # fmt: skip
    if u.password:
        env["PGPASSWORD"] = u.password
    return env


def wait_for(system: Any, worker: Worker, count: int, timeout: float) -> tuple[int, float | None]:
    deadline = time.monotonic() + timeout
    n, last = 0, None
    while time.monotonic() < deadline:
        worker.sample()
        n, last = system.done()
        if n >= count:
            break
        time.sleep(0.05)
    return n, last


def serve_pgqueuer(concurrency: int) -> int:
    from pgqueuer import run

    # its defaults: 10 jobs a dequeue, async handlers in one process; a cap needs twice the batch size
    asyncio.run(run(_pgqueuer, max_concurrent_tasks=max(concurrency, 20)))
    return 0


def main() -> int:
    if sys.argv[1:2] == ["serve-pgqueuer"]:
        return serve_pgqueuer(int(sys.argv[3]))
    ap = argparse.ArgumentParser()
    ap.add_argument("system", choices=sorted(SYSTEMS))
    ap.add_argument("workload", choices=WORKLOADS)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--pg", default="")
    ap.add_argument("--redis", default="")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--log", default=str(HERE / "results" / "peer-worker.log.tmp"))
    ap.add_argument("--rates", default="", help="latency: the open-loop rates, tasks/s, comma-separated")
    ap.add_argument("--seconds", type=float, default=15.0, help="latency: how long each rate is sent")
    args = ap.parse_args()
    lat_file = Path(args.log).with_suffix(".latency")
    lat_file.unlink(missing_ok=True)
    os.environ.update(BENCH_PG=args.pg, BENCH_REDIS=args.redis, BENCH_LATENCY_FILE=str(lat_file))
    sys.path.insert(0, str(HERE))
    kind = SYSTEMS[args.system]
    if args.workload in kind.unable:
        print(json.dumps({"unable": kind.unable[args.workload]}))
        return 0
    system = kind(args)
    if args.workload == "latency":
        rates = [float(x) for x in args.rates.split(",") if x]
        if not rates:
            raise SystemExit("latency needs --rates (tasks/s, comma-separated)")
        print(json.dumps(latency(system, args, rates, lat_file)))
        system.close()
        return 0
    base = 0
    if args.workload == "burn_pre":  # everything enqueued first, then the worker starts
        count = system.send(args.workload, args.n)
        worker = Worker(args.system, args.concurrency, Path(args.log))
        start = worker.started
    else:  # the worker is up and has run a first task before the clock starts
        worker = Worker(args.system, args.concurrency, Path(args.log))
        wait_for(system, worker, system.send("burn_live", 1), 120)
        base, _ = system.done()
        start = time.time()
        count = system.send(args.workload, args.n)
    sent = time.time() - start
    n, last = wait_for(system, worker, base + count, args.timeout)
    out: dict[str, Any] = worker.stop()
    took = last - start if last is not None and n >= base + count else None
    out.update(tasks=count, ran=n - base, send_seconds=round(sent, 3), seconds=round(took, 3) if took else None)
    print(json.dumps(out))
    system.close()
    return 0


def latency(system: Any, args: Any, rates: list[float], lat_file: Path) -> dict[str, Any]:
    """Open loop at each rate in turn (a warm worker; each level drained before the next)."""
    worker = Worker(args.system, args.concurrency, Path(args.log))
    wait_for(system, worker, system.send("burn_live", 1), 120)
    base, _ = system.done()
    levels, seen, started_at = [], 0, time.time()
    for rate in rates:
        n = max(10, int(rate * args.seconds))
        _, late = open_loop(rate, n, system.one)
        base += n
        ran, _ = wait_for(system, worker, base, args.timeout)
        lines = lat_file.read_text().splitlines() if lat_file.exists() else []
        mine = [ln.split() for ln in lines[seen:]]
        seen = len(lines)
        levels.append({
            "rate_tasks_per_s": round(rate, 2), "tasks": n, "ran": len(mine),
            "submit_to_start_ms": percentiles_ms([float(b) - float(a) for a, b in mine]),
            "sender_late_ms_max": round(late * 1000, 1),
        })  # fmt: skip
    out: dict[str, Any] = worker.stop()
    total = sum(lv["tasks"] for lv in levels)
    out.update(levels=levels, tasks=total, ran=sum(lv["ran"] for lv in levels),
               seconds=round(time.time() - started_at, 3))  # fmt: skip
    return out


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no finalizers: Celery's AsyncResult.__del__ fails at interpreter shutdown
