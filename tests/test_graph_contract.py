"""One contract for the graph store, run on both backends: Ladybug, and Neo4j on a server of its own
started from the project's jars (skipped, with the reason, only where no JVM can run it). Random DAGs
are checked against plain Python; the bulk loaders replay uses against the live writers."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from taskstream.projections.graph import GraphProjection, GraphQueries, LadybugStore, Neo4jStore
from taskstream.projections.runner import Batch, Item
from taskstream.schemas.records import EventRecord

from taskstream.core import events as e
from taskstream.core.model import TaskSpec
from tests.conftest import jvm_problem, neo4j_server


@pytest.fixture(scope="module")
def neo4j(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """A Neo4j server for this module, started only if a Neo4j case runs."""
    if why := jvm_problem():
        pytest.skip(f"no Neo4j server can run here: {why}")
    with neo4j_server(tmp_path_factory.mktemp("neo4j")) as server:
        yield server


def open_store(request: pytest.FixtureRequest, kind: str, tmp: Path, namespace: str = "") -> Any:
    """A fresh, empty store of `kind`: its own Ladybug file, or its own namespace in the Neo4j server."""
    if kind == "ladybug":
        return LadybugStore(tmp / f"{namespace or 'g'}-{uuid.uuid4().hex[:8]}.lbug")
    uri, user, password = request.getfixturevalue("neo4j")
    store = Neo4jStore(uri, user, password, namespace=namespace or f"T{uuid.uuid4().hex[:10]}")
    store.clear()
    return store


@pytest.fixture(scope="module", params=["ladybug", "neo4j"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    s = open_store(request, request.param, tmp_path_factory.mktemp("graph"))
    yield s
    s.close()


@pytest.fixture(params=["ladybug", "neo4j"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def project(
    store: object, dag: dict[str, list[str]], statuses: dict[str, str] | None = None, offset: int = 0
) -> tuple[str, dict[str, str], GraphProjection]:
    """Project a DAG (name -> prerequisite names) as events; returns the submission id and name -> id."""
    sid = str(uuid.uuid4())
    ids = {n: f"{sid}/{n}" for n in dag}
    items = []
    for i, (name, deps) in enumerate(dag.items()):
        spec = TaskSpec(name=name, tenant="t", argv=("x",), dependencies=tuple(ids[d] for d in deps))
        items.append(
            Item(0, offset + i, 0, EventRecord(f"{ids[name]}:1", ids[name], sid, 1, 0, "n", e.TaskSubmitted(sid, spec)))
        )
    for j, (name, status) in enumerate((statuses or {}).items()):
        payload = e.TaskSucceeded("c", 0, "", 1) if status == "SUCCEEDED" else e.TaskReady("r")
        items.append(
            Item(0, offset + len(dag) + j, 0, EventRecord(f"{ids[name]}:2", ids[name], sid, 2, 0, "n", payload))
        )
    proj = GraphProjection(store)  # type: ignore[arg-type]
    batch = Batch("events", items, {0: offset + len(items)})
    proj.apply(batch)
    return sid, ids, proj


def closure(dag: dict[str, list[str]], start: str, reverse: bool = False) -> set[str]:
    edges = {n: set(d) for n, d in dag.items()}
    if reverse:
        edges = {n: {m for m, d in dag.items() if n in d} for n in dag}
    seen: set[str] = set()
    todo = list(edges[start])
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(edges[n])
    return seen


@st.composite
def random_dags(draw: st.DrawFn) -> dict[str, list[str]]:
    n = draw(st.integers(2, 25))
    return {
        f"n{i}": sorted(draw(st.sets(st.sampled_from([f"n{j}" for j in range(i)]), max_size=3))) if i else []
        for i in range(n)
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(random_dags(), st.data())
def test_closures_and_edges_match_python(store: object, dag: dict[str, list[str]], data: st.DataObject) -> None:
    sid, ids, _ = project(store, dag)
    q = GraphQueries(store)  # type: ignore[arg-type]
    name_of = {v: k for k, v in ids.items()}
    assert sorted((name_of[a], name_of[b]) for a, b in q.edges(sid)) == sorted(
        (n, d) for n, ds in dag.items() for d in ds
    )
    x = data.draw(st.sampled_from(sorted(dag)))
    assert {name_of[t] for t in q.needs(ids[x])} == closure(dag, x)
    assert {name_of[t] for t in q.blocks(ids[x])} == closure(dag, x, reverse=True)


def test_deep_chains_beyond_thirty_hops(store: object) -> None:
    depth = 120
    dag = {f"c{i}": ([f"c{i - 1}"] if i else []) for i in range(depth)}
    _, ids, _ = project(store, dag)
    q = GraphQueries(store)  # type: ignore[arg-type]
    assert len(q.needs(ids[f"c{depth - 1}"])) == depth - 1
    assert len(q.blocks(ids["c0"])) == depth - 1


def test_newly_unblocked_waits_for_every_prerequisite(store: object) -> None:
    dag = {"a": [], "b": [], "join": ["a", "b"], "solo": ["a"]}
    _, ids, _ = project(store, dag, statuses={"a": "SUCCEEDED"})
    q = GraphQueries(store)  # type: ignore[arg-type]
    assert q.newly_unblocked(ids["a"]) == [ids["solo"]]


def test_applying_a_batch_twice_changes_nothing_and_checkpoints_advance(store: object) -> None:
    dag = {"p": [], "q": ["p"]}
    sid, ids, proj = project(store, dag, offset=10_000)
    q = GraphQueries(store)  # type: ignore[arg-type]
    before = (sorted(q.edges(sid)), sorted(q.nodes(sid)))
    # the same events again (a redelivery), with a stale status event after a newer one
    items = [
        Item(
            0,
            1,
            0,
            EventRecord(
                f"{ids['q']}:1",
                ids["q"],
                sid,
                1,
                0,
                "n",
                e.TaskSubmitted(sid, TaskSpec("q", "t", ("x",), dependencies=(ids["p"],))),
            ),
        )
    ]
    proj.apply(Batch("events", items, {0: 10_002}))
    assert (sorted(q.edges(sid)), sorted(q.nodes(sid))) == before
    assert proj.checkpoints("events")[0] == 10_002


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(random_dags(), st.data())
def test_topological_order_and_cycle_checks_match_python(
    store: object, dag: dict[str, list[str]], data: st.DataObject
) -> None:
    sid, ids, _ = project(store, dag)
    q = GraphQueries(store)  # type: ignore[arg-type]
    name_of = {v: k for k, v in ids.items()}
    order = [name_of[t] for t in q.order(sid)]
    assert sorted(order) == sorted(dag)
    position = {n: i for i, n in enumerate(order)}
    for n, deps in dag.items():
        assert all(position[d] < position[n] for d in deps), f"{n} before one of {deps}"
    a = data.draw(st.sampled_from(sorted(dag)))
    b = data.draw(st.sampled_from(sorted(dag)))
    path = q.would_close_cycle(ids[a], ids[b])  # a would depend on b
    closes = a == b or a in closure(dag, b)  # b already (transitively) needs a
    assert (path is not None) == closes
    if path:
        names = [name_of[p] for p in path]
        assert names[0] == names[-1] == a and names[1] == b
        for x, y in zip(names[1:], names[2:], strict=False):
            assert y in dag[x], f"{x} does not depend on {y}"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(random_dags(), st.data())
def test_bulk_replay_loads_the_same_graph_as_incremental_projection(
    request: pytest.FixtureRequest, kind: str, dag: dict[str, list[str]], data: st.DataObject
) -> None:
    """Replay's bulk loader (COPY into Ladybug, batched CREATE into Neo4j) and the live, MERGE-based
    writer agree row for row, and a snapshot reads the same rows and checkpoints."""
    from taskstream.projections.graph import SNAPSHOT_EDGES, SNAPSHOT_NODES, BulkGraphProjection

    sid = "s"
    ids = {n: f"id-{n}" for n in dag}
    recs = []
    for name, deps in dag.items():
        spec = TaskSpec(name=name, tenant="t", argv=("x",), dependencies=tuple(ids[d] for d in deps))
        recs.append(EventRecord(f"{ids[name]}:1", ids[name], sid, 1, 0, "n", e.TaskSubmitted(sid, spec)))
    done = data.draw(st.sets(st.sampled_from(sorted(dag))))
    recs += [EventRecord(f"{ids[n]}:2", ids[n], sid, 2, 0, "n", e.TaskSucceeded("c", 0, "", 1)) for n in sorted(done)]
    # a bare prerequisite whose own events are not in the log
    orphan = TaskSpec(name="orphan", tenant="t", argv=("x",), dependencies=("never-submitted",))
    recs.append(EventRecord("o:1", "o", sid, 1, 0, "n", e.TaskSubmitted(sid, orphan)))
    cut = data.draw(st.integers(1, len(recs)))
    batches = [recs[:cut], recs[cut:]]
    with tempfile.TemporaryDirectory() as tmp:
        live, bulk = open_store(request, kind, Path(tmp), "Inc"), open_store(request, kind, Path(tmp), "Blk")
        inc, blk = GraphProjection(live), BulkGraphProjection(bulk)
        offset = 0
        for b in batches:
            items = [Item(0, offset + i, 0, rec) for i, rec in enumerate(b)]
            offset += len(b)
            for proj in (inc, blk):
                proj.apply(Batch("events", items, {0: offset}))
        blk.flush()
        for q in (SNAPSHOT_NODES, SNAPSHOT_EDGES):
            assert live.query(q) == bulk.query(q)
        assert inc.checkpoints("events") == blk.checkpoints("events") == {0: len(recs)}
        assert GraphProjection(bulk).checkpoints("events") == {0: len(recs)}
        assert live.snapshot() == bulk.snapshot()
        assert len(live.snapshot()["nodes"]) == len(dag) + 2  # with "orphan" and its bare prerequisite
        live.close()
        bulk.close()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(30, 150), seed=st.integers(0, 2**32), data=st.data())
def test_packed_admissions_bulk_loaded_give_the_graph_their_events_merged_give(
    request: pytest.FixtureRequest, kind: str, n: int, seed: int, data: st.DataObject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live writer creates tasks new to the graph outright (COPY into Ladybug, CREATE in Neo4j:
    plan_bulk) from packed admissions split over batches in any way; MERGEing the unpacked events one
    row at a time must give the same graph."""
    import random

    from taskstream.projections import graph
    from taskstream.projections.graph import SNAPSHOT_EDGES, SNAPSHOT_NODES
    from taskstream.schemas.records import AdmittedTask, TasksAdmitted, task_events

    rng = random.Random(seed)
    sid = "s"
    ids = [f"id-{i}" for i in range(n)]
    deps = {i: sorted({rng.randrange(i) for _ in range(3)}) if i else [] for i in range(n)}
    tasks = [
        AdmittedTask(ids[i], TaskSpec(f"n{i}", "t", ("x",), dependencies=tuple(ids[d] for d in deps[i])))
        for i in range(n)
    ]
    rng.shuffle(tasks)  # a packed record holds tasks in any order; prerequisites may come later
    size = data.draw(st.integers(5, n))
    packed = [
        EventRecord(f"{sid}:admitted:{i}", None, sid, 0, 5, "n", TasksAdmitted("n", tuple(tasks[i : i + size])))
        for i in range(0, n, size)
    ]
    later = [EventRecord(f"{ids[i]}:3", ids[i], sid, 3, 6, "n", e.TaskReady("r")) for i in range(0, n, 7)]
    cut = data.draw(st.integers(1, len(packed)))
    batches = [packed[:cut], packed[cut:] + later]
    with tempfile.TemporaryDirectory() as tmp:
        bulk, merged = open_store(request, kind, Path(tmp), "Bulk"), open_store(request, kind, Path(tmp), "Merged")
        offset = 0
        with monkeypatch.context() as m:
            m.setattr(graph, "BULK_MIN_NODES", 1)  # COPY whatever the batch size
            for b in batches:
                items = [Item(0, offset + i, 0, rec) for i, rec in enumerate(b)]
                offset += len(b)
                GraphProjection(bulk).apply(Batch("events", items, {0: offset}))
        with monkeypatch.context() as m:
            m.setattr(graph, "BULK_MIN_NODES", 10**9)  # MERGE only
            unpacked = [x for b in batches for rec in b for x in task_events(rec)]
            items = [Item(0, i, 0, rec) for i, rec in enumerate(unpacked)]
            GraphProjection(merged).apply(Batch("events", items, {0: len(unpacked)}))
        for q in (SNAPSHOT_NODES, SNAPSHOT_EDGES):
            assert bulk.query(q) == merged.query(q)
        statuses = dict(bulk.query("MATCH (t:Task) RETURN t.id, t.status"))
        assert len(statuses) == n and statuses[ids[7]] == "READY" and statuses[ids[1]] == "WAITING"
        assert len(bulk.query(SNAPSHOT_EDGES)) == sum(len(d) for d in deps.values())
        bulk.close()
        merged.close()


