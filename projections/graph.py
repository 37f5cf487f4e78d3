"""The graph projection: Task nodes (status, tenant) and DEPENDS_ON edges (dependent -> prerequisite).

Two stores share one Cypher text wherever the dialects agree: Neo4j (the default where a JVM runs, and
production; official driver) and Ladybug (the embedded fallback; one process owns the file, see
graph_service.py). Writes are batched with UNWIND and carry the projection's checkpoint in the same
transaction. Each store also takes consistent snapshots (rows with the checkpoints they reflect) and
bulk loads an empty graph, which replay uses (projections/replay.py).

Neo4j community has one user database, so a replayed graph is built beside the live one under labels
of its own: a store's `namespace` prefixes its labels (`ReplayTask`, `REPLAY_DEPENDS_ON`,
`ReplayProjectionCheckpoint`), and swapping moves labels, not files (`Neo4jStore.swap_in`).
"""

from __future__ import annotations

import csv
import re
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from taskstream.projections.runner import Batch
from taskstream.schemas import records as r

from taskstream.core import events as e
from taskstream.core.model import Status

# ---- shared Cypher ----------------------------------------------------------------------------------
UPSERT_NODES = (
    "UNWIND $rows AS r MERGE (t:Task {id: r.id}) "
    "SET t.name = r.name, t.tenant = r.tenant, t.submission_id = r.submission_id, "
    "t.status = CASE WHEN coalesce(t.version, 0) < r.version THEN r.status ELSE t.status END, "
    "t.version = CASE WHEN coalesce(t.version, 0) < r.version THEN r.version ELSE t.version END"
)
SET_NODES = (
    "UNWIND $rows AS r MATCH (t:Task {id: r.id}) "
    "SET t.name = r.name, t.tenant = r.tenant, t.submission_id = r.submission_id, "
    "t.status = CASE WHEN coalesce(t.version, 0) < r.version THEN r.status ELSE t.status END, "
    "t.version = CASE WHEN coalesce(t.version, 0) < r.version THEN r.version ELSE t.version END"
)
UPSERT_EDGES = "UNWIND $rows AS r MERGE (a:Task {id: r.src}) MERGE (b:Task {id: r.dst}) MERGE (a)-[:DEPENDS_ON]->(b)"
# For what cannot exist yet (plan_bulk): nodes, and edges [dependent, prerequisite] of just-created nodes.
CREATE_NODES = (
    "UNWIND $rows AS r CREATE (t:Task {id: r.id}) SET t.name = r.name, t.tenant = r.tenant, "
    "t.submission_id = r.submission_id, t.status = r.status, t.version = r.version"
)
CREATE_BARE = "UNWIND $ids AS i CREATE (:Task {id: i})"
# rows: [dependent, [prerequisites]], every node there already (created just before if need be)
CREATE_EDGES = (
    "UNWIND $rows AS r MATCH (a:Task {id: r[0]}) UNWIND r[1] AS d MATCH (b:Task {id: d}) CREATE (a)-[:DEPENDS_ON]->(b)"
)
SET_STATUS = (
    "UNWIND $rows AS r MATCH (t:Task {id: r.id}) WHERE coalesce(t.version, 0) < r.version "
    "SET t.status = r.status, t.version = r.version"
)
SAVE_CHECKPOINTS = "UNWIND $rows AS r MERGE (c:ProjectionCheckpoint {id: r.id}) SET c.next_offset = r.next_offset"
READ_CHECKPOINTS = "MATCH (c:ProjectionCheckpoint) RETURN c.id, c.next_offset"
SNAPSHOT_NODES = "MATCH (t:Task) RETURN t.id, t.name, t.tenant, t.submission_id, t.status, t.version ORDER BY t.id"
SNAPSHOT_EDGES = "MATCH (a:Task)-[:DEPENDS_ON]->(b:Task) RETURN a.id, b.id ORDER BY a.id, b.id"
SUBMISSION_NODES = "MATCH (t:Task) WHERE t.submission_id = $sid RETURN t.id, t.name, t.status ORDER BY t.name"
SUBMISSION_EDGES = (
    "MATCH (a:Task)-[:DEPENDS_ON]->(b:Task) WHERE a.submission_id = $sid RETURN a.id, b.id ORDER BY a.id, b.id"
)
SUBMISSION_NODE_COUNT = "MATCH (t:Task) WHERE t.submission_id = $sid RETURN count(t)"
SUBMISSION_EDGE_COUNT = "MATCH (a:Task)-[:DEPENDS_ON]->(b:Task) WHERE a.submission_id = $sid RETURN count(*)"
# Tasks that depend on $id and whose every prerequisite has succeeded (the two-hop aggregate). Two MATCH
# clauses, not one pattern: Neo4j uses a relationship at most once per pattern, so in one pattern a task
# whose only prerequisite is $id never matched (found by tests/test_graph_contract.py; Ladybug allows it).
NEWLY_UNBLOCKED = (
    "MATCH (x:Task {id: $id})<-[:DEPENDS_ON]-(t:Task) MATCH (t)-[:DEPENDS_ON]->(p:Task) "
    "WITH t, sum(CASE WHEN p.status = 'SUCCEEDED' THEN 0 ELSE 1 END) AS open "
    "WHERE open = 0 RETURN t.id ORDER BY t.id"
)
MAX_DEPTH = 100_000
# Transitive closures differ: Ladybug caps plain variable-length paths at 30 hops, so it uses SHORTEST.
CLOSURE = {
    "ladybug": {
        "needs": f"MATCH (t:Task {{id: $id}})-[:DEPENDS_ON* SHORTEST 1..{MAX_DEPTH}]->(p:Task) "
        "RETURN DISTINCT p.id ORDER BY p.id",
        "blocks": f"MATCH (t:Task {{id: $id}})<-[:DEPENDS_ON* SHORTEST 1..{MAX_DEPTH}]-(d:Task) "
        "RETURN DISTINCT d.id ORDER BY d.id",
    },
    "neo4j": {
        "needs": "MATCH (t:Task {id: $id})-[:DEPENDS_ON*1..]->(p:Task) RETURN DISTINCT p.id ORDER BY p.id",
        "blocks": "MATCH (t:Task {id: $id})<-[:DEPENDS_ON*1..]-(d:Task) RETURN DISTINCT d.id ORDER BY d.id",
    },
}

