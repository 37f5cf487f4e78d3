"""A promotion round of the batcher with 10,000 to 1,000,000 tasks waiting in PostgreSQL (issue 13, item 8).

One embedded stack with no Faust worker (so no batcher runs on its own); its read model is filled with
READY tasks of 20 tenants (one of them with a cap), deadlines spread over an hour and priorities 0-9,
some tasks queued and running, written straight into the tables (COPY) as the projector would leave
them; four live workers are given to the round as the workers topic would. At each size the batcher's
own round (`Batcher.choose`: every query and the pure plan, without sending) is timed 30 times, with
K from the workers' capacity (each 4 slots, 4 claim_ahead, 64 ahead: K = 288 less what is taken).
Prints and writes `bench/results/batcher.json`: median and p90 per size, and the growth from 10k to 1M.

    python bench/batcher_bench.py [--sizes 10000,100000,1000000] [--rounds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _stack import embedded_stack, settings_of, when, write_report  # noqa: E402
from taskstream.streams.batcher import Batcher  # noqa: E402

from taskstream.core.batcher import Offer  # noqa: E402

TENANTS = [f"tenant-{i:02d}" for i in range(20)]
COLS = ("task_id", "submission_id", "name", "tenant", "status", "version", "argv", "env", "cpu", "memory_mb", "gpu",
        "execution_cap_ms", "retry_limit", "backoff", "delay_tolerance_ms", "priority", "dependencies", "labels",
        "submitted_at", "updated_at", "ready_at", "promote_by")  # fmt: skip


def rows(n: int, status: str, rng: random.Random, t0: datetime) -> Any:
    sid = uuid.uuid4()
    for i in range(n):
        ready = t0 + timedelta(milliseconds=rng.randrange(3_600_000))
        tol = rng.choice((0, 0, 60_000, 600_000))
        deadline = (ready + timedelta(milliseconds=tol)).replace(microsecond=0)
        yield (uuid.uuid4(), sid, f"t{i}", rng.choice(TENANTS), status, 3, [], "{}", rng.choice((0.5, 1.0, 2.0)), 256,
               0, 3_600_000, 0, "{}", tol, rng.randrange(10), [], "{}", ready, ready, ready, deadline)  # fmt: skip


def fill(dsn: str, n: int, status: str, rng: random.Random) -> None:
    t0 = datetime.now(UTC) - timedelta(hours=2)
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY tasks ({', '.join(COLS)}) FROM STDIN") as copy:
            for row in rows(n, status, rng, t0):
                copy.write_row(row)
        conn.commit()


def prepare(dsn: str) -> None:
    now = datetime.now(UTC)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in TENANTS:
            conn.execute(
                "INSERT INTO tenants (tenant, first_seen, last_submission, max_running) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                (t, now, now, 10 if t == TENANTS[0] else None),
            )


async def time_rounds(settings: Any, rounds: int) -> tuple[list[float], int]:
    ctx = SimpleNamespace(settings=settings, now_ms=lambda: int(time.time() * 1000))
    batcher = Batcher(ctx, lambda: True)  # type: ignore[arg-type]
    offers = [Offer(f"bench-w{w}", 4, 4, 4.0, 8192, 0) for w in range(4)]  # four live workers
    took: list[float] = []
    chosen = 0
    async with await psycopg.AsyncConnection.connect(settings.dsn, autocommit=True) as conn:
        await conn.execute("ANALYZE tasks")
        for _ in range(rounds + 3):  # three to warm the caches
            t = time.perf_counter()
            picked = await batcher.choose(conn, offers)
            took.append(time.perf_counter() - t)
            chosen = len(picked)
    return took[3:], chosen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    rng = random.Random(7)
    results = []
    with embedded_stack("kafka", workers="0") as env:
        s = settings_of(env)
        prepare(s.dsn)
        fill(s.dsn, 40, "RUNNING", rng)
        have = 0
        for n in sizes:
            t = time.perf_counter()
            fill(s.dsn, n - have, "READY", rng)
            have = n
            took, chosen = asyncio.run(time_rounds(s, args.rounds))
            ms = sorted(x * 1000 for x in took)
            row = {
                "waiting": n,
                "promoted_per_round": chosen,
                "round_ms_median": round(statistics.median(ms), 2),
                "round_ms_p90": round(ms[int(0.9 * (len(ms) - 1))], 2),
                "fill_s": round(time.perf_counter() - t, 1),
            }
            print(row, flush=True)
            results.append(row)
    growth = round(results[-1]["round_ms_median"] / results[0]["round_ms_median"], 2) if len(results) > 1 else None
    report = {"when": when(), "rounds_per_size": args.rounds, "sizes": results, "growth_first_to_last": growth}
    print(f"round time grows {growth}x from {sizes[0]:,} to {sizes[-1]:,} waiting")
    write_report(Path(__file__).resolve().parent / "results" / "batcher.json", report)


if __name__ == "__main__":
    main()