def test_neo4j_swap_makes_the_replayed_namespace_live_and_keeps_the_old_one(request: pytest.FixtureRequest) -> None:
    """Replay builds beside the live graph (community Neo4j has one database); --swap moves labels."""
    from taskstream.projections.graph import LIVE, REPLAY, RETIRED

    uri, user, password = request.getfixturevalue("neo4j")
    live, replay = Neo4jStore(uri, user, password, namespace=LIVE), Neo4jStore(uri, user, password, namespace=REPLAY)
    try:
        for ns in (LIVE, REPLAY, RETIRED):
            live.clear(ns)
        sid_old, ids_old, _ = project(live, {"a": [], "b": ["a"]})
        old = live.snapshot()
        nodes = [{"id": "r1", "name": "r1", "tenant": "t", "submission_id": "s", "status": "SUCCEEDED", "version": 9}]
        nodes.append({"id": "r2", "name": "r2", "tenant": "t", "submission_id": "s", "status": "READY", "version": 3})
        replay.bulk_load(nodes, [("r2", "r1")], [{"id": "graph:events/0", "next_offset": 42}])
        rebuilt = replay.snapshot()
        assert live.snapshot() == old  # building the replay beside it left the live graph alone
        live.swap_in()
        assert live.snapshot() == rebuilt
        assert replay.snapshot() == {"nodes": [], "edges": [], "checkpoints": {}}
        retired = Neo4jStore(uri, user, password, namespace=RETIRED)
        assert retired.snapshot() == old
        assert GraphQueries(live).needs("r2") == ["r1"] and GraphQueries(retired).nodes(sid_old)
        retired.close()
    finally:
        live.close()
        replay.close()