# A path dst -> ... -> src along DEPENDS_ON: adding src -> dst would close it into a cycle.
CYCLE_PATH = {
    "ladybug": f"MATCH p = (b:Task {{id: $dst}})-[:DEPENDS_ON* SHORTEST 1..{MAX_DEPTH}]->(a:Task {{id: $src}}) "
    "RETURN properties(nodes(p), 'id')",
    "neo4j": "MATCH p = shortestPath((b:Task {id: $dst})-[:DEPENDS_ON*]->(a:Task {id: $src})) "
    "RETURN [n IN nodes(p) | n.id]",
}

NODE_COLS = ("id", "name", "tenant", "submission_id", "status", "version")
BULK_MIN_NODES = 200  # below this many new nodes in a batch, MERGE is as fast as COPY and needs no files

_STATUS_OF: dict[type, Status] = {
    e.TaskAdmitted: Status.WAITING,
    e.TaskRejected: Status.REJECTED,
    e.TaskReady: Status.READY,
    e.TaskQueued: Status.QUEUED,
    e.TaskClaimed: Status.CLAIMED,
    e.TaskStarted: Status.RUNNING,
    e.TaskSucceeded: Status.SUCCEEDED,
    e.TaskRetryScheduled: Status.RETRY_WAIT,
    e.TaskDeadLettered: Status.DEAD_LETTERED,
    e.TaskCancelled: Status.CANCELLED,
    e.TaskUnqueued: Status.READY,
}


@dataclass
class GraphWrites:
    nodes: list[dict[str, Any]]
    edges: list[dict[str, Any]]
    statuses: list[dict[str, Any]]


def graph_writes(records: Iterable[r.EventRecord]) -> GraphWrites:
    """Pure: the node, edge and status rows a run of events projects to (last status per task wins)."""
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    statuses: dict[str, dict[str, Any]] = {}
    for rec in r.unpacked(records):
        p = rec.payload
        if isinstance(p, r.TasksAdmitted):  # each task's TaskSubmitted and TaskAdmitted
            for t in p.tasks:
                nodes.append(
                    {
                        "id": t.task_id,
                        "name": t.spec.name,
                        "tenant": t.spec.tenant,
                        "submission_id": t.submission(rec),
                        "status": Status.WAITING.value,
                        "version": 2,
                    }
                )
                edges.extend({"src": t.task_id, "dst": d} for d in t.spec.dependencies)
        elif isinstance(p, e.TaskSubmitted):
            nodes.append(
                {
                    "id": rec.task_id,
                    "name": p.spec.name,
                    "tenant": p.spec.tenant,
                    "submission_id": p.submission_id,
                    "status": Status.SUBMITTED.value,
                    "version": rec.version,
                }
            )
            edges.extend({"src": rec.task_id, "dst": d} for d in p.spec.dependencies)
        elif type(p) in _STATUS_OF and rec.task_id is not None:
            prev = statuses.get(rec.task_id)
            if prev is None or prev["version"] < rec.version:
                statuses[rec.task_id] = {"id": rec.task_id, "status": _STATUS_OF[type(p)].value, "version": rec.version}
    return GraphWrites(nodes, edges, list(statuses.values()))


