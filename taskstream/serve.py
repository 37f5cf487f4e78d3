"""Entry points of the long-running processes the supervisor starts (`taskstream serve NAME`)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path

from taskstream import gc_policy
from taskstream.connectors import broker
from taskstream.connectors import kafka as k
from taskstream.connectors.services import ready_file
from taskstream.settings import Settings

log = logging.getLogger("taskstream.serve")


def _logging() -> None:
    gc_policy.for_service()  # every long-running process sets up its logging first
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _stop_on_signals(stop: threading.Event) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())


def registry(settings: Settings) -> None:
    from taskstream.connectors.registry import make_server

    _logging()
    server = make_server(settings.host, settings.registry_port, settings.state_dir / "registry.json")
    stop = threading.Event()
    _stop_on_signals(stop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log.info("schema registry on %s", settings.registry)
    stop.wait()
    server.shutdown()


def _run_projections(settings: Settings, runs: list[tuple[str, str, object, bool]], on_ready: object = None) -> None:
    """Run projections side by side, one thread each: (name, topic key, projection, decode as events?)."""
    from taskstream.projections.runner import ProjectionRunner

    codec = k.make_codec(settings)
    stop = threading.Event()
    _stop_on_signals(stop)
    runners, threads = [], []
    for name, topic_key, projection, decode in runs:
        linger = broker.projection_linger(settings, name)
        # with a linger, the broker too holds each fetch until it has a batch's worth or the linger is up:
        # one fetch per linger instead of one per event written
        held = {"fetch.min.bytes": 1 << 20, "fetch.wait.max.ms": int(linger * 1000)} if linger else {}
        consumer = k.consumer(settings, group=f"taskstream-projection-{name}", **held)
        runner = ProjectionRunner(
            projection,  # type: ignore[arg-type]
            consumer,
            codec if decode else None,
            settings.topic(topic_key),
            settings.partitions,
            dlq=(k.producer(settings), settings.topic("dead-letters")) if decode else None,
            idle=broker.idle(settings, consumer, settings.topic(topic_key)),
            poll_timeout=broker.poll_timeout(settings),
            linger=linger,
        )
        runners.append((runner, consumer, projection))
        threads.append(threading.Thread(target=runner.run, name=f"projection-{name}", daemon=True))
    for t in threads:
        t.start()
    ready_called = False
    while not stop.wait(0.2):
        if not all(t.is_alive() for t in threads):
            raise SystemExit("a projection thread stopped unexpectedly")
        if not ready_called and all(r.assigned.is_set() for r, _, _ in runners):
            ready_called = True
            gc_policy.started()
            if on_ready:
                on_ready()  # type: ignore[operator]
    for r, _, _ in runners:
        r.stop()
    for t in threads:
        t.join(10)
    for _, consumer, projection in runners:
        consumer.close()
        projection.close()  # type: ignore[attr-defined]


def graph(settings: Settings) -> None:
    from taskstream.projections.graph import GraphProjection, GraphQueries, Neo4jStore
    from taskstream.projections.graph_service import open_store, serve_queries

    _logging()
    store = open_store(settings, projector=True)
    if isinstance(store, Neo4jStore):
        store.warm_up()
    health: dict[str, object] = {"backend": settings.graph_backend, "ready": False}
    if settings.graph_backend == "ladybug":
        serve_queries(settings, GraphQueries(store), health)

    def ready() -> None:
        health["ready"] = True
        _touch(ready_file(settings, "graph"))

    _run_projections(settings, [("graph", "events", GraphProjection(store), True)], ready)


def pg_projector(settings: Settings) -> None:
    from taskstream.projections.pg import PgProjection

    _logging()
    _run_projections(
        settings,
        [
            ("pg", "events", PgProjection(settings.dsn), True),
            ("pg-dead-letters", "dead-letters", PgProjection(settings.dsn, projection="pg-dead-letters"), False),
        ],
        lambda: _touch(ready_file(settings, "pg-projector")),
    )


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def admission(settings: Settings, index: int) -> None:
    from taskstream.streams.admitter import run_admitter

    _logging()
    name = f"admission-{index}"

    def ready() -> None:
        gc_policy.started()
        _touch(ready_file(settings, name))

    run_admitter(settings, index, on_ready=ready)


def worker(settings: Settings, index: int) -> None:
    from taskstream.streams.app import run_worker

    gc_policy.for_service()
    run_worker(settings, index)


def supervisor(settings: Settings) -> int:
    from taskstream import supervisor as sup

    return sup.main(settings)
