"""Benchmark: dispatch throughput of no-op callable tasks on the embedded stack.

Two workloads, each on a fresh stack: --tasks no-op callables (`os:getpid`) submitted as one DAG without
edges, and as that many one-task submissions. Tasks/s is counted from the first send to the last
success (the success's event time, from PostgreSQL once every task is there). CPU seconds per task are
read per service from /proc, each service with the processes under it (a worker's keeper and runners,
the JVMs), over the same interval.

    python bench/throughput.py [--engines kafka|fallback|both] [--tasks 10000] [--runs 1]
                               [--workload dag|single|both] [--warm-seconds 180] [--profile SECONDS]
                               [--set NAME=VALUE ...]

Every run is on one stack, after the workloads have run on it for --warm-seconds (180; not counted;
each run's tasks are a tenant of their own): the figures of a stack that has been up a while, its
JVMs' JIT compilers done with the hot paths (docs/measurements.md, "A stack that has been up a
while"). --warm-seconds 0 gives each run a fresh stack instead (a stack's first minute), to
throughput-<pair>-fresh.json.

Each run also gives two hops per task, from the tasks' transition times in PostgreSQL (p10, p50, p90):
claim request -> start (the claim's round trip and any wait for a slot) and start -> finish (the run).
And the machine's busy and stolen shares over the run (/proc/stat), as bench/latency.py gives them,
and its speed (`speed_probe_ms`, _stack.SpeedProbe: a fixed piece of work's CPU milliseconds every half
second through the run; more is slower): compare runs of two versions beside it. And the worker's
event loop (its main thread, from /proc's schedstat): the shares of the run it was on a CPU and it
waited in the run queue for one (`worker_event_loop`; from just before the first send until the
bench's poll sees the last success, up to half a second after it): once tasks flow the loop is the limit, and
what the other processes take of the two cores it waits for.
And its phases (`phases`), from the same times: seconds from the first send until 1% of the tasks
were queued and started (the ramp: the admission's, the owner's and the read model's work before a
steady flow); the steady rate (the tasks started between the 10th and 90th percentile start,
over that span); and the share of that span with no task starting for over 20 ms (the runners idle
while claims wait for the event loop or for promotions).
--set runs the stack with a setting changed (TASKSTREAM_<NAME>), to throughput-<pair>-set.json.
--profile records the worker with py-spy (if installed) for that many seconds into
bench/results/throughput-worker-<pair>-<workload>.stacks (raw stacks, not kept in git: profiles are
per machine) and adds each part's share of the samples to the results. Writes
bench/results/throughput-<pair>.json (throughput-<pair>-profile.json with --profile).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _stack import (
    SpeedProbe,
    add_set_option,
    embedded_stack,
    kinds,
    machine_shares,
    machine_ticks,
    services,
    set_settings,
    settings_of,
    summary,
    thread_shares,
    tree_cpu,
    when,
    worker_loop_times,
    write_report,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
GIVE_UP_S = 1800.0
NOOP = {"call": "os:getpid"}


# Where a worker's samples are, by the frames they pass through (a sample counts once per group).
PROFILE_GROUPS = {
    "waiting (the event loop's epoll, the child watcher's waitpid)": ("EpollSelector.select", "_do_waitpid"),
    "lifecycle decisions (streams/lifecycle.py)": ("streams/lifecycle.py",),
    "executor: claim, run, report (streams/worker.py)": ("streams/worker.py",),
    "producing (Context.send_all, aiokafka producer)": ("Context.send_all", "aiokafka/producer"),
    "Avro encode/decode (schemas/codec.py)": ("schemas/codec.py",),
    "table writes (Faust tables, rocksdict)": ("faust/tables", "faust/stores"),
    "Faust stream/conductor/consumer machinery": ("faust/streams.py", "faust/transport"),
    "aiokafka fetch": ("aiokafka/consumer",),
}


def where_the_time_goes(stacks: Path) -> dict[str, float]:
    """Share of the worker's samples (py-spy raw stacks, `frame;frame;... count`) passing through each
    group's frames. Groups overlap: a lifecycle decision that encodes Avro counts in both. py-spy counts
    a thread blocked in epoll or waitpid as busy: that share is waiting, not CPU."""
    totals = dict.fromkeys(PROFILE_GROUPS, 0)
    n = 0
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n += int(count)
        for group, needles in PROFILE_GROUPS.items():
            if any(needle in stack for needle in needles):
                totals[group] += int(count)
    return {g: round(c / n, 3) for g, c in sorted(totals.items(), key=lambda kv: -kv[1])} if n else {}


# Each task's time between two of its transitions, as the events stamped them (worker clock for the
# claim, start and finish): the claim's round trip and a slot's wait, then the run itself.
HOPS = {"claim request -> start": ("claimed_at", "started_at"), "start -> finish": ("started_at", "finished_at")}
# every query is about one run's tasks: its own tenant (a warmed stack holds the warm-up's tasks too)
HOP = (
    "SELECT percentile_cont(ARRAY[0.1, 0.5, 0.9]) WITHIN GROUP "
    "(ORDER BY extract(epoch FROM {b} - {a}) * 1000) FROM tasks "
    "WHERE tenant = %s AND {a} IS NOT NULL AND {b} IS NOT NULL"
)


STARTS = (
    "SELECT extract(epoch FROM started_at) FROM tasks WHERE tenant = %s AND started_at IS NOT NULL ORDER BY started_at"
)
FIRSTS = (
    "SELECT percentile_disc(0.01) WITHIN GROUP (ORDER BY extract(epoch FROM {c})) FROM tasks "
    "WHERE tenant = %s AND {c} IS NOT NULL"
)
GAP_S = 0.02


def phases(conn: Any, tenant: str, first_send: float) -> dict[str, Any]:
    """The run's ramp, steady rate and idle share (the module's docstring)."""
    firsts = {}
    for name, col in (("queued", "queued_at"), ("started", "started_at")):
        (at,) = conn.execute(FIRSTS.format(c=col), (tenant,)).fetchone()
        firsts[name] = round(float(at) - first_send, 3) if at is not None else None
    starts = [float(t) for (t,) in conn.execute(STARTS, (tenant,)).fetchall()]
    if len(starts) < 10:
        return {"s_until_1pct": firsts}
    lo, hi = starts[len(starts) // 10], starts[len(starts) * 9 // 10]
    steady = [t for t in starts if lo <= t <= hi]
    idle = sum(b - a for a, b in zip(steady, steady[1:], strict=False) if b - a > GAP_S)
    return {
        "s_until_1pct": firsts,
        "steady_tasks_per_second": round((len(steady) - 1) / (hi - lo), 1) if hi > lo else None,
        "steady_share_without_a_start_over_20ms": round(idle / (hi - lo), 3) if hi > lo else None,
    }


def once(kind: str, workload: str, n: int, profile: float, extra: dict[str, str]) -> dict[str, Any]:
    """One run on a fresh stack."""
    with embedded_stack(kind, **extra) as env:
        return measured(env, kind, workload, n, profile, "bench")


def warm_up(env: dict[str, str], kind: str, workloads: list[str], n: int, seconds: float) -> int:
    """Run the workloads in turn on the stack until `seconds` have passed (their figures are not kept):
    the JVMs' compilers and every process's caches reach the state a stack that has been up a while is
    in. Returns how many runs it took."""
    until, k = time.monotonic() + seconds, 0
    while time.monotonic() < until:
        workload = workloads[k % len(workloads)]
        run = measured(env, kind, workload, n, 0.0, f"warm{k}")
        print(f"{kind} warm-up {k + 1} ({workload}): {run['tasks_per_second']} tasks/s", flush=True)
        k += 1
    return k


def measured(env: dict[str, str], kind: str, workload: str, n: int, profile: float, tenant: str) -> dict[str, Any]:
    """One run on the running stack `env`: n no-op tasks of `tenant` (a tenant no other run uses)."""
    import psycopg

    from taskstream.core.submission import parse_document
    from taskstream.sdk import Client

    s = settings_of(env)
    pids = services(env)
    before = {name: tree_cpu(pid) for name, pid in pids.items()}
    ticks = machine_ticks()
    spy = None
    stacks = RESULTS / f"throughput-worker-{kind}-{workload}.stacks"
    if profile and shutil.which("py-spy"):
        spy = subprocess.Popen(
            ["py-spy", "record", "-p", str(pids["worker-0"]), "-d", str(int(profile)), "--format", "raw",
             "-o", str(stacks), "-s"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
    probe = SpeedProbe().start()  # through the run, until the last success is seen
    loop_before = worker_loop_times(pids.get("worker-0"))
    try:
        with Client(s, issuer="bench") as client:
            first_send = time.time()
            if workload == "dag":
                doc = {"tenant": tenant, "tasks": [{"name": f"t{i}", **NOOP} for i in range(n)]}
                client.submit(parse_document(doc))
            else:  # one command per task, produced back to back (Client.submit_many)
                client.submit_many(
                    parse_document({"tenant": tenant, "tasks": [{"name": f"t{i}", **NOOP}]}) for i in range(n)
                )
            sent = time.time() - first_send
        deadline = time.monotonic() + GIVE_UP_S
        done = 0
        with psycopg.connect(s.dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                (done,) = conn.execute(
                    "SELECT count(*) FROM tasks WHERE tenant = %s AND status = 'SUCCEEDED'", (tenant,)
                ).fetchone()  # type: ignore[misc]
                if done >= n:
                    break
                time.sleep(0.5)
            (last,) = conn.execute(
                "SELECT extract(epoch FROM max(finished_at)) FROM tasks WHERE tenant = %s", (tenant,)
            ).fetchone()  # type: ignore[misc]
            (others,) = conn.execute(
                "SELECT count(*) FROM tasks WHERE tenant = %s AND status <> 'SUCCEEDED'", (tenant,)
            ).fetchone()  # type: ignore[misc]
            hops = {name: conn.execute(HOP.format(a=a, b=b), (tenant,)).fetchone()[0] for name, (a, b) in HOPS.items()}  # type: ignore[index]
            shape = phases(conn, tenant, first_send)
    finally:
        probe.stop()
    loop_after = worker_loop_times(pids.get("worker-0"))
    loop = thread_shares(loop_before, loop_after) if loop_before and loop_after else None
    after = {name: tree_cpu(pid) for name, pid in pids.items()}
    machine = machine_shares(ticks, machine_ticks())
    if spy is not None:
        spy.wait()
    took = float(last) - first_send if last is not None else None
    cpu = {name: round((after[name] - before[name]) / max(done, 1) * 1000, 3) for name in pids}
    where = where_the_time_goes(stacks) if spy is not None and stacks.exists() else None
    return {
        **({"worker_profile_share": where} if where else {}),
        "workload": workload,
        "tasks": n,
        "succeeded": done,
        "not_succeeded": others,
        "send_seconds": round(sent, 3),
        "first_send_to_last_success_s": round(took, 3) if took else None,
        "tasks_per_second": round(done / took, 1) if took else None,
        "cpu_ms_per_task": cpu,
        "cpu_ms_per_task_total": round(sum(cpu.values()), 3),
        "hop_ms_p10_p50_p90": {name: [round(float(x), 1) for x in v] if v else None for name, v in hops.items()},
        "phases": shape,
        "machine": machine,
        **({"worker_event_loop": loop} if loop else {}),
        "speed_probe_ms": probe.summary(),
    }


def waiting_for_a_core(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The worker's event loop's waits for a core over the runs that have the figure (a run whose worker
    was not one of the stack's services, or was gone by its end, has none)."""
    waits = [r["worker_event_loop"]["waiting_for_a_core"] for r in runs if "worker_event_loop" in r]
    return {"worker_event_loop_waiting_for_a_core": summary(waits)} if waits else {}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", choices=("kafka", "fallback", "both"), default="kafka")
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--workload", choices=("dag", "single", "both"), default="both")
    ap.add_argument("--profile", type=float, default=0.0, help="py-spy the worker for this many seconds")
    ap.add_argument(
        "--warm-seconds",
        type=float,
        default=180.0,
        help="run every run on one stack, after running the workloads on it for this long (0: a fresh stack per run)",
    )
    add_set_option(ap)
    args = ap.parse_args()
    if args.warm_seconds < 0:
        ap.error("--warm-seconds cannot be negative")
    extra = set_settings(ap, args.set)
    workloads = ["dag", "single"] if args.workload == "both" else [args.workload]
    for kind in kinds(args.engines):
        report: dict[str, Any] = {
            "benchmark": "no-op callables (os:getpid) from the first send to the last success",
            "engines": kind,
            "aim": "1,000 tasks/s end to end on 2 cores, every service local",
            "settings": extra,
            "stack": "a fresh stack per run"
            if not args.warm_seconds
            else f"one stack for every run, after {args.warm_seconds:g} s of the same workloads on it",
        }
        with contextlib.ExitStack() as shared:
            env = None
            if args.warm_seconds:
                env = shared.enter_context(embedded_stack(kind, **extra))
                report["warm_up_runs"] = warm_up(env, kind, workloads, args.tasks, args.warm_seconds)
            for workload in workloads:
                runs = []
                for i in range(args.runs):
                    profile = args.profile if i == 0 else 0.0
                    if env is None:
                        runs.append(once(kind, workload, args.tasks, profile, extra))
                    else:
                        runs.append(measured(env, kind, workload, args.tasks, profile, f"bench-{workload}-{i}"))
                    print(f"{kind} {workload} run {i + 1}: {runs[-1]}", flush=True)
                report[workload] = {
                    "when": when(),
                    "tasks_per_second": summary([r["tasks_per_second"] for r in runs]),
                    "cpu_ms_per_task_total": summary([r["cpu_ms_per_task_total"] for r in runs]),
                    "speed_probe_ms": summary([r["speed_probe_ms"]["median"] for r in runs]),
                    **waiting_for_a_core(runs),
                    "each_run": runs,
                }
        report["when"] = when()
        # a profiled run is slowed by py-spy: its figures go to a file of their own; so do fresh
        # stacks' and a changed setting's
        suffix = (
            ("-profile" if args.profile else "") + ("" if args.warm_seconds else "-fresh") + ("-set" if extra else "")
        )
        path = RESULTS / f"throughput-{kind}{suffix}.json"
        if path.exists():  # a run of one workload keeps the other's last figures (each has its "when")
            kept = json.loads(path.read_text())
            report.update({w: kept[w] for w in ("dag", "single") if w not in report and w in kept})
        write_report(path, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
