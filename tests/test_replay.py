"""taskstream replay: rebuild both projections from offset 0 beside the live ones, verify, swap."""

from __future__ import annotations

import psycopg
import pytest

from tests.conftest import ROOT, Stack, wait_until

pytestmark = pytest.mark.stack


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
    out = stack.cli("replay", "--verify", check=False)
    assert out.returncode == 1
    assert f"postgres: first difference: tasks row {tid}: live and replayed contents differ" in " ".join(
        out.stderr.split()
    )
    assert "DIFFERENT" in out.stdout

    out = stack.cli("replay", "--swap")
    assert "the replayed tables are live" in out.stdout
    wait_until(verified, 90, "the swapped-in projections to verify", every=1.0)
    with psycopg.connect(stack.settings.dsn, autocommit=True) as conn:
        (reason,) = conn.execute("SELECT reason FROM tasks WHERE task_id = %s", (tid,)).fetchone()
    assert reason != "tampered"
    # and the stack keeps projecting into the swapped-in stores
    after = stack.cli("submit", str(ROOT / "examples" / "hello.yaml"), "--follow", "--timeout", "90")
    assert "SUCCEEDED" in after.stdout