EXISTING_NODES = "UNWIND $ids AS i MATCH (t:Task {id: i}) RETURN t.id, t.version"


@dataclass
class BulkPlan:
    """How a large batch is written: what cannot exist yet is created outright (COPY into Ladybug,
    CREATE in Neo4j); what may exist is merged. A task's edges are only ever written with its node's
    first version, so the edges of a task whose node is missing or bare (version NULL) cannot exist."""

    fresh: list[dict[str, Any]]  # nodes not in the graph, with any newer status of this batch folded in
    missing_prerequisites: list[str]  # edge targets not in the graph and not in this batch: bare nodes
    bare_before: list[dict[str, Any]]  # nodes an earlier batch's edges made bare: set their fields
    new_edges: list[tuple[str, str]]  # edges of tasks whose first version this is (deduplicated)
    merge_nodes: list[dict[str, Any]]
    merge_edges: list[dict[str, Any]]
    statuses: list[dict[str, Any]]


def wanted_ids(w: GraphWrites) -> set[str]:
    """The node ids whose presence (and version) a bulk plan needs to know."""
    return {n["id"] for n in w.nodes} | {e_["dst"] for e_ in w.edges}


def plan_bulk(w: GraphWrites, existing: dict[str, int | None]) -> BulkPlan:
    """Pure: split a batch's writes, given which of `wanted_ids(w)` exist (id -> version, None if bare)."""
    latest: dict[str, dict[str, Any]] = {}
    for n in w.nodes:
        if n["id"] not in latest or latest[n["id"]]["version"] < n["version"]:
            latest[n["id"]] = n
    first = {i for i in latest if existing.get(i) is None}  # first version of these tasks' nodes
    statuses = []
    for st in w.statuses:  # a status for a node being created goes into its row
        node = latest.get(st["id"])
        if node is not None and node["id"] not in existing and node["version"] < st["version"]:
            latest[node["id"]] = {**node, "status": st["status"], "version": st["version"]}
        else:
            statuses.append(st)
    return BulkPlan(
        fresh=[latest[i] for i in latest if i not in existing],
        missing_prerequisites=sorted({e_["dst"] for e_ in w.edges} - existing.keys() - latest.keys()),
        bare_before=[latest[i] for i in latest if i in existing and existing[i] is None],
        new_edges=sorted({(e_["src"], e_["dst"]) for e_ in w.edges if e_["src"] in first}),
        merge_nodes=[latest[i] for i in latest if existing.get(i) is not None],
        merge_edges=[e_ for e_ in w.edges if e_["src"] not in first],
        statuses=statuses,
    )


class GraphStore(Protocol):
    dialect: str

    def write(self, w: GraphWrites, checkpoints: list[dict[str, Any]]) -> None: ...

    def query(self, cypher: str, params: dict[str, Any] | None = None) -> list[list[Any]]: ...

    def query_many(self, queries: list[str], params: dict[str, Any] | None = None) -> list[list[list[Any]]]: ...

    def snapshot(self) -> dict[str, Any]:
        """Every node and edge with the checkpoints they reflect, read with no write in between."""
        ...

    def bulk_load(
        self, nodes: list[dict[str, Any]], edges: list[tuple[str, str]], checkpoints: list[dict[str, Any]]
    ) -> None:
        """Load an empty graph: nodes (NODE_COLS), edges (dependent, prerequisite), checkpoints last."""
        ...

    def close(self) -> None: ...


