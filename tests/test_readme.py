"""The README's two commands are what users and CI run: keep them honest."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, stack_env

README = (ROOT / "README.md").read_text()


def command_after(marker: str) -> str:
    m = re.search(rf"<!-- {marker} -->\s*```sh\n(.+?)\n```", README, re.S)
    assert m, f"README has no {marker} block"
    return m.group(1).strip()


def test_ci_runs_exactly_the_readme_test_command() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert "test-command" in script
    extracted = subprocess.run(
        [
            "awk",
            "/<!-- test-command -->/{f=1; next} f && /^```/ {if (started) exit; started=1; next} f && started {print}",
            str(ROOT / "README.md"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert extracted == command_after("test-command")
    assert extracted.endswith(".venv/bin/pytest")


@pytest.mark.stack
def test_the_main_command_runs_the_example_to_the_end(tmp_path: Path) -> None:
    """Runs the README's main command, minus the venv set-up this test process already has."""
    steps = [s.strip() for s in command_after("main-command").split("&&")]
    assert steps[0].startswith("python3 -m venv") and "pip install" in steps[1]
    env = stack_env(tmp_path / "state")
    env.pop("TASKSTREAM_JVM_JIT")  # as a user runs it: the engines' default JIT
    try:
        for step in steps[2:]:
            argv = shlex.split(step)
            assert argv[0] == ".venv/bin/taskstream"
            done = subprocess.run(
                [sys.executable, "-m", "taskstream", *argv[1:]],
                cwd=ROOT,
                env={**env, "COLUMNS": "200"},
                capture_output=True,
                text=True,
                timeout=400,
            )
            assert done.returncode == 0, f"{step}:\n{done.stdout}\n{done.stderr}"
        assert "succeeded:7" in done.stdout.replace(" ", "") or done.stdout.count("SUCCEEDED") >= 7
    finally:
        subprocess.run(
            [sys.executable, "-m", "taskstream", "down"], cwd=ROOT, env=env, capture_output=True, timeout=120
        )


@pytest.mark.stack
def test_the_readme_consumer_reads_the_events_topic(stack) -> None:  # type: ignore[no-untyped-def]
    """The short consumer in the README, run as written (ports swapped for the test stack's)."""
    m = re.search(r"This is a complete consumer:\s*```python\n(.+?)\n```", README, re.S)
    assert m, "README lost its consumer example"
    code = m.group(1)
    assert len(code.strip().splitlines()) <= 17
    s = stack.settings
    code = code.replace("http://127.0.0.1:18081", s.registry).replace("127.0.0.1:19092", s.bootstrap)
    code = code.replace("c.poll(10)", "c.poll(5)")  # stop sooner once it has read everything
    stack.cli("submit", str(ROOT / "examples" / "hello.yaml"), "--follow", "--timeout", "60")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if len(line.split()) >= 4]
    kinds = {row[2] for row in rows}
    assert {"io.taskstream.TasksAdmitted", "io.taskstream.TaskSucceeded"} <= kinds
    admitted = {row[0] for row in rows if row[2] == "io.taskstream.TasksAdmitted"}
    succeeded = {row[0] for row in rows if row[2] == "io.taskstream.TaskSucceeded"}
    assert succeeded and succeeded <= admitted, "the example names each packed task by its id"
