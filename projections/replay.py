"""Rebuild the projections from offset 0 into fresh stores beside the live ones, verify them against the
live ones at the same offsets, and swap them in on request.

Live and replay are compared at the same log positions: a live snapshot is taken atomically with its
checkpoints (a REPEATABLE READ transaction in PostgreSQL; in the graph, under the store's lock: the
graph process's for Ladybug, the lock node every Neo4j write takes first), and the replay is run to
exactly those checkpoints. Where the replayed graph goes: a `replay.lbug` file beside the live one
(Ladybug), or the `Replay` namespace of the same Neo4j database (community edition has one).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from taskstream.connectors import kafka as k
from taskstream.projections.graph import (
    READ_CHECKPOINTS,
    REPLAY,
    SNAPSHOT_EDGES,
    SNAPSHOT_NODES,
    SWAP_STEPS,
    BulkGraphProjection,
    GraphStore,
    LadybugStore,
    Neo4jStore,
)
from taskstream.projections.lag import graph_checkpoints
from taskstream.projections.migrate import migrate
from taskstream.projections.pg import PgProjection
from taskstream.projections.runner import ProjectionRunner

from taskstream.settings import Settings

REPLAY_SCHEMA = "replay"
# Replay writes in large batches: each graph write pays a scan of the Task table (Ladybug resolves the
# UNWIND-ed ids by joining), so fewer, larger batches keep the rebuild close to linear.
REPLAY_BATCH = 50_000
# Tables compared row by row, with the key that orders them. Checkpoint and migration bookkeeping
# carry wall-clock times and are not part of the read model.
PG_TABLES = {
    "tasks": "task_id",
    "attempts": "task_id, attempt",
    "submissions": "submission_id",
    "tenants": "tenant",
    "workers": "worker_id",
    "dead_letters": 'topic, partition, "offset"',
}
PG_PROJECTIONS = (("pg", "events", True), ("pg-dead-letters", "dead-letters", False))
REPLAY_LOCK = 0x7473_7270  # the advisory lock key replays take (exclusive)
SWAP_WAIT_S = 120.0  # how long a replay waits for the graph service to apply a pending swap


class ReplayError(RuntimeError):
    pass


@dataclass
class Snapshot:
    """Rows as (table, key, digest) in a fixed order, plus the offsets they reflect."""

    rows: list[tuple[str, str, str]]
    checkpoints: dict[str, dict[int, int]]  # projection name -> partition -> next offset

    @property
    def checksum(self) -> str:
        h = hashlib.sha256()
        for row in self.rows:
            h.update("\x1f".join(row).encode())
            h.update(b"\x1e")
        return h.hexdigest()


def first_difference(live: Snapshot, replay: Snapshot) -> str | None:
    a, b = live.rows, replay.rows
    for x, y in zip(a, b, strict=False):
        if x != y:
            if x[:2] == y[:2]:
                return f"{x[0]} row {x[1]}: live and replayed contents differ"
            return f"{x[0]} row {x[1]} (live) vs {y[0]} row {y[1]} (replay): a row is missing on one side"
    if len(a) != len(b):
        longer, side = (a, "live") if len(a) > len(b) else (b, "replay")
        extra = longer[min(len(a), len(b))]
        return f"{extra[0]} row {extra[1]} exists only in the {side} projection"
    return None


# ---- PostgreSQL ------------------------------------------------------------------------------------


def schema_dsn(dsn: str, schema: str) -> str:
    return f"{dsn} options='-c search_path={schema}'"


def pg_snapshot(conn: psycopg.Connection[Any], schema: str) -> Snapshot:
    rows: list[tuple[str, str, str]] = []
    for table, key in PG_TABLES.items():
        keys = ", ".join(f"t.{c.strip()}" for c in key.split(","))
        for kval, digest in conn.execute(
            f"SELECT concat_ws('/', {keys}), md5(row_to_json(t)::text) FROM {schema}.{table} t ORDER BY {key}"  # noqa: S608
        ):
            rows.append((table, kval, digest))
    cps: dict[str, dict[int, int]] = {}
    for proj, _topic, p, o in conn.execute(
        f"SELECT projection, topic, partition, next_offset FROM {schema}.projection_checkpoints"
    ):  # noqa: S608
        cps.setdefault(proj, {})[int(p)] = int(o)
    return Snapshot(rows, cps)


def live_pg_snapshot(dsn: str) -> Snapshot:
    with psycopg.connect(dsn) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        snap = pg_snapshot(conn, "public")
        conn.rollback()
    return snap


def replay_pg(settings: Settings, targets: dict[str, dict[int, int]], progress: Callable[[int], None]) -> Snapshot:
    with psycopg.connect(settings.dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {REPLAY_SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {REPLAY_SCHEMA}")
    rdsn = schema_dsn(settings.dsn, REPLAY_SCHEMA)
    migrate(rdsn)
    codec = k.make_codec(settings, wait_s=5)
    for name, topic_key, decode in PG_PROJECTIONS:
        proj = PgProjection(rdsn, projection=name)
        consumer = k.consumer(settings, group=f"taskstream-replay-{name}")
        try:
            runner = ProjectionRunner(
                proj,
                consumer,
                codec if decode else None,
                settings.topic(topic_key),
                settings.partitions,
                batch_size=REPLAY_BATCH,
            )
            runner.catch_up(targets.get(name, {}), progress)
        finally:
            consumer.close()
            proj.close()
    with psycopg.connect(rdsn) as conn:
        return pg_snapshot(conn, REPLAY_SCHEMA)


def swap_pg(settings: Settings) -> str:
    """Make the replayed schema the live one; the old one is kept, renamed. Returns its name."""
    retired = f"retired_{int(time.time())}"
    with psycopg.connect(settings.dsn) as conn, conn.transaction():
        # Wait out (and hold off) the live projector's transaction so the rename happens between batches.
        conn.execute("LOCK TABLE public.projection_checkpoints IN ACCESS EXCLUSIVE MODE")
        conn.execute(f"ALTER SCHEMA public RENAME TO {retired}")
        conn.execute(f"ALTER SCHEMA {REPLAY_SCHEMA} RENAME TO public")
    return retired


# ---- graph ------------------------------------------------------------------------------------------


def graph_rows(nodes: list[list[Any]], edges: list[list[Any]], checkpoints: dict[str, int], topic: str) -> Snapshot:
    rows = [("Task", str(n[0]), hashlib.md5(json.dumps(n, default=str).encode()).hexdigest()) for n in nodes]  # noqa: S324
    rows += [("DEPENDS_ON", f"{a}->{b}", "") for a, b in edges]
    return Snapshot(rows, {"graph": graph_checkpoints(checkpoints, topic)})


def live_graph_snapshot(settings: Settings) -> Snapshot:
    """The live graph with its checkpoints, read atomically: from the graph process, which owns the
    Ladybug file, or from Neo4j directly."""
    if settings.graph_backend == "neo4j":
        store = Neo4jStore(settings.neo4j_url, settings.neo4j_user, settings.neo4j_password)
        try:
            g = store.snapshot()
        finally:
            store.close()
    else:
        from taskstream.projections.graph_service import GraphClient

        g = GraphClient(settings.graph_url).snapshot()
    return graph_rows(g["nodes"], g["edges"], g["checkpoints"], settings.topic("events"))


def replay_graph_path(settings: Settings) -> Path:
    return settings.state_dir / "graph" / "replay.lbug"


def _replay_store(settings: Settings) -> GraphStore:
    if settings.graph_backend == "neo4j":
        return Neo4jStore(settings.neo4j_url, settings.neo4j_user, settings.neo4j_password, namespace=REPLAY)
    path = replay_graph_path(settings)
    for old in path.parent.glob(path.name + "*"):
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    return LadybugStore(path)


def replay_graph(settings: Settings, targets: dict[int, int], progress: Callable[[int], None]) -> Snapshot:
    store = _replay_store(settings)
    proj = BulkGraphProjection(store)
    consumer = k.consumer(settings, group="taskstream-replay-graph")
    try:
        runner = ProjectionRunner(
            proj,
            consumer,
            k.make_codec(settings, wait_s=5),
            settings.topic("events"),
            settings.partitions,
            batch_size=REPLAY_BATCH,
        )
        runner.catch_up(targets, progress)
        proj.flush()
        nodes, edges, cps = store.query_many([SNAPSHOT_NODES, SNAPSHOT_EDGES, READ_CHECKPOINTS])
        return graph_rows(nodes, edges, {str(c): int(o) for c, o in cps}, settings.topic("events"))
    finally:
        consumer.close()
        store.close()


def swap_request_path(settings: Settings) -> Path:
    return settings.state_dir / "graph" / "swap-request"


def request_graph_swap(settings: Settings) -> None:
    path = swap_request_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("replay\n")


def apply_graph_swap(settings: Settings, live: Path) -> Path | None:
    """Called by the graph process before it opens its Ladybug store: if a swap was requested, move the
    live files aside and the replayed ones in. Returns where the old files went."""
    req = swap_request_path(settings)
    if not req.exists():
        return None
    replay = replay_graph_path(settings)
    retired = live.with_name(f"retired-{int(time.time())}.lbug")
    for f in sorted(live.parent.glob(live.name + "*")):
        f.rename(retired.with_name(retired.name + f.name[len(live.name) :]))
    for f in sorted(replay.parent.glob(replay.name + "*")):
        f.rename(live.with_name(live.name + f.name[len(replay.name) :]))
    req.unlink()
    return retired


def apply_neo4j_swap(settings: Settings, store: Neo4jStore) -> bool:
    """Called by the graph process before it starts projecting into Neo4j: if a swap was requested, the
    replayed namespace becomes the live one and the live one moves to `Retired`. True if it swapped.
    The request file keeps the step the swap is in, so a graph process that dies halfway through is
    restarted into the same swap, finishing it (Neo4jStore.swap_in)."""
    req = swap_request_path(settings)
    if not req.exists():
        return False
    step = req.read_text().strip()
    store.swap_in(start=step if step in SWAP_STEPS else SWAP_STEPS[0], reached=lambda s: req.write_text(f"{s}\n"))
    req.unlink()
    return True


def swap_pending(settings: Settings) -> float | None:
    """When the graph swap still waiting for the graph service was requested (epoch seconds), or None."""
    try:
        return swap_request_path(settings).stat().st_mtime
    except FileNotFoundError:
        return None


def wait_for_graph_swap(settings: Settings, notice: Callable[[str], None], timeout: float = SWAP_WAIT_S) -> None:
    """Return once no graph swap is pending; ReplayError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    told = False
    while (since := swap_pending(settings)) is not None:
        if time.monotonic() >= deadline:
            when = time.strftime("%H:%M:%S", time.localtime(since))
            raise ReplayError(
                f"a graph swap requested at {when} is still pending after {timeout:.0f}s: the graph service "
                f"applies it when it starts (`taskstream up` restarts it; if you run the graph process "
                f"yourself, restart it). Its request: {swap_request_path(settings)}"
            )
        if not told:
            notice("waiting for the graph service to apply the pending swap")
            told = True
        time.sleep(0.5)


@contextmanager
def exclusive(settings: Settings, notice: Callable[[str], None]) -> Iterator[None]:
    """One replay at a time, and none while a graph swap is pending. Replays share the replay schema,
    namespace and file, and a swap the graph service has not applied yet is moving those very nodes (or
    that file): a replay beside it rebuilt what the swap was relabelling, and the live graph it left
    was wrong. The lock is a PostgreSQL advisory lock, so it holds across machines sharing the stack;
    it goes with the session if the replaying process dies."""
    with psycopg.connect(settings.dsn, autocommit=True) as conn:
        (got,) = conn.execute("SELECT pg_try_advisory_lock(%s)", (REPLAY_LOCK,)).fetchone() or (False,)
        if not got:
            notice("another replay is running: waiting for it to finish")
            conn.execute("SELECT pg_advisory_lock(%s)", (REPLAY_LOCK,))
        try:
            wait_for_graph_swap(settings, notice)
            yield
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (REPLAY_LOCK,))
