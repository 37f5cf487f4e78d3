"""taskstream replay: rebuild both projections from offset 0 beside the live ones, verify, swap."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.conftest import ROOT, Stack, wait_until


def neo4j_driver(stack: Stack) -> Any:
    import neo4j

    s = stack.settings
    return neo4j.GraphDatabase.driver(s.neo4j_url, auth=(s.neo4j_user, s.neo4j_password))


pytestmark = [pytest.mark.stack, pytest.mark.fallback]


def test_replay_verifies_detects_tampering_and_swaps_in_the_rebuilt_projections(stack: Stack) -> None:
    stack.cli("submit", str(ROOT / "examples" / "etl-dag.yaml"), "--follow", "--timeout", "120")

    def verified() -> bool:
        out = stack.cli("replay", "--verify", check=False)
        return out.returncode == 0 and out.stdout.count("identical") == 2

    wait_until(verified, 60, "a replay identical to the live projections", every=1.0)

    with psycopg.connect(stack.settings.dsn, autocommit=True) as conn:
        (tid,) = conn.execute(
            "UPDATE tasks SET reason = 'tampered' WHERE task_id = "
            "(SELECT task_id FROM tasks ORDER BY task_id LIMIT 1) RETURNING task_id::text"
        ).fetchone()
    if stack.settings.graph_backend == "neo4j":  # the graph can be written from outside too: tamper with it
        with neo4j_driver(stack) as driver:
            rec = driver.execute_query("MATCH (t:Task {id: $id}) RETURN t.status", id=tid).records
            status = rec[0][0]
            driver.execute_query("MATCH (t:Task {id: $id}) SET t.status = 'TAMPERED'", id=tid)
    out = stack.cli("replay", "--verify", check=False)
    assert out.returncode == 1
    errors = " ".join(out.stderr.split())
    assert f"postgres: first difference: tasks row {tid}: live and replayed contents differ" in errors
    if stack.settings.graph_backend == "neo4j":
        assert f"graph: first difference: Task row {tid}: live and replayed contents differ" in errors
        assert out.stdout.count("DIFFERENT") == 2
    assert "DIFFERENT" in out.stdout

    out = stack.cli("replay", "--swap")
    assert "the replayed tables are live" in out.stdout
    wait_until(verified, 90, "the swapped-in projections to verify", every=1.0)
    with psycopg.connect(stack.settings.dsn, autocommit=True) as conn:
        (reason,) = conn.execute("SELECT reason FROM tasks WHERE task_id = %s", (tid,)).fetchone()
    assert reason != "tampered"
    if stack.settings.graph_backend == "neo4j":  # the rebuilt graph is live, the tampered one retired
        with neo4j_driver(stack) as driver:
            live = driver.execute_query("MATCH (t:Task {id: $id}) RETURN t.status", id=tid).records
            retired = driver.execute_query("MATCH (t:RetiredTask {id: $id}) RETURN t.status", id=tid).records
        assert [r[0] for r in live] == [status] and [r[0] for r in retired] == ["TAMPERED"]
    # and the stack keeps projecting into the swapped-in stores
    after = stack.cli("submit", str(ROOT / "examples" / "hello.yaml"), "--follow", "--timeout", "90")
    assert "SUCCEEDED" in after.stdout
