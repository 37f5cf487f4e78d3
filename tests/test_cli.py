"""The CLI as users run it: submit files (good and bad), follow, status, the stack's own lifecycle."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from typing import Any

import psycopg
import pytest

from tests.conftest import ROOT, Stack, stack_env, taskstream, wait_until

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


def test_data_is_printed_literally_never_as_markup_or_escape_sequences(stack: Stack, tmp_path) -> None:  # type: ignore[no-untyped-def]
    program = "print('[/x] [red]styled[/red] \\x1b[31mred\\x1b[0m [bold]end')"
    dag = tmp_path / "markup.yaml"
    dag.write_text(f"tenant: acme\ntasks:\n  - name: loud\n    argv: [python3, -c, {json.dumps(program)}, '[/bold]']\n")
    out = stack.cli("submit", str(dag), "--follow", "--timeout", "90")
    assert "loud" in out.stdout and "SUCCEEDED" in out.stdout
    sid = out.stdout.split("accepted submission ")[1].split(":")[0]
    with psycopg.connect(stack.settings.dsn) as conn:
        (tid,) = conn.execute("SELECT task_id::text FROM tasks WHERE submission_id = %s", (sid,)).fetchone()

    one = stack.cli("status", tid).stdout
    assert "[/x] [red]styled[/red] \\x1b[31mred\\x1b[0m [bold]end" in one  # the output tail, as printed
    assert "'[/bold]'" in one  # argv
    history = stack.cli("audit", tid).stdout
    for token in ("[/x]", "[red]styled[/red]", "\\x1b[31mred\\x1b[0m", "'[/bold]'"):  # a table cell may wrap
        assert token in history, history
    for text in (out.stdout, one, history):
        assert "\x1b" not in text

    # tail shows every event of the log; one such output once made it exit with a traceback
    follow = subprocess.Popen(
        [sys.executable, "-m", "taskstream", "tail", "--from-beginning"],
        env={**stack.env, "COLUMNS": "400"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline and not (tid in line and "TaskSucceeded" in line):
            line = follow.stdout.readline()  # type: ignore[union-attr]
            assert line or follow.poll() is None, follow.stderr.read()  # type: ignore[union-attr]
        assert tid in line and "output_tail=[/x] [red]styled[/red] \\x1b[31mred" in line and "\x1b" not in line
        assert follow.poll() is None  # still following
    finally:
        follow.kill()
        follow.communicate()


def test_an_argv_item_that_is_not_a_string_is_refused_with_the_task_named(stack: Stack, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bool.yaml"
    bad.write_text("tenant: acme\ntasks:\n  - name: flag\n    argv: [true]\n  - name: nap\n    argv: [sleep, 5]\n")
    out = stack.cli("submit", str(bad), check=False)
    assert out.returncode == 2
    assert "task 'flag', field 'argv[0]': must be a string, got bool True" in out.stderr
    assert "task 'nap', field 'argv[1]': must be a string, got int 5" in out.stderr


def test_cancel_kills_a_running_task_and_both_commands_refuse_what_they_cannot_change(stack: Stack, tmp_path) -> None:  # type: ignore[no-untyped-def]
    stubborn = (
        "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(300)"
    )
    dag = tmp_path / "long.yaml"
    dag.write_text(
        f"tenant: acme\ntasks:\n  - name: long\n    argv: [python3, -c, {json.dumps(stubborn)}]\n"
        "  - name: after\n    argv: [python3, -c, 'print(1)']\n    dependencies: [long]\n"
    )
    out = stack.cli("submit", str(dag))
    ids = dict(re.findall(r"^  (\S+)  ([0-9a-f-]{36})$", out.stdout, re.M))
    with psycopg.connect(stack.settings.dsn, autocommit=True) as conn:

        def pid() -> int | None:
            row = conn.execute(
                "SELECT pid FROM attempts WHERE task_id = %s AND started_at IS NOT NULL", (ids["long"],)
            ).fetchone()
            return row[0] if row else None

        proc = wait_until(pid, 60, "the long task to start")
        wait_until(lambda: conn.execute("SELECT 1 FROM tasks WHERE task_id = %s", (ids["after"],)).fetchone(), 30)
        moved = stack.cli("reprioritize", ids["after"], "7")
        assert "priority 0 -> 7" in moved.stdout
        assert conn.execute("SELECT priority FROM tasks WHERE task_id = %s", (ids["after"],)).fetchone() == (7,)

        gone = stack.cli("cancel", ids["long"], "--reason", "no longer needed")
        assert "cancelled" in gone.stdout and "no longer needed" in gone.stdout
        assert "killed: cancelled (no longer needed)" in gone.stdout  # it ignored SIGTERM: SIGKILL after the grace
        wait_until(lambda: not _alive(proc), 10, "the task's process to be gone")
        attempt = conn.execute(
            "SELECT outcome, exit_code, reason FROM attempts WHERE task_id = %s", (ids["long"],)
        ).fetchone()
        assert attempt == ("FAILED", -signal.SIGKILL, "killed: cancelled (no longer needed)")
        wait_until(
            lambda: (
                conn.execute("SELECT status FROM tasks WHERE task_id = %s", (ids["after"],)).fetchone()
                == ("CANCELLED",)
            ),
            30,
            "its dependent to end cancelled",
        )
    history = [json.loads(x)["event"] for x in stack.cli("audit", ids["long"], "--json").stdout.splitlines()]
    assert history[-2:] == ["TaskCancelled", "TaskFailed"] and "TaskSucceeded" not in history

    again = stack.cli("cancel", ids["long"], check=False)
    assert again.returncode == 1 and f"task {ids['long']} has already ended (cancelled)" in again.stderr
    late = stack.cli("reprioritize", ids["after"], "1", check=False)
    assert late.returncode == 1 and "has already ended (cancelled)" in late.stderr
    unknown = str(uuid.uuid4())
    nobody = stack.cli("cancel", unknown, check=False)
    assert nobody.returncode == 1 and f"no task {unknown} in the read model" in nobody.stderr
    garbled = stack.cli("reprioritize", "not-a-task", "3", check=False)
    assert garbled.returncode == 1 and "'not-a-task' is not a task id" in garbled.stderr
    assert "Traceback" not in nobody.stderr + garbled.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_callable_tasks_run_in_the_worker_s_runners_with_their_output_and_exit_status(stack: Stack, tmp_path) -> None:  # type: ignore[no-untyped-def]
    dag = tmp_path / "calls.yaml"
    dag.write_text(
        "tenant: acme\ntasks:\n"
        "  - {name: hello, call: 'builtins:print', args: ['hello from a callable', 42], kwargs: {sep: '|'}}\n"
        "  - {name: divide, call: 'operator:truediv', args: [1, 0], dependencies: [hello]}\n"
        "  - {name: leave, call: 'sys:exit', args: [3]}\n"
        "  - {name: snooze, call: 'time:sleep', args: [300]}\n"
    )
    out = stack.cli("submit", str(dag))
    ids = dict(re.findall(r"^  (\S+)  ([0-9a-f-]{36})$", out.stdout, re.M))
    with psycopg.connect(stack.settings.dsn, autocommit=True) as conn:

        def ended(name: str) -> tuple[Any, ...] | None:
            return conn.execute(  # type: ignore[no-any-return]
                "SELECT a.outcome, a.exit_code, a.output_tail, a.reason, t.call FROM attempts a JOIN tasks t "
                "USING (task_id) WHERE task_id = %s AND a.ended_at IS NOT NULL",
                (ids[name],),
            ).fetchone()

        hello = wait_until(lambda: ended("hello"), 60, "the first callable")
        assert hello[:3] == ("SUCCEEDED", 0, "hello from a callable|42\n")
        assert hello[4] == {"target": "builtins:print", "args": ["hello from a callable", 42], "kwargs": {"sep": "|"}}
        divide = wait_until(lambda: ended("divide"), 60, "the failing callable")
        assert divide[:2] == ("FAILED", 1) and "ZeroDivisionError: division by zero" in divide[2]
        assert divide[3] == "raised ZeroDivisionError: division by zero"
        assert wait_until(lambda: ended("leave"), 60, "the exiting callable")[:2] == ("FAILED", 3)

        wait_until(
            lambda: (
                conn.execute("SELECT status FROM tasks WHERE task_id = %s", (ids["snooze"],)).fetchone() == ("RUNNING",)
            ),
            60,
            "the sleeping callable to run",
        )
        (runner,) = conn.execute("SELECT pid FROM attempts WHERE task_id = %s", (ids["snooze"],)).fetchone()
        stack.cli("cancel", ids["snooze"], "--reason", "enough")
        wait_until(lambda: not _alive(runner), 15, "its runner process to be gone")
        assert ended("snooze")[:2] == ("FAILED", -signal.SIGTERM)  # time.sleep dies of SIGTERM at once
    again = tmp_path / "again.yaml"
    again.write_text("tenant: acme\ntasks:\n  - {name: again, call: 'builtins:print', args: [again]}\n")
    after = stack.cli("submit", str(again), "--follow", "--timeout", "60")
    assert "SUCCEEDED" in after.stdout  # the next call gets a fresh runner


def test_an_initdb_failure_names_its_cause_not_its_clean_up(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """initdb's last line is its clean-up; the error must carry the lines before it (a full disk here)."""
    import pytest
    from taskstream.connectors.services import ServiceError, initdb

    from taskstream.settings import Settings

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for exe in ("initdb", "postgres"):
        script = bin_dir / exe
        script.write_text(
            "#!/bin/sh\n"
            "echo 'initdb: error: could not write to file \"base/1/1249\": No space left on device' >&2\n"
            "echo 'initdb: removing contents of data directory \"somewhere\"' >&2\n"
            "exit 1\n"
        )
        script.chmod(0o755)
    with pytest.raises(ServiceError, match="No space left on device") as err:
        initdb(Settings(state_dir=tmp_path / "state", pg_bin=str(bin_dir)))
    assert "removing contents" not in str(err.value)