class _CutAfter:
    """A Neo4j driver that fails its nth query (a graph process killed, or the server gone, mid-swap)."""

    def __init__(self, driver: Any, n: int) -> None:
        self.driver, self.left = driver, n

    def execute_query(self, *args: Any, **kw: Any) -> Any:
        self.left -= 1
        if self.left < 0:
            raise RuntimeError("cut short")
        return self.driver.execute_query(*args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.driver, name)


@pytest.mark.parametrize("cut_after", [1, 4, 8, 12, 18, 22])
def test_a_neo4j_swap_cut_short_is_finished_by_running_it_again_from_its_step(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, cut_after: int
) -> None:
    """One row per batch, so every step takes several queries; the swap is cut after `cut_after` of
    them (in the clear, retire or promote step) and run again from the step it was in, as the graph
    process does with the step kept in the swap request. The result is the uncut swap's."""
    from taskstream.projections import graph
    from taskstream.projections.graph import LIVE, REPLAY, RETIRED

    monkeypatch.setattr(graph, "NEO4J_BATCH", 1)
    uri, user, password = request.getfixturevalue("neo4j")
    live, replay = Neo4jStore(uri, user, password, namespace=LIVE), Neo4jStore(uri, user, password, namespace=REPLAY)
    retired = Neo4jStore(uri, user, password, namespace=RETIRED)
    try:
        for ns in (LIVE, REPLAY, RETIRED):
            live.clear(ns)
        project(retired, {"x": []})  # an older retired graph, which the swap replaces
        project(live, {"a": [], "b": ["a"], "c": ["a", "b"]})
        old = live.snapshot()
        nodes = [{"id": f"r{i}", "name": f"r{i}", "tenant": "t", "submission_id": "s", "status": "READY", "version": 1}
                 for i in range(3)]  # fmt: skip
        replay.bulk_load(nodes, [("r1", "r0"), ("r2", "r1")], [{"id": "graph:events/0", "next_offset": 7}])
        rebuilt = replay.snapshot()

        steps: list[str] = []
        real = live.driver
        live.driver = _CutAfter(real, cut_after)
        with pytest.raises(RuntimeError, match="cut short"):
            live.swap_in(reached=steps.append)
        live.driver = real
        live.swap_in(start=steps[-1], reached=steps.append)
        assert live.snapshot() == rebuilt
        assert retired.snapshot() == old
        assert replay.snapshot() == {"nodes": [], "edges": [], "checkpoints": {}}
    finally:
        live.close()
        replay.close()
        retired.close()
