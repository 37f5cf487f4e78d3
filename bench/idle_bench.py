"""Benchmark: what an idle embedded stack costs, per process: CPU (share of one core) and RSS, the JVMs
included, on each engine pair (Apache Kafka + Neo4j, and the noida-db + Ladybug fallback). Also how long
`taskstream up` (warm: jars and class-data archives cached) and `down` take.

After `up` and a settling pause, CPU is sampled over --windows windows of --seconds each (median and
range per process); RSS is read at the end. Writes bench/results/idle-<pair>.json.

    python bench/idle_bench.py [--engines kafka|fallback|both] [--windows 3] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _stack import KINDS, PORTS, cpu_seconds, free_port, kinds, rss_mib, services, summary, when, write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[3:])} failed:\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", choices=("kafka", "fallback", "both"), default="both")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--settle", type=float, default=15.0)
    args = ap.parse_args()
    cli = [sys.executable, "-m", "taskstream"]
    for kind in kinds(args.engines):
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
        env["TASKSTREAM_STATE_DIR"] = tempfile.mkdtemp(prefix=f"taskstream-idle-{kind}-")
        env.update({f"TASKSTREAM_{n}_PORT": str(free_port()) for n in PORTS})
        env.update(KINDS[kind])
        first_up = timed([*cli, "up"], env)  # a new state directory: formats, sets the password
        first_down = timed([*cli, "down"], env)
        up = timed([*cli, "up"], env)  # the same directory again: what a user waits for every day
        try:
            time.sleep(args.settle)
            pids = services(env)
            windows: dict[str, list[float]] = {n: [] for n in pids}
            for _ in range(args.windows):
                before = {n: cpu_seconds(pid) for n, pid in pids.items()}
                time.sleep(args.seconds)
                for n, pid in pids.items():
                    windows[n].append(100 * (cpu_seconds(pid) - before[n]) / args.seconds)
            rss = {n: round(rss_mib(pid)) for n, pid in pids.items()}
        finally:
            down = timed([*cli, "down"], env)
            shutil.rmtree(env["TASKSTREAM_STATE_DIR"], ignore_errors=True)
        cpu = {n: summary(v) for n, v in windows.items()}
        report = {
            "benchmark": "an idle embedded stack",
            "engines": kind,
            "broker": KINDS[kind]["TASKSTREAM_BROKER"],
            "graph": KINDS[kind]["TASKSTREAM_GRAPH_BACKEND"],
            "cpu_percent_of_one_core": cpu,
            "cpu_percent_total_median": round(sum(c["median"] for c in cpu.values()), 1),
            "rss_mib": rss,
            "rss_mib_total": sum(rss.values()),
            "first_up_seconds": round(first_up, 1),
            "first_down_seconds": round(first_down, 1),
            "up_seconds": round(up, 1),
            "down_seconds": round(down, 1),
            "how": f"{args.windows} windows of {args.seconds:g} s after {args.settle:g} s of settling",
            "when": when(),
        }
        write_report(RESULTS / f"idle-{kind}.json", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
