"""The CLI as users run it: submit files (good and bad), follow, status, the stack's own lifecycle."""

from __future__ import annotations

import re
import socket
import time

import psycopg
import pytest

from tests.conftest import ROOT, Stack, stack_env, taskstream

pytestmark = pytest.mark.stack


def test_the_example_dag_runs_to_a_summary_table(stack: Stack) -> None:
    out = stack.cli("submit", str(ROOT / "examples" / "etl-dag.yaml"), "--follow", "--timeout", "120")
    assert "accepted submission" in out.stdout
    table = out.stdout[out.stdout.rindex("submission ") :]
    for name in (
        "prepare",
        "extract-orders",
        "extract-customers",
        "flaky-load",
        "join",
        "report-sales",
        "report-churn",
    ):
        line = next(ln for ln in table.splitlines() if f" {name} " in ln)
        assert "SUCCEEDED" in line, line
    flaky = next(ln for ln in table.splitlines() if " flaky-load " in ln)
    assert "│ 2 " in flaky  # failed once, succeeded on the retry


def test_a_bad_file_names_the_task_the_field_and_why(stack: Stack, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "tenant: acme\ntasks:\n  - name: a\n    argv: echo hi\n  - name: b\n    argv: [x]\n"
        "    dependencies: [zzz]\n    retry_limit: -2\n"
    )
    out = stack.cli("submit", str(bad), check=False)
    assert out.returncode == 2
    assert "task 'a', field 'argv': must be a list of strings (no shell string)" in out.stderr
    assert "task 'b', field 'dependencies': names 'zzz', which is not a task of this submission" in out.stderr
    assert "task 'b', field 'retry_limit': must be between 0 and 100, got -2" in out.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("tenant: acme\ntasks: [\n")
    out = stack.cli("submit", str(broken), check=False)
    assert out.returncode == 2 and "broken.yaml:3:1: not valid YAML" in out.stderr


def test_status_shows_counts_and_one_task(stack: Stack) -> None:
    out = stack.cli("submit", str(ROOT / "examples" / "hello.yaml"), "--follow", "--timeout", "60")
    overview = stack.cli("status").stdout
    assert "SUCCEEDED" in overview and "worker-0" in overview
    assert "projection lag on taskstream.events" in overview
    lag_row = re.compile(r"^│ (pg|graph)\s+│\s+\d+\s+│\s+(\d+|-)\s+│\s+\d+\s+│\s+\d+\s+│$")
    lag_rows = [ln for ln in overview.splitlines() if lag_row.match(ln)]
    assert len(lag_rows) == 2 * stack.settings.partitions, overview
    task_id = out.stdout.split("accepted submission ")[1].split(":")[0]
    with psycopg.connect(stack.settings.dsn) as conn:
        (tid,) = conn.execute("SELECT task_id::text FROM tasks WHERE submission_id = %s", (task_id,)).fetchone()
    one = stack.cli("status", tid).stdout
    assert "hello" in one and "SUCCEEDED" in one and "hello, taskstream" in one


@pytest.mark.parametrize(
    ("port", "what"),
    [
        ("KAFKA", "Kafka broker"),
        ("KAFKA_CONTROLLER", "Kafka controller"),
        ("NEO4J", "Neo4j Bolt"),
        ("POSTGRES", "PostgreSQL"),
    ],
)
def test_up_names_a_taken_port(tmp_path, port: str, what: str) -> None:  # type: ignore[no-untyped-def]
    env = stack_env(tmp_path / "state")
    with socket.socket() as s:
        s.bind(("127.0.0.1", int(env[f"TASKSTREAM_{port}_PORT"])))
        s.listen()
        out = taskstream(env, "up", check=False, timeout=120)
    assert out.returncode == 1
    assert f"port {env[f'TASKSTREAM_{port}_PORT']} on 127.0.0.1 ({what}) is taken" in " ".join(out.stderr.split())
    assert len(out.stderr.strip().splitlines()) <= 2  # one line (rich may wrap it)
    assert not (tmp_path / "state" / "run" / "supervisor.json").exists()


def test_up_names_a_missing_binary(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {**stack_env(tmp_path / "state"), "TASKSTREAM_PG_BIN": str(tmp_path / "no-such-dir")}
    out = taskstream(env, "up", check=False, timeout=60)
    assert out.returncode == 1
    assert f"PostgreSQL binary 'initdb' missing in {tmp_path / 'no-such-dir'}" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_killed_service_is_restarted_and_work_goes_on(stack: Stack) -> None:
    import json
    import os
    import signal

    from tests.conftest import wait_until

    status_path = stack.settings.state_dir / "run" / "supervisor.json"
    before = json.loads(status_path.read_text())["services"]["pg-projector"]
    os.kill(before["pid"], signal.SIGKILL)

    def restarted() -> bool:
        now = json.loads(status_path.read_text())["services"]["pg-projector"]
        return now["restarts"] == before["restarts"] + 1 and now["pid"] not in (None, before["pid"])

    wait_until(restarted, 60, "the supervisor to restart pg-projector")
    out = stack.cli("submit", str(ROOT / "examples" / "hello.yaml"), "--follow", "--timeout", "90")
    assert "SUCCEEDED" in out.stdout


def test_state_survives_down_then_up(stack: Stack, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Runs last in this file: restarts the session's stack."""
    before = stack.cli("submit", str(ROOT / "examples" / "hello.yaml"), "--follow", "--timeout", "60").stdout
    sid = before.split("accepted submission ")[1].split(":")[0]
    keyed = tmp_path / "keyed.yaml"
    keyed.write_text((ROOT / "examples" / "hello.yaml").read_text() + f"idempotency_key: restart-{sid}\n")
    first = stack.cli("submit", str(keyed), "--follow", "--timeout", "60").stdout
    stack.down()
    stack.up()
    # the same keyed submission after a restart: same submission and task ids, nothing run again
    second = stack.cli("submit", str(keyed)).stdout
    ids = [ln.split()[-1] for ln in second.splitlines() if ln.strip().startswith("hello ")]
    assert first.split("accepted submission ")[1].split(":")[0] == second.split("accepted submission ")[1].split(":")[0]
    time.sleep(2)  # give a wrongly admitted copy time to show up
    with psycopg.connect(stack.settings.dsn) as conn:
        (runs,) = conn.execute("SELECT count(*) FROM attempts WHERE task_id = %s", (ids[0],)).fetchone()
    assert len(ids) == 1 and runs == 1
    after = stack.cli("status").stdout
    assert "SUCCEEDED" in after
    with psycopg.connect(stack.settings.dsn) as conn:
        (status,) = conn.execute("SELECT status FROM tasks WHERE submission_id = %s", (sid,)).fetchone()
    assert status == "SUCCEEDED"
    again = stack.cli("submit", str(ROOT / "examples" / "hello.yaml"), "--follow", "--timeout", "90")
    assert "SUCCEEDED" in again.stdout
