"""Benchmark: submit -> start latency of ready no-op tasks, open loop, and a 40-task chain's total time.

On an embedded stack of its own, after --warm one-task submissions and the warm-up loop below, neither
counted: first a burst,
--probe one-task submissions of a no-op callable (`os:getpid`) sent back to back
(`Client.submit_many`) (tasks/s from the first send to the last success). A burst is admitted in a
few large transactions, a steady stream in one transaction per submission, so an open loop keeps up
with about half the burst's rate. The maximum rate is therefore the highest rate an open loop keeps
up with, found by bisection between 0 and the burst's rate in --search-steps loops of
--search-seconds each (`kept_up`: the backlog did not grow); the upper bound doubles while every loop
so far kept up and came within a tenth of it, and a search in which none fell behind says its
maximum is a lower bound.
Then, at 25, 50 and 75% of that maximum (or at the fixed rates of --rates, in tasks/s, without the
search: runs of one code against another compare at the same rates, where each run's own maximum
moved them by half between runs an hour apart), one-task submissions sent open loop for --seconds
each: every send has
an intended time (start + i / rate), and latency counts from that time, so a sender that falls behind
shows as latency instead of hiding it. The sender sends every submission due by now in one call
(`Client.submit_many`, each still a submission of its own): one call per submission, a produce and a
wait for the broker each (~5-8 ms), fell behind from about 150/s on, and that was the sender's limit,
not the scheduler's. Submit -> start is the TaskStarted's event time minus the
intended send time. Each hop's share is measured on the wall clock, from the times the broker keeps:
the event times PostgreSQL keeps are decision times (admission decides at the command's log time, the
owner at its input's), so they say nothing of where the time goes. The hops:
  sender: intended send -> the command's log time (the client's produce);
  admission: the command -> the admitter's TasksAdmitted record (consume, decide, produce);
  owner: TasksAdmitted -> the owner's record of the TaskReady (the admission transaction's commit,
    the owner's fetch and Faust's delivery, its batch of decisions);
  batcher: -> the owner's record of the TaskClaimed: 0 for a task its owner queued and claimed in the
    step that made it ready (streams/worker.LocalClaims), else the wait for the batcher's round, its
    Promote through the broker and the claim (`claimed_at_once` says how many were);
  start: that record -> the TaskStarted's event time (the write's round trip, the hand-over, the
    runner starting the call).
Each level also says what it cost: every service's CPU per task (its process tree's, from the first
send to the last success) and the machine's busy and stolen shares over that span, and how fast the
machine was meanwhile (`speed_probe_ms`, _stack.SpeedProbe: a fixed piece of work's CPU milliseconds
every half second; more is slower): these cores' speed moves within the hour, and the latency with it.
Last, a chain of 40 no-op callables: from its send to the last task's success.

    python bench/latency.py [--engines kafka|fallback|both] [--warm 300] [--warm-seconds 120] [--warm-rate 100]
                            [--probe 300] [--seconds 20]
                            [--search-seconds 8] [--search-steps 5] [--rates 20,100,...]
                            [--set NAME=VALUE ...]

After the --warm submissions, an open loop at --warm-rate (100/s) for --warm-seconds (120), not
counted: the JVMs' JIT compilers are done with the hot paths before anything is measured, as in a
stack that has been up a while (docs/measurements.md, "A stack that has been up a while");
--warm-seconds 0 measures a stack's first minutes instead.

Writes bench/results/latency-<pair>.json (-rates, -fresh and -set before .json: fixed rates, no
--warm-seconds, a changed setting).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from _stack import (
    SpeedProbe,
    add_set_option,
    embedded_stack,
    kinds,
    machine_shares,
    machine_ticks,
    percentiles_ms,
    services,
    set_settings,
    settings_of,
    tree_cpu,
    when,
    write_report,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
NOOP = {"call": "os:getpid"}
HOPS = ("sender", "admission", "owner", "batcher", "start")
GROWTH_S = 0.1  # see kept_up
SETTLED_S = 0.2


def event_ends(s: Any) -> dict[int, int]:
    """The events topic's end offset per partition: where a level's records begin."""
    from confluent_kafka import TopicPartition
    from taskstream.connectors.kafka import consumer

    c = consumer(s, group=f"bench-latency-{uuid.uuid4().hex[:8]}")
    try:
        topic = s.topic("events")
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(s.partitions)}
    finally:
        c.close()


def record_times(s: Any, codec: Any, since: dict[int, int]) -> dict[str, dict[str, float]]:
    """Task id -> the log times (s) of the records that carried its TasksAdmitted, its TaskReady and
    its first TaskClaimed (and, under "ready@" and "claimed@", the offsets of the last two), and its
    first TaskStarted's event time; read from `since` to the end."""
    from confluent_kafka import TopicPartition
    from taskstream.connectors.kafka import consumer
    from taskstream.schemas.records import TaskEvents, TasksAdmitted

    topic = s.topic("events")
    c = consumer(s, group=f"bench-latency-{uuid.uuid4().hex[:8]}")
    out: dict[str, dict[str, float]] = {}
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in since}
        c.assign([TopicPartition(topic, p, o) for p, o in since.items() if o < ends[p]])
        left = {p for p, o in since.items() if o < ends[p]}
        quiet = 0
        while left and quiet < 5:  # the last offsets may be transaction markers, never delivered
            batch = c.consume(1000, 1.0)
            quiet = 0 if batch else quiet + 1
            for part in c.position([TopicPartition(topic, p) for p in left]):
                if part.offset >= ends[part.partition]:
                    left.discard(part.partition)
            for m in batch:
                if m.error():
                    continue
                at = m.timestamp()[1] / 1000
                p = codec.decode("event", m.value()).payload
                if type(p) is TasksAdmitted:
                    for t in p.tasks:
                        out.setdefault(t.task_id, {}).setdefault("admitted", at)
                elif type(p) is TaskEvents:
                    for e in p.events:
                        kind = type(e.payload).__name__
                        if kind in ("TaskReady", "TaskClaimed"):
                            key = "ready" if kind == "TaskReady" else "claimed"
                            t = out.setdefault(e.task_id, {})
                            if key not in t:
                                t[key], t[f"{key}@"] = at, m.offset()  # the record: one or two
                        elif kind == "TaskStarted":
                            out.setdefault(e.task_id, {}).setdefault("started", e.event_ms / 1000)
    finally:
        c.close()
    return out


