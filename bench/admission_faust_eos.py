"""Measurement: admission as a Faust agent with processing_guarantee="exactly_once", against the
present admitter (streams/admitter.py), on Apache Kafka.

The prototype agent reads the commands topic, decides each command with the same pure code the
admitter uses (streams/admission.py: decide_command, Admitted.records) and sends what the decision
calls for through Faust, which wraps every send and the consumed offsets in Kafka transactions. Faust's
transactions are per *destination* partition (transactional id `<app>-<group>-<partition>`, faust
transport/consumer.py), so one command's records, spread over every events partition, go into several
transactions that commit one after the other; the prototype runs one worker that owns every partition,
the only layout in which every destination has a producer at all.

Measured, on one stack, for --runs pairs of submissions (the random 10,000-task DAG of
bench/admission_bench.py, and one task): whether and when each decision is seen by a read_committed
reader, counted from the SDK's first byte; then, past Faust's transaction timeout, whether it was ever
committed and how far the agent committed the commands' offsets. Writes
bench/results/admission-faust-eos.json.

    python bench/admission_faust_eos.py [--runs 5] [--tasks 10000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from _stack import embedded_stack, settings_of, summary, when, write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "admission-faust-eos.json"
APP_ID = "bench-eos-admission"


def run_agent() -> None:
    """The prototype: one Faust worker, exactly_once, deciding commands with the admitter's pure code."""
    import faust
    from taskstream.connectors.engines import choose
    from taskstream.connectors.faust_patches import read_committed_only
    from taskstream.connectors.kafka import make_codec
    from taskstream.connectors.partitioning import partition_for
    from taskstream.streams.admission import LinkIndex, Placement, decide_command
    from taskstream.streams.context import EVENT_HEADER

    from taskstream.settings import Settings

    s = choose(Settings.from_env(), probe=False).settings
    read_committed_only()
    app = faust.App(
        APP_ID,
        broker=f"kafka://{s.bootstrap}",
        processing_guarantee="exactly_once",
        broker_commit_interval=0.05,  # commit as often as Faust allows: the decision waits for it
        producer_linger_ms=2,
        producer_max_request_size=32 * 1024 * 1024,
        topic_partitions=s.partitions,
        web_enabled=False,
        datadir=str(s.state_dir / "eos-agent"),
        stream_wait_empty=False,
        consumer_auto_offset_reset="latest",
    )
    raw = {"key_serializer": "raw", "value_serializer": "raw"}
    commands = app.topic(s.topic("commands"), **raw)
    events = app.topic(s.topic("events"), **raw)
    inputs = app.topic(s.topic("task-inputs"), **raw)
    codec = make_codec(s)
    topics = {"events": events, "task-inputs": inputs}

    @app.agent(events)  # consumed too, so that events partitions have transactional producers here
    async def ignore(stream):  # type: ignore[no-untyped-def]
        async for _ in stream:
            pass

    @app.agent(inputs)
    async def ignore_inputs(stream):  # type: ignore[no-untyped-def]
        async for _ in stream:
            pass

    @app.agent(commands)
    async def admit(stream):  # type: ignore[no-untyped-def]
        async for event in stream.events():
            m = event.message
            cmd = codec.decode("command", event.value)
            where = Placement(
                m.partition,
                lambda t: partition_for(t.encode(), s.partitions),
                lambda t: partition_for(t.encode(), s.partitions),
            )
            decision = decide_command("eos", cmd, m.timestamp * 1000, where=where, index=LinkIndex())
            sends = list(decision.sends)
            if decision.admitted is not None:
                sends += decision.admitted.records(lambda t: partition_for(t.encode(), s.partitions))
            for topic_key, key, rec in sends:
                headers = [(EVENT_HEADER, rec.kind.encode())] if topic_key == "events" else None
                await topics[topic_key].send(key=key.encode(), value=codec.encode(rec), headers=headers)
            print(f"decided {cmd.command_id}: {len(sends)} record(s)", flush=True)

    sys.argv = [sys.argv[0], "worker", "-l", "info"]
    app.main()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.agent:
        run_agent()
        return 0
    from admission_bench import random_dag
    from confluent_kafka import TopicPartition
    from taskstream.connectors.kafka import consumer
    from taskstream.connectors.partitioning import partition_for

    from taskstream.sdk import Client, SubmitError

    with embedded_stack("kafka", admission_workers="0") as env:
        settings = settings_of(env)
        log = open(Path(env["TASKSTREAM_STATE_DIR"]) / "eos-agent.log", "wb")  # noqa: SIM115
        agent = subprocess.Popen(
            [sys.executable, __file__, "--agent"],
            env={**env, "PYTHONPATH": str(ROOT / "bench") + os.pathsep + env.get("PYTHONPATH", "")},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        outcomes = []
        try:
            time.sleep(15)  # joined, assigned, transactional producers started
            with Client(settings, issuer="bench") as client:
                for i in range(args.runs):  # one big and one one-task submission per run, one at a time
                    for n in (args.tasks, 1):
                        start = time.perf_counter()
                        cid, sid = client.submit(random_dag(n, args.seed + 10 * i + n))
                        try:
                            client.wait_outcome(sid, 30, command_id=cid)
                            took: float | None = time.perf_counter() - start
                        except SubmitError:
                            took = None
                        outcomes.append({"tasks": n, "sid": sid, "command_id": cid, "decision_seconds": took})
            time.sleep(70)  # past Faust's transaction timeout (60 s): an open transaction is aborted by then
            c = consumer(settings, "bench-eos-admission")  # the prototype's group: what it committed
            tps = [TopicPartition(settings.topic("commands"), p) for p in range(settings.partitions)]
            committed = {tp.partition: tp.offset for tp in c.committed(tps, timeout=10)}
            ends = {p: c.get_watermark_offsets(tp, timeout=10, cached=False)[1] for p, tp in enumerate(tps)}
            c.close()
            with Client(settings, issuer="bench-check") as checker:
                for o in outcomes:
                    try:
                        checker.wait_outcome(o["sid"], 5)  # looked up in PostgreSQL: anything ever committed
                        o["decided_eventually"] = True
                    except SubmitError:
                        o["decided_eventually"] = False
                    o["decision_partition"] = partition_for(o["sid"].encode(), settings.partitions)
        finally:
            agent.terminate()
            agent.wait(30)
            log.close()
    lost = [o for o in outcomes if not o["decided_eventually"]]
    report = {
        "benchmark": "admission as a Faust agent with processing_guarantee=exactly_once (one worker)",
        "engines": "kafka",
        "tasks": args.tasks,
        "submissions": len(outcomes),
        "decided_within_30s": sum(o["decision_seconds"] is not None for o in outcomes),
        "never_decided_after_100s": len(lost),
        "commands_committed_by_the_agent": {str(p): committed[p] for p in committed},
        "commands_end_offsets": {str(p): ends[p] for p in ends},
        "decision_seconds_of_those_decided": summary(
            [o["decision_seconds"] for o in outcomes if o["decision_seconds"]]
        ),
        "outcomes": outcomes,
        "compare": "bench/results/admission-kafka.json (the present admitter: every submission decided)",
        "when": when(),
    }
    write_report(RESULTS, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
