"""The graph process: the single owner of the embedded Ladybug file. It runs the graph projection and
answers read queries over HTTP on loopback, so every other process reaches the graph through it.
With the Neo4j backend it only projects; readers talk to Neo4j directly.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, unquote, urlparse

from taskstream.projections.graph import GraphQueries, GraphStore, LadybugStore, Neo4jStore

from taskstream.settings import Settings

log = logging.getLogger(__name__)


def open_store(settings: Settings, projector: bool = False) -> GraphStore:
    """The graph store. `projector`: the graph process, which applies a requested replay swap first."""
    from taskstream.projections.replay import apply_graph_swap, apply_neo4j_swap

    if settings.graph_backend == "neo4j":
        store = Neo4jStore(settings.neo4j_url, settings.neo4j_user, settings.neo4j_password)
        if projector and apply_neo4j_swap(settings, store):
            log.info("swapped in the replayed graph; the previous one is kept under the Retired labels")
        return store

    live = settings.state_dir / "graph" / "taskstream.lbug"
    retired = apply_graph_swap(settings, live)
    if retired is not None:
        log.info("swapped in the replayed graph; the previous one is kept as %s", retired)
    return LadybugStore(live)


def _handler(queries: GraphQueries, health: dict[str, Any]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("graph api: " + fmt, *args)

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            parts = [unquote(p) for p in urlparse(self.path).path.strip("/").split("/") if p]
            try:
                match parts:
                    case ["health"]:
                        return self._send(200, health)
                    case ["submissions", sid, "nodes"]:
                        return self._send(200, queries.nodes(sid))
                    case ["submissions", sid, "edges"]:
                        return self._send(200, queries.edges(sid))
                    case ["submissions", sid, "counts"]:
                        return self._send(200, queries.counts(sid))
                    case ["tasks", tid, "needs"]:
                        return self._send(200, queries.needs(tid))
                    case ["tasks", tid, "blocks"]:
                        return self._send(200, queries.blocks(tid))
                    case ["tasks", tid, "unblocked"]:
                        return self._send(200, queries.newly_unblocked(tid))
                    case ["submissions", sid, "order"]:
                        return self._send(200, queries.order(sid))
                    case ["would-cycle", src, dst]:
                        return self._send(200, queries.would_close_cycle(src, dst))
                    case ["checkpoints"]:
                        return self._send(200, queries.checkpoints())
                    case ["snapshot"]:
                        return self._send(200, queries.snapshot())
                self._send(404, {"error": f"no such resource: {self.path}"})
            except Exception as exc:
                log.exception("graph query failed")
                self._send(500, {"error": f"{type(exc).__name__}: {exc}"})

    return Handler


def serve_queries(settings: Settings, queries: GraphQueries, health: dict[str, Any]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((settings.host, settings.graph_port), _handler(queries, health))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="graph-api", daemon=True).start()
    return server


class GraphClient:
    """GraphQueries over the graph process's HTTP API (embedded mode)."""

    def __init__(self, base_url: str) -> None:
        self.base = base_url.rstrip("/")

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.base + path, timeout=30) as resp:  # noqa: S310 - loopback URL
            return json.loads(resp.read())

    def nodes(self, submission_id: str) -> list[tuple[str, str, str]]:
        return [tuple(x) for x in self._get(f"/submissions/{quote(submission_id, safe='')}/nodes")]  # type: ignore[misc]

    def edges(self, submission_id: str) -> list[tuple[str, str]]:
        return [tuple(x) for x in self._get(f"/submissions/{quote(submission_id, safe='')}/edges")]  # type: ignore[misc]

    def counts(self, submission_id: str) -> dict[str, int]:
        return dict(self._get(f"/submissions/{quote(submission_id, safe='')}/counts"))

    def needs(self, task_id: str) -> list[str]:
        return list(self._get(f"/tasks/{quote(task_id, safe='')}/needs"))

    def blocks(self, task_id: str) -> list[str]:
        return list(self._get(f"/tasks/{quote(task_id, safe='')}/blocks"))

    def newly_unblocked(self, task_id: str) -> list[str]:
        return list(self._get(f"/tasks/{quote(task_id, safe='')}/unblocked"))

    def order(self, submission_id: str) -> list[str]:
        return list(self._get(f"/submissions/{quote(submission_id, safe='')}/order"))

    def would_close_cycle(self, src: str, dst: str) -> list[str] | None:
        got = self._get(f"/would-cycle/{quote(src, safe='')}/{quote(dst, safe='')}")
        return None if got is None else list(got)

    def checkpoints(self) -> dict[str, int]:
        return dict(self._get("/checkpoints"))

    def snapshot(self) -> dict[str, Any]:
        return dict(self._get("/snapshot"))


def graph_queries(settings: Settings) -> GraphClient | GraphQueries:
    if settings.graph_backend == "neo4j":
        return GraphQueries(open_store(settings))
    return GraphClient(settings.graph_url)