def one_task(tag: str) -> Any:
    from taskstream.core.submission import parse_document

    return parse_document({"tenant": "bench", "tasks": [{"name": tag, **NOOP}]})


def hop_shares(hops: dict[str, list[float]]) -> dict[str, float]:
    """Each hop's median as a share of the sum of the medians."""
    medians = {h: max(0.0, statistics.median(v)) for h, v in hops.items() if v}
    total = sum(medians.values())
    return {h: round(m / total, 3) for h, m in medians.items()} if total > 0 else {}


def wait_done(conn: Any, tenant_tasks: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        (n,) = conn.execute("SELECT count(*) FROM tasks WHERE status = 'SUCCEEDED'").fetchone()
        if n >= tenant_tasks:
            return
        time.sleep(0.3)
    raise SystemExit(f"only {n} of {tenant_tasks} tasks succeeded within {timeout:.0f}s")


def open_loop(client: Any, rate: float, n: int, tag: str) -> dict[str, float]:
    """Send `n` one-task submissions at `rate` a second, open loop: submission id -> its intended send
    time. Every send due by now goes in one call (`Client.submit_many`, each still a submission of its
    own), so the sender keeps up."""
    intended: dict[str, float] = {}
    start = time.time() + 0.2
    i = 0
    while i < n:
        pause = start + i / rate - time.time()
        if pause > 0:
            time.sleep(pause)
        now, j = time.time(), i + 1
        while j < n and start + j / rate <= now:
            j += 1
        sent = client.submit_many(one_task(f"{tag}-{k}") for k in range(i, j))
        for k, (_, sid) in zip(range(i, j), sent, strict=True):
            intended[sid] = start + k / rate
        i = j
    return intended


def lateness(conn: Any, tag: str, intended: dict[str, float]) -> list[float]:
    """Submit -> start (s) of the tasks of one open loop, in the order they were meant to be sent."""
    rows = conn.execute(
        "SELECT t.submission_id::text, extract(epoch FROM a.started_at) FROM tasks t "
        "JOIN attempts a USING (task_id) WHERE t.name LIKE %s AND a.attempt = 1",
        (f"{tag}-%",),
    ).fetchall()
    return [float(started) - intended[sid] for sid, started in sorted(rows, key=lambda row: intended[row[0]])]


def quarters(late: list[float]) -> tuple[float, float]:
    """The median lateness (s) of the first and of the last quarter of an open loop's tasks."""
    q = max(1, len(late) // 4)
    return statistics.median(late[:q]), statistics.median(late[-q:])


def kept_up(first: float, last: float) -> bool:
    """Whether an open loop kept up, from its first and last quarters' median lateness (`quarters`): the
    last did not start later than the first by more than GROWTH_S (a backlog that grows shows there: 5%
    over the capacity for 8 s is ~0.4 s), or started within SETTLED_S anyway."""
    return last <= SETTLED_S or last <= first + GROWTH_S


def sustained_maximum(
    client: Any, conn: Any, done: int, burst: float, seconds: float, steps: int
) -> tuple[float, list[dict[str, Any]], int, bool]:
    """The highest rate an open loop keeps up with (`kept_up`), by bisection between 0 and the burst's
    rate, `steps` loops of `seconds` each: (the highest rate kept up with, each loop's figures, the
    tasks that have succeeded by the end, whether some loop fell behind). A burst is admitted in a few
    large transactions and a steady stream in one per submission, so the burst's rate is usually about
    twice this (docs/measurements.md). Not always: a slow burst (326.6/s once, where an open loop kept
    up with 316.4/s) capped the search below what the stack carries. So while no loop has fallen
    behind, a rate kept up with within a tenth of the upper bound doubles the bound. If none ever falls
    behind, the rate found is only a lower bound (the fourth item, False)."""
    lo, hi, tried = 0.0, burst, []
    fell_behind = False
    for step in range(steps):
        rate = (lo + hi) / 2
        n = max(10, int(rate * seconds))
        tag = f"m{step}-{uuid.uuid4().hex[:6]}"
        intended = open_loop(client, rate, n, tag)
        done += n
        wait_done(conn, done)
        first, last = quarters(lateness(conn, tag, intended))
        ok = kept_up(first, last)
        tried.append(
            {
                "rate_tasks_per_s": round(rate, 2),
                "kept_up": ok,
                "first_quarter_p50_ms": round(first * 1000, 1),
                "last_quarter_p50_ms": round(last * 1000, 1),
            }
        )
        print(f"  open loop at {rate:.1f}/s: {'kept up' if ok else 'fell behind'} {tried[-1]}", flush=True)
        if ok:
            lo = rate
            if not fell_behind and hi - rate < 0.1 * hi:
                hi *= 2
        else:
            hi, fell_behind = rate, True
        time.sleep(1.0)  # the stack settles before the next loop
    return lo, tried, done, fell_behind


def rates_arg(text: str) -> list[float]:
    """--rates: positive tasks/s, comma-separated."""
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rates in tasks/s separated by commas, got {text!r}") from None
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError(f"expected positive rates in tasks/s, got {text!r}")
    return rates


def main() -> int:
    import psycopg

    from taskstream.core.submission import parse_document
    from taskstream.sdk import Client

    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", choices=("kafka", "fallback", "both"), default="kafka")
    ap.add_argument("--probe", type=int, default=300)
    ap.add_argument("--warm", type=int, default=300, help="one-task submissions run before the probe, not counted")
    ap.add_argument(
        "--warm-seconds",
        type=float,
        default=120.0,
        help="then an open loop at --warm-rate for this long, not counted (a stack that has been up a while)",
    )
    ap.add_argument("--warm-rate", type=float, default=100.0, help="tasks/s of the --warm-seconds loop")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rates", type=rates_arg, default=None, help="fixed rates (tasks/s, comma-separated)")
    ap.add_argument("--search-seconds", type=float, default=8.0, help="each open loop of the maximum's search")
    ap.add_argument("--search-steps", type=int, default=5, help="open loops in the maximum's search")
    add_set_option(ap)
    args = ap.parse_args()
    if args.search_steps < 1 or args.search_seconds <= 0:
        ap.error("--search-steps must be at least 1 and --search-seconds more than 0")
    if args.warm_seconds < 0 or args.warm_rate <= 0:
        ap.error("--warm-seconds cannot be negative and --warm-rate must be more than 0")
    extra = set_settings(ap, args.set)
    for kind in kinds(args.engines):
        with embedded_stack(kind, **extra) as env:
            s = settings_of(env)
            from taskstream.connectors.kafka import make_codec

            codec = make_codec(s)
            conn = psycopg.connect(s.dsn, autocommit=True)
            total = 0
            with Client(s, issuer="bench") as client:
                # the burst's rate, once the stack has run a first burst (its first tasks pay for the
                # JIT and the connections: a rate from a cold stack varied 108-349/s between runs)
                client.submit_many(one_task(f"warm{i}") for i in range(args.warm))
                total += args.warm
                wait_done(conn, total)
                if args.warm_seconds:
                    n = max(1, int(args.warm_rate * args.warm_seconds))
                    open_loop(client, args.warm_rate, n, "warmloop")
                    total += n
                    wait_done(conn, total)
                    print(f"{kind}: warmed up with {n} submissions at {args.warm_rate:g}/s", flush=True)
                t0 = time.time()
                client.submit_many(one_task(f"probe{i}") for i in range(args.probe))
                total += args.probe
                wait_done(conn, total)
                (last,) = conn.execute("SELECT extract(epoch FROM max(finished_at)) FROM tasks").fetchone()
                burst_rate = args.probe / (float(last) - t0)
                print(f"{kind}: a burst of {args.probe} ran at {burst_rate:.1f} tasks/s", flush=True)
                search: list[dict[str, Any]] = []
                bounded = True  # some loop of the search fell behind (or there was no search)
                if args.rates:
                    max_rate = burst_rate
                else:  # the levels' base: the highest rate an open loop keeps up with
                    max_rate, search, total, bounded = sustained_maximum(
                        client, conn, total, burst_rate, args.search_seconds, args.search_steps
                    )
                    floor = "" if bounded else " (a lower bound: every loop of the search kept up)"
                    print(f"{kind}: maximum rate kept up with {max_rate:.1f} tasks/s{floor}", flush=True)
                levels: dict[str, Any] = {}
                pids = services(env)
                if args.rates:
                    plan = [(f"{rate:g}/s", rate) for rate in args.rates]
                else:
                    plan = [(f"{int(share * 100)}%", max_rate * share) for share in (0.25, 0.5, 0.75)]
                for name, rate in plan:
                    n = max(10, int(rate * args.seconds))
                    tag = f"r{int(rate)}-{uuid.uuid4().hex[:6]}"
                    cpu_before, ticks_before = {k: tree_cpu(pid) for k, pid in pids.items()}, machine_ticks()
                    since = event_ends(s)
                    with SpeedProbe() as probe:  # from the first send to the last success
                        intended = open_loop(client, rate, n, tag)
                        total += n
                        wait_done(conn, total)
                    cpu = {k: round((tree_cpu(pid) - cpu_before[k]) * 1000 / n, 3) for k, pid in pids.items()}
                    machine = machine_shares(ticks_before, machine_ticks())
                    rows = conn.execute(
                        "SELECT t.submission_id::text, t.task_id::text, extract(epoch FROM t.admitted_at), "
                        "extract(epoch FROM a.started_at) FROM tasks t JOIN attempts a USING (task_id) "
                        "WHERE t.name LIKE %s AND a.attempt = 1",
                        (f"{tag}-%",),
                    ).fetchall()
                    logged = record_times(s, codec, since)
                    latency, hops, at_once = [], {h: [] for h in HOPS}, 0
                    for sid, tid, commanded, started in rows:
                        sent = intended[sid]
                        latency.append(float(started) - sent)
                        t = logged.get(tid, {})
                        if {"admitted", "ready", "claimed"} <= t.keys():
                            points = (sent, float(commanded), t["admitted"], t["ready"], t["claimed"], float(started))
                            for h, a, b in zip(HOPS, points, points[1:], strict=False):
                                hops[h].append(b - a)
                            at_once += t["claimed@"] == t["ready@"]
                    levels[name] = {
                        "rate_tasks_per_s": round(rate, 2),
                        "share_of_maximum": round(rate / max_rate, 3),
                        "tasks": len(rows),
                        "submit_to_start_ms": percentiles_ms(latency),
                        "hop_ms": {h: percentiles_ms(v) for h, v in hops.items() if v},
                        "hop_share_of_median": hop_shares(hops),
                        "claimed_at_once": at_once,
                        "cpu_ms_per_task": cpu,
                        "cpu_ms_per_task_total": round(sum(cpu.values()), 3),
                        "machine": machine,
                        "speed_probe_ms": probe.summary(),
                    }
                    print(f"{kind} {name}: {levels[name]}", flush=True)
                # a chain of 40
                chain = [{"name": "c0", **NOOP}] + [
                    {"name": f"c{i}", **NOOP, "dependencies": [f"c{i - 1}"]} for i in range(1, 40)
                ]
                t0 = time.time()
                client.submit(parse_document({"tenant": "bench", "tasks": chain}))
                total += 40
                wait_done(conn, total)
                (last,) = conn.execute(
                    "SELECT extract(epoch FROM max(finished_at)) FROM tasks WHERE name = 'c39'"
                ).fetchone()
                chain_s = float(last) - t0
            conn.close()
        report = {
            "benchmark": "open-loop submit -> start of ready no-op callables; a 40-task chain",
            "engines": kind,
            "maximum_rate_tasks_per_s": round(max_rate, 2),
            "maximum_is": "the burst's rate (fixed rates)"
            if args.rates
            else f"the highest rate an open loop kept up with, bisected in {args.search_steps} loops of "
            f"{args.search_seconds:g} s between 0 and the burst's rate (doubled while every loop kept up)"
            + ("" if bounded else "; a lower bound: no loop fell behind"),
            "burst_rate_tasks_per_s": round(burst_rate, 2),
            "maximum_search": search,
            "levels": levels,
            "chain_of_40_seconds": round(chain_s, 3),
            "aim": "p50 under 10 ms and p99 under 50 ms at half the maximum rate; the chain under 0.4 s",
            "how": f"{args.warm} one-task submissions to warm up"
            + (f", then {args.warm_seconds:g} s at {args.warm_rate:g}/s" if args.warm_seconds else "")
            + f", {args.probe} as a burst; {args.seconds:g} s per level"
            + (" at fixed rates" if args.rates else ""),
            "settings": extra,
            "when": when(),
        }
        suffix = ("-rates" if args.rates else "") + ("" if args.warm_seconds else "-fresh") + ("-set" if extra else "")
        write_report(RESULTS / f"latency-{kind}{suffix}.json", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
