"""A throwaway embedded stack for a benchmark: free ports, a temporary state dir, `up` then `down`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def embedded_stack(**extra: str) -> Iterator[dict[str, str]]:
    """Yields the TASKSTREAM_* environment of a running stack (plus `extra` settings); stops it afterwards."""
    state = Path(tempfile.mkdtemp(prefix="taskstream-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    env["TASKSTREAM_STATE_DIR"] = str(state)
    for name in ("KAFKA", "REGISTRY", "POSTGRES", "GRAPH", "WORKER"):
        env[f"TASKSTREAM_{name}_PORT"] = str(free_port())
    env.update({f"TASKSTREAM_{k.upper()}": v for k, v in extra.items()})
    cli = [sys.executable, "-m", "taskstream"]
    subprocess.run([*cli, "up"], env=env, check=True, capture_output=True)
    try:
        yield env
    finally:
        subprocess.run([*cli, "down"], env=env, capture_output=True)


def write_report(path: Path, report: dict[str, object]) -> None:
    """Print a benchmark's figures and keep them in its results file."""
    text = json.dumps(report, indent=2)
    print(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
