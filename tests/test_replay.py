"""taskstream replay: rebuild both projections from offset 0 beside the live ones, verify, swap."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest

from taskstream.settings import Settings
from tests.conftest import ROOT, Stack, wait_until


def neo4j_driver(stack: Stack) -> Any:
    import neo4j

    s = stack.settings
    return neo4j.GraphDatabase.driver(s.neo4j_url, auth=(s.neo4j_user, s.neo4j_password))


pytestmark = [pytest.mark.stack, pytest.mark.fallback]


def test_replay_verifies_detects_tampering_and_swaps_in_the_rebuilt_projections(stack: Stack) -> None:
    stack.cli("submit", str(ROOT / "examples" / "etl-dag.yaml"), "--follow", "--timeout", "120")

    last: list[str] = []

    def verified() -> bool:
        out = stack.cli("replay", "--verify", check=False)
        last[:] = [f"exit {out.returncode}\n{out.stdout}\n{out.stderr}"]
        return out.returncode == 0 and out.stdout.count("identical") == 2

    def wait_verified(timeout: float, what: str) -> None:
        try:
            wait_until(verified, timeout, what, every=1.0)
        except AssertionError:  # the last verification's report, and what the services logged
            print(f"--- last replay --verify: {last[0] if last else '(none)'}")
            print(stack.logs())
            raise

    wait_verified(60, "a replay identical to the live projections")

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
    wait_verified(90, "the swapped-in projections to verify")
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


def test_a_replay_waits_for_the_one_running_and_for_a_pending_graph_swap(stack: Stack, tmp_path: Any) -> None:
    """Replays share the replay schema, namespace and file: a second one waits for the first (here the
    test holds the lock replays take), and none starts while a graph swap waits for the graph service."""
    from taskstream.projections import replay as rp

    s = stack.settings
    with psycopg.connect(s.dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (rp.REPLAY_LOCK,))
        proc = subprocess.Popen(
            [sys.executable, "-m", "taskstream", "replay", "--verify"],
            env={**stack.env, "COLUMNS": "200"},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(4)
            assert proc.poll() is None, proc.communicate()  # still waiting for the lock
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (rp.REPLAY_LOCK,))
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "another replay is running: waiting for it to finish" in " ".join(err.split())
    assert out.count("identical") == 2

    # a pending swap: a replay waits for it, and names it if it never comes
    pending = rp.swap_request_path(Settings(state_dir=tmp_path))
    pending.parent.mkdir(parents=True)
    pending.write_text("replay\n")
    told: list[str] = []
    with pytest.raises(rp.ReplayError, match=r"a graph swap requested at .* is still pending after 1s"):
        rp.wait_for_graph_swap(Settings(state_dir=tmp_path), told.append, timeout=1)
    assert told == ["waiting for the graph service to apply the pending swap"]
    threading.Timer(1.0, pending.unlink).start()  # the graph service applies it
    started = time.monotonic()
    rp.wait_for_graph_swap(Settings(state_dir=tmp_path), told.append, timeout=30)
    assert 0.9 <= time.monotonic() - started < 30 and not pending.exists()
