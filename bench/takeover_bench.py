"""Benchmark: how long the submitter cluster takes to take over a SIGKILLed admission worker's work.

Starts its own embedded stack without admission workers, starts two (`taskstream serve admission`),
keeps producing small submissions to every commands partition (20 per second), SIGKILLs the worker that
owns some partitions, and measures from the SIGKILL:
  - until the survivor owns every partition (as `taskstream cluster` shows it);
  - until the last submission pending on the dead worker's partitions at the kill is decided;
  - the longest wait of submissions sent to those partitions after the kill (they wait for the takeover);
and the decision latency of submissions before the kill, for comparison. On Kafka the consumer group
moves the partitions (after the session timeout, --member-timeout-ms); on noida-db the workers' own
membership does (after the same silence). Repeated --runs times per engine pair; writes median and
range to bench/results/takeover-<pair>.json; the workers' logs are kept in the stack's state directory.

    python bench/takeover_bench.py [--engines kafka|fallback|both] [--runs 3] [--member-timeout-ms 6000]
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from _stack import embedded_stack, kinds, settings_of, summary, when, write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def owners(host: str, indices: tuple[int, int], partitions: int) -> dict[int, int]:
    from taskstream.connectors.noida import rendezvous_owner

    members = {f"{host}-admission-{i}": i for i in indices}
    return {p: members[rendezvous_owner(sorted(members), p)] for p in range(partitions)}


def split(s, pair: tuple[int, int], host: str) -> set[int]:  # type: ignore[no-untyped-def]
    """The first worker's partitions once the two share them all (as `taskstream cluster` says)."""
    from taskstream.connectors.cluster import describe

    deadline = time.time() + 60
    while time.time() < deadline:
        live = {m["member"]: set(m["owned"]) for m in describe(s)["members"] if m["alive"]}
        a, b = (live.get(f"{host}-admission-{i}", set()) for i in pair)
        if a and b and not a & b and a | b == set(range(s.partitions)):
            return a
        time.sleep(0.2)
    raise SystemExit("the two admission workers did not share the partitions within 60 s")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", choices=("kafka", "fallback", "both"), default="both")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--member-timeout-ms", type=int, default=6000)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    for kind in kinds(args.engines):
        runs = [once(kind, args) for _ in range(args.runs)]
        keys = ("survivor_owns_every_partition_s", "last_pending_at_kill_decided_s", "their_longest_wait_s")
        report = {
            "benchmark": "admission takeover after SIGKILL of one of two workers",
            "engines": kind,
            "member_timeout_ms": args.member_timeout_ms,
            "runs": args.runs,
            "submissions": sum(r["submissions"] for r in runs),
            "lost": sum(r["lost"] for r in runs),
            **{k: summary([r[k] for r in runs]) for k in keys},
            "decision_latency_before_kill_p50_s": summary([r["decision_latency_before_kill_p50_s"] for r in runs]),
            "each_run": runs,
            "when": when(),
        }
        write_report(RESULTS / f"takeover-{kind}.json", report)
        if report["lost"]:
            return 1
    return 0


