"""Fixtures for tests that need the embedded stack: one real stack per session, on free ports, in a
temporary state directory, started and stopped with the same `taskstream up` / `down` users run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from taskstream.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stack_env(state_dir: Path) -> dict[str, str]:
    ports = {name: free_port() for name in ("KAFKA", "REGISTRY", "POSTGRES", "GRAPH", "WORKER")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    env.update({f"TASKSTREAM_{k}_PORT": str(v) for k, v in ports.items()})
    env["TASKSTREAM_STATE_DIR"] = str(state_dir)
    return env


def taskstream(
    env: dict[str, str], *args: str, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "taskstream", *args],
        env={**env, "COLUMNS": "200"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(f"taskstream {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


class Stack:
    def __init__(self, state_dir: Path) -> None:
        self.env = stack_env(state_dir)
        self.settings = Settings.from_env(self.env)

    def up(self) -> None:
        taskstream(self.env, "up")

    def down(self) -> None:
        taskstream(self.env, "down", check=False)

    def cli(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return taskstream(self.env, *args, **kw)

    def logs(self) -> str:
        out = []
        for f in sorted((self.settings.state_dir / "logs").glob("*.log")):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-40:]))
        return "\n".join(out)


@contextmanager
def running(s: Stack) -> Iterator[Stack]:
    """`taskstream up` on `s` (printing its logs if that fails), then `down` whatever happens."""
    try:
        s.up()
    except AssertionError:
        print(s.logs())
        s.down()
        raise
    try:
        yield s
    finally:
        s.down()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running(Stack(tmp_path_factory.mktemp("stack") / "state")) as s:
        yield s


def wait_until(check: Callable[[], Any], timeout: float = 120, what: str = "condition", every: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")
