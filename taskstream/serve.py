"""Entry points of the long-running processes the supervisor starts (`taskstream serve NAME`)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path

from taskstream.connectors import kafka as k
from taskstream.connectors.services import ready_file
from taskstream.settings import Settings

log = logging.getLogger("taskstream.serve")


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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


def _run_projection(settings: Settings, name: str, projection: object, on_ready: object = None) -> None:
    from taskstream.projections.runner import ProjectionRunner

    codec = k.make_codec(settings)
    consumer = k.consumer(settings, group=f"taskstream-projection-{name}")
    runner = ProjectionRunner(
        projection, consumer, codec, settings.topic("events"), settings.partitions,  # type: ignore[arg-type]
        dlq=(k.producer(settings), settings.topic("dead-letters")), on_ready=on_ready,  # type: ignore[arg-type]
    )
    stop = threading.Event()
    _stop_on_signals(stop)
    t = threading.Thread(target=runner.run, name=f"projection-{name}", daemon=True)
    t.start()
    while not stop.wait(0.5):
        if not t.is_alive():
            raise SystemExit(f"projection {name} stopped unexpectedly")
    runner.stop()
    t.join(10)
    consumer.close()
    projection.close()  # type: ignore[attr-defined]


def graph(settings: Settings) -> None:
    from taskstream.projections.graph import GraphProjection, GraphQueries
    from taskstream.projections.graph_service import open_store, serve_queries

    _logging()
    store = open_store(settings)
    health: dict[str, object] = {"backend": settings.graph_backend, "ready": False}
    if settings.graph_backend == "ladybug":
        serve_queries(settings, GraphQueries(store), health)

    def ready() -> None:
        health["ready"] = True
        _touch(ready_file(settings, "graph"))

    _run_projection(settings, "graph", GraphProjection(store), ready)


def pg_projector(settings: Settings) -> None:
    from taskstream.projections.pg import PgProjection

    _logging()
    _run_projection(settings, "pg", PgProjection(settings.dsn), lambda: _touch(ready_file(settings, "pg-projector")))


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def worker(settings: Settings, index: int) -> None:
    from taskstream.streams.app import run_worker

    run_worker(settings, index)


def supervisor(settings: Settings) -> int:
    from taskstream import supervisor as sup

    return sup.main(settings)