def test_dlq_lists_dead_letters_and_retry_runs_one_again_as_a_new_task(stack: Stack, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from confluent_kafka import Producer

    gate = tmp_path / "open"  # the task fails until this file exists
    program = f"import os, sys; print('[/x] gate'); sys.exit(0 if os.path.exists({str(gate)!r}) else 3)"
    dag = tmp_path / "gated.yaml"
    dag.write_text(
        f"tenant: acme\ntasks:\n  - name: gated\n    argv: [python3, -c, {json.dumps(program)}]\n"
        "    labels: {team: '[red]data'}\n"
        "  - name: after\n    argv: [python3, -c, 'print(1)']\n    dependencies: [gated]\n"
    )
    ids = dict(re.findall(r"^  (\S+)  ([0-9a-f-]{36})$", stack.cli("submit", str(dag)).stdout, re.M))
    gated, after = ids["gated"], ids["after"]
    marker = uuid.uuid4().hex.encode()
    p = Producer({"bootstrap.servers": stack.settings.bootstrap})
    p.produce(stack.settings.topic("commands"), key=marker, value=b"[/x] not avro")
    assert p.flush(30) == 0
    with psycopg.connect(stack.settings.dsn, autocommit=True) as conn:

        def status(tid: str) -> str | None:
            row = conn.execute("SELECT status FROM tasks WHERE task_id = %s", (tid,)).fetchone()
            return row[0] if row else None

        wait_until(lambda: status(gated) == "DEAD_LETTERED" and status(after) == "CANCELLED", 90, "the dead letter")
        wait_until(lambda: conn.execute("SELECT 1 FROM dead_letters WHERE key = %s", (marker,)).fetchone(), 60)

        listed = json.loads(stack.cli("dlq", "list", "--json").stdout)
        mine = [t for t in listed["tasks"] if t["task_id"] == gated]
        assert len(mine) == 1 and mine[0]["name"] == "gated" and mine[0]["attempts"] == 1
        assert "exit status 3; 1 attempt(s) failed, retry limit reached" in mine[0]["reason"]
        assert after not in {t["task_id"] for t in listed["tasks"]}  # cancelled, not dead-lettered
        assert any(r["topic"] == stack.settings.topic("commands") and "magic byte" in r["reason"]
                   for r in listed["records"])  # fmt: skip
        table = stack.cli("dlq", "list").stdout
        assert gated in table and "exit status 3" in table and "magic byte 91 is not 0" in table

        refused = stack.cli("dlq", "retry", after, check=False)
        assert refused.returncode == 1 and f"task {after} is cancelled, not dead-lettered" in refused.stderr
        unknown = str(uuid.uuid4())
        nobody = stack.cli("dlq", "retry", unknown, check=False)
        assert nobody.returncode == 1 and f"no task {unknown} in the read model" in nobody.stderr

        gate.touch()
        out = stack.cli("dlq", "retry", gated, "--follow", "--timeout", "90")
        (new,) = re.findall(rf"retrying task {gated} as task ([0-9a-f-]{{36}})", out.stdout)
        assert "SUCCEEDED" in out.stdout
        row = conn.execute(
            "SELECT status, name, tenant, labels, argv, attempt FROM tasks WHERE task_id = %s", (new,)
        ).fetchone()
        assert row[:3] == ("SUCCEEDED", "gated", "acme") and row[3] == {"team": "[red]data", "retry_of": gated}
        assert row[4][-1] == program and row[5] == 1
        assert (status(gated), status(after)) == ("DEAD_LETTERED", "CANCELLED")  # they stay as they ended
        again = stack.cli("dlq", "retry", gated)  # the same retry, not a second one
        assert f"as task {new}" in again.stdout
        assert conn.execute("SELECT count(*) FROM tasks WHERE labels->>'retry_of' = %s", (gated,)).fetchone() == (1,)


def test_a_waiting_task_cancelled_never_runs_its_dependents_end_cancelled_and_tenants_counts_them(  # type: ignore[no-untyped-def]
    stack: Stack, tmp_path
) -> None:
    tenant = f"tenant-{uuid.uuid4().hex[:8]}"
    dag = tmp_path / "waiting.yaml"
    dag.write_text(
        f"tenant: {tenant}\ntasks:\n  - name: first\n    argv: [sleep, '3']\n"
        "  - name: middle\n    argv: [python3, -c, 'print(1)']\n    dependencies: [first]\n"
        "  - name: last\n    argv: [python3, -c, 'print(1)']\n    dependencies: [middle]\n"
        "  - name: sibling\n    argv: [python3, -c, 'print(1)']\n    dependencies: [first]\n"
    )
    ids = dict(re.findall(r"^  (\S+)  ([0-9a-f-]{36})$", stack.cli("submit", str(dag)).stdout, re.M))
    with psycopg.connect(stack.settings.dsn, autocommit=True) as conn:

        def status(name: str) -> str | None:
            row = conn.execute("SELECT status FROM tasks WHERE task_id = %s", (ids[name],)).fetchone()
            return row[0] if row else None

        wait_until(lambda: status("first") == "RUNNING" and status("middle") == "WAITING", 60, "first running")
        out = stack.cli("cancel", ids["middle"], "--reason", "not needed")
        assert "cancelled" in out.stdout and "its run" not in out.stdout  # it never ran: nothing to kill
        wait_until(lambda: all(status(n) in ("SUCCEEDED", "CANCELLED") for n in ids), 90, "every task to end")
        assert {n: status(n) for n in ids} == {
            "first": "SUCCEEDED", "middle": "CANCELLED", "last": "CANCELLED", "sibling": "SUCCEEDED"
        }  # fmt: skip
        (why,) = conn.execute("SELECT reason FROM tasks WHERE task_id = %s", (ids["last"],)).fetchone()
        assert why == f"prerequisite {ids['middle']} ended cancelled"
        ran = conn.execute(
            "SELECT count(*) FROM attempts WHERE task_id = ANY(%s::uuid[])", ([ids["middle"], ids["last"]],)
        ).fetchone()
        assert ran == (0,)
    mine = [t for t in json.loads(stack.cli("tenants", "--json").stdout) if t["tenant"] == tenant]
    assert len(mine) == 1 and mine[0]["tier"] == "standard" and mine[0]["max_running"] is None
    assert [mine[0][k] for k in ("waiting", "queued", "running", "succeeded", "ended_otherwise")] == [0, 0, 0, 2, 2]
    assert tenant in stack.cli("tenants").stdout