def once(kind: str, args) -> dict:  # type: ignore[no-untyped-def, type-arg]
    from confluent_kafka import Producer, TopicPartition
    from taskstream.connectors.cluster import describe
    from taskstream.connectors.kafka import consumer, make_codec
    from taskstream.schemas import records as r

    from taskstream.core.submission import parse_document

    with embedded_stack(kind, admission_workers="0", admission_member_timeout_ms=str(args.member_timeout_ms)) as env:
        s = settings_of(env)
        host = s.node_id or socket.gethostname()
        pair = (0, 1)
        if s.broker == "noida":  # rendezvous hashing splits the partitions for some pairs of names only
            pair = next(
                (a, b)
                for a in range(8)
                for b in range(8)
                if a != b and 0 < list(owners(host, (a, b), s.partitions).values()).count(a) < s.partitions
            )
        logs = [open(Path(env["TASKSTREAM_STATE_DIR"]) / f"bench-admission-{i}.log", "wb") for i in pair]  # noqa: SIM115
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "taskstream", "serve", "admission", "--index", str(i)],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            for i, log in zip(pair, logs, strict=True)
        ]
        codec = make_codec(s)
        sent: dict[str, tuple[int, float]] = {}  # command id -> (partition, sent at)
        decided: dict[str, float] = {}
        stop = threading.Event()

        def watch() -> None:
            c = consumer(s, f"bench-takeover-{uuid.uuid4()}")
            c.assign([TopicPartition(s.topic("events"), p, 0) for p in range(s.partitions)])
            while not stop.is_set():
                for m in c.consume(500, 0.1):
                    if m.error() or not m.headers():
                        continue
                    kind = dict(m.headers()).get("taskstream.event", b"").decode()
                    if kind in ("SubmissionAccepted", "SubmissionRejected"):
                        decided.setdefault(codec.decode("event", m.value()).payload.command_id, time.time())
            c.close()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        owns_all: list[float] = []
        killed_at: float | None = None

        def observe() -> None:  # from the kill on: when does `taskstream cluster` show one member owning all?
            while killed_at is None:
                time.sleep(0.05)
            while not owns_all and time.time() < killed_at + 120:
                live = [m for m in describe(s)["members"] if m["alive"]]
                if len(live) == 1 and sorted(live[0]["owned"]) == list(range(s.partitions)):
                    owns_all.append(time.time())
                time.sleep(0.2)

        observer = threading.Thread(target=observe, daemon=True)
        observer.start()
        victim_parts = split(s, pair, host)  # both members up and sharing the partitions
        producer = Producer({"bootstrap.servers": s.bootstrap, "linger.ms": 2})
        t_end = time.time() + args.seconds
        i = 0
        while time.time() < t_end:
            p = i % s.partitions
            sub = parse_document(
                {"tenant": "bench", "tasks": [{"name": "a", "argv": ["true"], "not_before": 4102444800000}]}
            )
            cmd = r.CommandRecord(str(uuid.uuid4()), int(time.time() * 1000), r.SubmitDag("bench", sub.tasks), "bench")
            producer.produce(s.topic("commands"), key=cmd.command_id.encode(), value=codec.encode(cmd), partition=p)
            producer.poll(0)
            sent[cmd.command_id] = (p, time.time())
            i += 1
            if killed_at is None and time.time() > t_end - args.seconds * 0.6:
                procs[0].send_signal(signal.SIGKILL)
                killed_at = time.time()
                print(
                    f"SIGKILL at {time.strftime('%H:%M:%S', time.localtime(killed_at))}.{int(killed_at % 1 * 1000):03d}"
                )
            time.sleep(0.05)
        producer.flush(10)
        del producer  # gone before the stack: it would log connection failures while the broker stops
        assert killed_at is not None
        observer.join(120)
        deadline = time.time() + 60
        while len(decided) < len(sent) and time.time() < deadline:
            time.sleep(0.2)
        stop.set()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(20)
        for log in logs:
            log.close()
        print(f"admission workers' logs: {', '.join(log.name for log in logs)}")
    # pending at the kill: sent to the dead member's partitions before it died, not decided by then
    pending = [
        c for c, (p, t) in sent.items() if p in victim_parts and t <= killed_at and decided.get(c, 1e20) > killed_at
    ]
    # sent to the dead member's partitions after it died: they wait for the takeover
    after = [c for c, (p, t) in sent.items() if p in victim_parts and t > killed_at]
    pending_decided = sorted(decided[c] - killed_at for c in pending if c in decided)
    after_waits = sorted(decided[c] - sent[c][1] for c in after if c in decided)
    before = sorted(decided[c] - t for c, (_, t) in sent.items() if c in decided and t < killed_at - 1)
    return {
        "submissions": len(sent),
        "decided": len(decided),
        "lost": len(sent) - len(decided),
        "survivor_owns_every_partition_s": round(owns_all[0] - killed_at, 2) if owns_all else None,
        "pending_at_kill": len(pending),
        "last_pending_at_kill_decided_s": round(pending_decided[-1], 2) if pending_decided else None,
        "sent_after_kill_to_its_partitions": len(after),
        "their_longest_wait_s": round(after_waits[-1], 2) if after_waits else None,
        "decision_latency_before_kill_p50_s": round(before[len(before) // 2], 3) if before else None,
        "decision_latency_before_kill_max_s": round(before[-1], 3) if before else None,
    }


if __name__ == "__main__":
    sys.exit(main())