class LadybugStore:
    """The embedded graph. Only one process may open the file read-write: the graph service."""

    dialect = "ladybug"

    def __init__(self, path: Path) -> None:
        import ladybug

        path.parent.mkdir(parents=True, exist_ok=True)
        self.copy_dir = path.parent / "copy"  # CSV files COPY loads from, deleted after each load
        self.db = ladybug.Database(str(path))
        self.conn = ladybug.Connection(self.db)
        self.lock = threading.Lock()
        # Variable-length paths are capped at 30 hops by default; closures over deep chains need more.
        self.conn.execute(f"CALL var_length_extend_max_depth={MAX_DEPTH}")
        for ddl in (
            "CREATE NODE TABLE IF NOT EXISTS Task(id STRING PRIMARY KEY, name STRING, tenant STRING, "
            "submission_id STRING, status STRING, version INT64)",
            "CREATE REL TABLE IF NOT EXISTS DEPENDS_ON(FROM Task TO Task)",
            "CREATE NODE TABLE IF NOT EXISTS ProjectionCheckpoint(id STRING PRIMARY KEY, next_offset INT64)",
        ):
            self.conn.execute(ddl)

    def write(self, w: GraphWrites, checkpoints: list[dict[str, Any]]) -> None:
        """One transaction. Tasks new to the graph (and their edges) are bulk loaded with COPY; MERGE
        is kept for what may already be there. A 10,000-task DAG took 3.5 s to MERGE and 0.15 s to COPY
        (measured); a task's edges are only ever written with its node's first version, so the edges of
        a task whose node is missing or bare (version NULL) cannot exist yet."""
        with self.lock:
            self.conn.execute("BEGIN TRANSACTION")
            try:
                nodes, edges, statuses = self._bulk_load(w)
                for cypher, rows in (
                    (UPSERT_NODES, nodes),
                    (UPSERT_EDGES, edges),
                    (SET_STATUS, statuses),
                    (SAVE_CHECKPOINTS, checkpoints),
                ):
                    if rows:
                        self.conn.execute(cypher, {"rows": rows})
                self.conn.execute("COMMIT")
            except Exception:
                self.conn.execute("ROLLBACK")
                raise

    def _bulk_load(self, w: GraphWrites) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """COPY the nodes and edges that cannot exist yet; return the rows still to MERGE or SET."""
        if len(w.nodes) < BULK_MIN_NODES:
            return w.nodes, w.edges, w.statuses
        found = self.conn.execute(EXISTING_NODES, {"ids": sorted(wanted_ids(w))}).get_all()  # type: ignore[union-attr]
        plan = plan_bulk(w, {str(i): (None if v is None else int(v)) for i, v in found})
        bare = [{"id": i} for i in plan.missing_prerequisites]
        self.copy_dir.mkdir(parents=True, exist_ok=True)
        files = []
        try:
            if plan.fresh or bare:
                files.append(self.copy_dir / f"nodes-{uuid.uuid4().hex}.csv")
                with files[-1].open("w", newline="") as f:
                    csv.writer(f).writerows([n.get(c) for c in NODE_COLS] for n in plan.fresh + bare)
                self.conn.execute(f"COPY Task FROM '{files[-1]}' (HEADER=false)")
            if plan.new_edges:
                files.append(self.copy_dir / f"edges-{uuid.uuid4().hex}.csv")
                with files[-1].open("w", newline="") as f:
                    csv.writer(f).writerows(plan.new_edges)
                self.conn.execute(f"COPY DEPENDS_ON FROM '{files[-1]}' (HEADER=false)")
        finally:
            for path in files:
                path.unlink(missing_ok=True)
        if plan.bare_before:  # nodes made bare by an earlier batch's edges: MATCH is 2x faster than MERGE here
            self.conn.execute(SET_NODES, {"rows": plan.bare_before})
        return plan.merge_nodes, plan.merge_edges, plan.statuses

    def query(self, cypher: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        return self.query_many([cypher], params)[0]

    def query_many(self, queries: list[str], params: dict[str, Any] | None = None) -> list[list[list[Any]]]:
        """Several reads with no write in between (the projection writes under the same lock)."""
        with self.lock:
            return [[list(row) for row in self.conn.execute(q, params or {}).get_all()] for q in queries]  # type: ignore[union-attr]

    def snapshot(self) -> dict[str, Any]:
        nodes, edges, cps = self.query_many([SNAPSHOT_NODES, SNAPSHOT_EDGES, READ_CHECKPOINTS])
        return {"nodes": nodes, "edges": edges, "checkpoints": {str(c): int(o) for c, o in cps}}

    def bulk_load(
        self, nodes: list[dict[str, Any]], edges: list[tuple[str, str]], checkpoints: list[dict[str, Any]]
    ) -> None:
        """COPY from CSV files, in one transaction: a MERGE per row cost 155-182 s at 1M events, COPY 36 s."""
        self.copy_dir.mkdir(parents=True, exist_ok=True)
        nodes_csv = self.copy_dir / f"bulk-nodes-{uuid.uuid4().hex}.csv"
        edges_csv = self.copy_dir / f"bulk-edges-{uuid.uuid4().hex}.csv"
        try:
            with nodes_csv.open("w", newline="") as f:
                csv.writer(f).writerows([n.get(c) for c in NODE_COLS] for n in nodes)
            with edges_csv.open("w", newline="") as f:
                csv.writer(f).writerows(edges)
            with self.lock:
                self.conn.execute("BEGIN TRANSACTION")
                try:
                    if nodes:
                        self.conn.execute(f"COPY Task FROM '{nodes_csv}' (HEADER=false)")
                    if edges:
                        self.conn.execute(f"COPY DEPENDS_ON FROM '{edges_csv}' (HEADER=false)")
                    if checkpoints:
                        self.conn.execute(SAVE_CHECKPOINTS, {"rows": checkpoints})
                    self.conn.execute("COMMIT")
                except Exception:
                    self.conn.execute("ROLLBACK")
                    raise
        finally:
            nodes_csv.unlink(missing_ok=True)
            edges_csv.unlink(missing_ok=True)

    def close(self) -> None:
        self.conn.close()
        self.db.close()


# Labels a Neo4j namespace prefixes (see the module docstring); relationship types are upper case.
_LABELS = re.compile(r":(Task|DEPENDS_ON|ProjectionCheckpoint|ProjectionLock)\b")
NEO4J_BATCH = 20_000  # rows per transaction when Neo4j loads, clears or moves a whole graph
LIVE, REPLAY, RETIRED = "", "Replay", "Retired"  # the namespaces replay uses
SWAP_STEPS = ("clear", "retire", "promote")  # Neo4jStore.swap_in, in order


class Neo4jStore:
    """Neo4j through the official driver. Same Cypher as Ladybug except closures and schema DDL.

    Every write transaction first takes the namespace's lock node, and so does `snapshot`: a snapshot
    sees the rows and checkpoints of whole batches only (Neo4j reads at read-committed, so reading
    nodes, edges and checkpoints one after the other would otherwise see a batch between them)."""

    dialect = "neo4j"

    def __init__(self, uri: str, user: str, password: str, database: str | None = None, namespace: str = "") -> None:
        import neo4j

        # notifications off: a warning per query about a property no node has yet (empty graph) says nothing
        self.driver = neo4j.GraphDatabase.driver(
            uri, auth=(user, password) if password else None, notifications_min_severity="OFF"
        )
        self.database = database
        self.namespace = namespace
        self.driver.verify_connectivity()
        for ns in {namespace, LIVE, REPLAY, RETIRED}:  # a swap moves nodes into each of these
            low = ns.lower()
            for ddl in (
                f"CREATE CONSTRAINT {low}task_id IF NOT EXISTS FOR (t:{ns}Task) REQUIRE t.id IS UNIQUE",
                f"CREATE CONSTRAINT {low}checkpoint_id IF NOT EXISTS "
                f"FOR (c:{ns}ProjectionCheckpoint) REQUIRE c.id IS UNIQUE",
                f"CREATE INDEX {low}task_submission IF NOT EXISTS FOR (t:{ns}Task) ON (t.submission_id)",
            ):
                self.driver.execute_query(ddl, database_=self.database)

    def _q(self, cypher: str, namespace: str | None = None) -> str:
        """The Cypher with this store's (or `namespace`'s) labels."""
        ns = self.namespace if namespace is None else namespace
        if not ns:
            return cypher
        return _LABELS.sub(lambda m: f":{ns.upper() + '_' if m.group(1) == 'DEPENDS_ON' else ns}{m.group(1)}", cypher)

    def _lock(self, t: Any) -> None:
        t.run(self._q("MERGE (l:ProjectionLock {id: 'graph'}) SET l.at = timestamp()")).consume()

    def write(self, w: GraphWrites, checkpoints: list[dict[str, Any]]) -> None:
        """One transaction. A large batch's tasks new to the graph are CREATEd with their edges (the
        plan of `plan_bulk`), the rest MERGEd. 10,000 tasks with 30,000 edges, warm, on an idle
        server: 2.1-2.3 s merged, 1.6 s so; edges sent per dependent and MATCHed, ~20% less CPU again
        (measured). A cold server (JIT) takes 2-3x that for its first few large batches."""

        def tx(t: Any) -> None:
            self._lock(t)
            nodes, edges, statuses = w.nodes, w.edges, w.statuses
            if len(w.nodes) >= BULK_MIN_NODES:
                found = t.run(self._q(EXISTING_NODES), ids=sorted(wanted_ids(w))).values()
                plan = plan_bulk(w, {i: v for i, v in found})
                grouped: dict[str, list[str]] = {}
                for src, dst in plan.new_edges:
                    grouped.setdefault(src, []).append(dst)
                if plan.missing_prerequisites:
                    t.run(self._q(CREATE_BARE), ids=plan.missing_prerequisites).consume()
                for cypher, rows in (
                    (CREATE_NODES, plan.fresh),
                    (SET_NODES, plan.bare_before),
                    (CREATE_EDGES, [[src, dsts] for src, dsts in grouped.items()]),
                ):
                    if rows:
                        t.run(self._q(cypher), rows=rows).consume()
                nodes, edges, statuses = plan.merge_nodes, plan.merge_edges, plan.statuses
            for cypher, rows in (
                (UPSERT_NODES, nodes),
                (UPSERT_EDGES, edges),
                (SET_STATUS, statuses),
                (SAVE_CHECKPOINTS, checkpoints),
            ):
                if rows:
                    t.run(self._q(cypher), rows=rows).consume()

        with self.driver.session(database=self.database) as s:
            s.execute_write(tx)

    def warm_up(self) -> None:
        """Plan the writer's statements once, on no rows, so the first real batch does not pay for it."""
        statements = (EXISTING_NODES, CREATE_BARE, CREATE_NODES, SET_NODES, CREATE_EDGES, UPSERT_NODES, UPSERT_EDGES)
        for cypher in (*statements, SET_STATUS):
            param = "ids" if cypher in (EXISTING_NODES, CREATE_BARE) else "rows"
            self.driver.execute_query(self._q(cypher), {param: []}, database_=self.database)

    def query(self, cypher: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        records, _, _ = self.driver.execute_query(self._q(cypher), params or {}, database_=self.database)
        return [list(rec.values()) for rec in records]

    def query_many(self, queries: list[str], params: dict[str, Any] | None = None) -> list[list[list[Any]]]:
        def tx(t: Any) -> list[list[list[Any]]]:
            return [[list(rec.values()) for rec in t.run(self._q(q), params or {})] for q in queries]

        with self.driver.session(database=self.database) as s:
            return s.execute_read(tx)  # type: ignore[no-any-return]

    def snapshot(self) -> dict[str, Any]:
        def tx(t: Any) -> dict[str, Any]:
            self._lock(t)  # waits out a batch being written, and holds the next one off
            nodes, edges, cps = (
                [list(r.values()) for r in t.run(self._q(q))]
                for q in (SNAPSHOT_NODES, SNAPSHOT_EDGES, READ_CHECKPOINTS)
            )
            return {"nodes": nodes, "edges": edges, "checkpoints": {str(c): int(o) for c, o in cps}}

        with self.driver.session(database=self.database) as s:
            return s.execute_write(tx)  # type: ignore[no-any-return]

    def _each_batch(self, cypher: str, rows: list[Any], namespace: str | None = None) -> None:
        q = self._q(cypher, namespace)
        for i in range(0, len(rows), NEO4J_BATCH):
            self.driver.execute_query(q, rows=rows[i : i + NEO4J_BATCH], database_=self.database)

    def bulk_load(
        self, nodes: list[dict[str, Any]], edges: list[tuple[str, str]], checkpoints: list[dict[str, Any]]
    ) -> None:
        """CREATE in batches of NEO4J_BATCH rows (the graph is empty: nothing to MERGE against); the
        checkpoints last, so a load cut short is never taken for a complete one."""
        self.clear()
        self._each_batch(CREATE_NODES, [{c: n.get(c) for c in NODE_COLS} for n in nodes])
        grouped: dict[str, list[str]] = {}
        for src, dst in edges:
            grouped.setdefault(src, []).append(dst)
        self._each_batch(CREATE_EDGES, [[src, dsts] for src, dsts in grouped.items()])
        self._each_batch(SAVE_CHECKPOINTS, checkpoints)

    def _until_none(self, cypher: str, namespace: str | None = None) -> None:
        q = self._q(cypher, namespace)
        while True:
            records, _, _ = self.driver.execute_query(q, n=NEO4J_BATCH, database_=self.database)
            if not records or not records[0].values()[0]:
                return

    def clear(self, namespace: str | None = None) -> None:
        """Delete every node, edge and checkpoint of a namespace (this store's by default)."""
        for label in ("Task", "ProjectionCheckpoint", "ProjectionLock"):
            self._until_none(f"MATCH (n:{label}) WITH n LIMIT $n DETACH DELETE n RETURN count(*)", namespace)

    def _move(self, source: str, target: str) -> None:
        """Relabel a namespace's graph into another, batch by batch (target empty)."""
        src = self._q(":Task", source)[1:], self._q(":ProjectionCheckpoint", source)[1:]
        dst = self._q(":Task", target)[1:], self._q(":ProjectionCheckpoint", target)[1:]
        rel_src, rel_dst = self._q(":DEPENDS_ON", source)[1:], self._q(":DEPENDS_ON", target)[1:]
        self._until_none(
            f"MATCH (a)-[r:{rel_src}]->(b) WITH a, b, r LIMIT $n CREATE (a)-[:{rel_dst}]->(b) DELETE r RETURN count(*)",
            LIVE,
        )
        for s_label, d_label in zip(src, dst, strict=True):
            self._until_none(
                f"MATCH (n:{s_label}) WITH n LIMIT $n SET n:{d_label} REMOVE n:{s_label} RETURN count(*)", LIVE
            )

    def swap_in(
        self,
        source: str = REPLAY,
        retired: str = RETIRED,
        start: str = SWAP_STEPS[0],
        reached: Callable[[str], None] = lambda _step: None,
    ) -> None:
        """Make `source`'s graph the live one; the live one moves to `retired` (replacing what was there).
        Run it while nothing writes the live graph (the graph process does, before it starts projecting).

        Three steps (SWAP_STEPS): clear the old retired graph, move the live one there, move `source`'s
        in. Each works batch by batch on what is left, so a swap cut short (the process killed, a server
        error) is finished by running it again from the step it was in: `reached` is told each step as
        it begins, and `start` names the one to resume."""
        steps = {
            "clear": lambda: self.clear(retired),
            "retire": lambda: self._move(LIVE, retired),
            "promote": lambda: self._move(source, LIVE),
        }
        for step in SWAP_STEPS[SWAP_STEPS.index(start) :]:
            reached(step)
            steps[step]()

    def close(self) -> None:
        self.driver.close()


class GraphProjection:
    """The events -> graph projection, over either store."""

    def __init__(self, store: GraphStore, name: str = "graph") -> None:
        self.store = store
        self.name = name

    def checkpoints(self, topic: str) -> dict[int, int]:
        out = {}
        for cid, offset in self.store.query(READ_CHECKPOINTS):
            t, _, part = str(cid).rpartition("/")
            if t == f"{self.name}:{topic}":
                out[int(part)] = int(offset)
        return out

    def apply(self, batch: Batch) -> None:
        w = graph_writes(item.record for item in batch.items if isinstance(item.record, r.EventRecord))
        cps = [{"id": f"{self.name}:{batch.topic}/{p}", "next_offset": o} for p, o in batch.next_offsets.items()]
        self.store.write(w, cps)

    def close(self) -> None:
        self.store.close()


class BulkGraphProjection:
    """The graph projection for an empty store (replay): folds every batch in memory and bulk loads the
    result at `flush` (COPY into Ladybug, batched CREATE into Neo4j), instead of paying a MERGE per row.
    Same rows, same checkpoints as GraphProjection would write; memory grows with the number of tasks,
    not events."""

    def __init__(self, store: GraphStore, name: str = "graph") -> None:
        self.store = store
        self.name = name
        self.nodes: dict[str, dict[str, Any]] = {}
        self.edges: set[tuple[str, str]] = set()
        self.offsets: dict[str, int] = {}

    def checkpoints(self, topic: str) -> dict[int, int]:
        prefix = f"{self.name}:{topic}/"
        return {int(k[len(prefix) :]): v for k, v in self.offsets.items() if k.startswith(prefix)}

    def apply(self, batch: Batch) -> None:
        w = graph_writes(item.record for item in batch.items if isinstance(item.record, r.EventRecord))
        for n in w.nodes:
            cur = self.nodes.get(n["id"])
            if cur is None or (cur["version"] or 0) < n["version"]:
                self.nodes[n["id"]] = dict(n)
            else:  # a status seen before its node: keep the later status, take the node's other fields
                self.nodes[n["id"]] = {**n, "status": cur["status"], "version": cur["version"]}
        self.edges.update((e_["src"], e_["dst"]) for e_ in w.edges)
        for st in w.statuses:
            cur = self.nodes.setdefault(st["id"], {"id": st["id"], "version": 0})
            if (cur.get("version") or 0) < st["version"]:
                cur.update(status=st["status"], version=st["version"])
        for p, o in batch.next_offsets.items():
            self.offsets[f"{self.name}:{batch.topic}/{p}"] = o

    def flush(self) -> None:
        for _, dst in self.edges:  # a prerequisite whose own events are not in the log: a bare node, as MERGE makes
            self.nodes.setdefault(dst, {"id": dst})
        cps = [{"id": k, "next_offset": v} for k, v in self.offsets.items()]
        self.store.bulk_load(list(self.nodes.values()), sorted(self.edges), cps)

    def close(self) -> None:
        self.store.close()


class GraphQueries:
    """The questions the seed asks of the DAG, on any store."""

    def __init__(self, store: GraphStore) -> None:
        self.store = store

    def nodes(self, submission_id: str) -> list[tuple[str, str, str]]:
        return [(a, b, c) for a, b, c in self.store.query(SUBMISSION_NODES, {"sid": submission_id})]

    def edges(self, submission_id: str) -> list[tuple[str, str]]:
        return [(a, b) for a, b in self.store.query(SUBMISSION_EDGES, {"sid": submission_id})]

    def counts(self, submission_id: str) -> dict[str, int]:
        """How many of a submission's tasks and dependency edges the graph holds (cheap to poll)."""
        nodes, edges = self.store.query_many([SUBMISSION_NODE_COUNT, SUBMISSION_EDGE_COUNT], {"sid": submission_id})
        return {"nodes": int(nodes[0][0]), "edges": int(edges[0][0])}

    def newly_unblocked(self, task_id: str) -> list[str]:
        return [row[0] for row in self.store.query(NEWLY_UNBLOCKED, {"id": task_id})]

    def needs(self, task_id: str) -> list[str]:
        return [row[0] for row in self.store.query(CLOSURE[self.store.dialect]["needs"], {"id": task_id})]

    def blocks(self, task_id: str) -> list[str]:
        return [row[0] for row in self.store.query(CLOSURE[self.store.dialect]["blocks"], {"id": task_id})]

    def order(self, submission_id: str) -> list[str]:
        """A topological order of a submission's tasks: every prerequisite before its dependents
        (ties broken by name, so the order is stable)."""
        return topological_order(self.nodes(submission_id), self.edges(submission_id))

    def would_close_cycle(self, src: str, dst: str) -> list[str] | None:
        """If `src` were made to depend on `dst`, the cycle it would close ([src, dst, ..., src]), else None."""
        if src == dst:
            return [src, src]
        rows = self.store.query(CYCLE_PATH[self.store.dialect], {"src": src, "dst": dst})
        return [src, *rows[0][0]] if rows else None

    def checkpoints(self) -> dict[str, int]:
        return {str(cid): int(off) for cid, off in self.store.query(READ_CHECKPOINTS)}

    def snapshot(self) -> dict[str, Any]:
        """Every node and edge with the checkpoints they reflect, read atomically."""
        return self.store.snapshot()


def topological_order(nodes: list[tuple[str, str, str]], edges: list[tuple[str, str]]) -> list[str]:
    """Kahn's algorithm over (id, name, status) nodes and (dependent, prerequisite) edges."""
    import heapq

    name = {i: n or "" for i, n, _ in nodes}
    waiting = {i: 0 for i in name}
    dependents: dict[str, list[str]] = {i: [] for i in name}
    for dep, pre in edges:
        if dep in waiting and pre in waiting:
            waiting[dep] += 1
            dependents[pre].append(dep)
    ready = [(name[i], i) for i, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(i)
        for d in dependents[i]:
            waiting[d] -= 1
            if waiting[d] == 0:
                heapq.heappush(ready, (name[d], d))
    if len(out) != len(name):
        raise ValueError("the graph has a cycle; no topological order exists")
    return out
