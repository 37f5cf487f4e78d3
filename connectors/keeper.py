"""Task processes never outlive their worker.

A task runs in a session (process group) of its own, so it can be killed whole. Two things kill it if
its worker dies, even by SIGKILL:
- the kernel: the task's first process asks for SIGKILL when its parent (the worker) dies
  (PR_SET_PDEATHSIG, set between fork and exec);
- the keeper: a small process the worker starts, which learns each task's process group over a pipe
  and, when the pipe closes (its worker is gone, however it went), kills every group still running,
  the processes the task started included, then exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Pre-exec hook for a task's first process: SIGKILL when the worker dies."""
    with contextlib.suppress(OSError):  # not Linux: the keeper still kills the group
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Keeper:
    """The worker's end of the keeper: tell it which process groups to kill if the worker dies."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(  # noqa: S603 - argv list
            [sys.executable, "-m", "taskstream.connectors.keeper"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not in the worker's group: a signal to that group leaves it to clean up
            text=True,
        )
        assert self.proc.stdin is not None
        self.pipe: IO[str] = self.proc.stdin

    def _send(self, line: str) -> None:
        with contextlib.suppress(BrokenPipeError, ValueError):
            self.pipe.write(line + "\n")
            self.pipe.flush()

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self) -> None:
        """The worker stops cleanly: every group still known is killed, as on a crash."""
        with contextlib.suppress(BrokenPipeError, ValueError):
            self.pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


class Taken(Exception):
    """Another live process holds the lock (`hold`); `pid` is the one it wrote, if it could be read."""

    def __init__(self, path: Path, pid: int | None) -> None:
        super().__init__(f"{path} is held by pid {pid if pid is not None else '?'}")
        self.path, self.pid = path, pid


def _pids(text: str) -> list[int]:
    return [int(line) for line in text.split() if line.isdigit()]


def last_holder(path: Path) -> int | None:
    """The pid of the last process other than this one that held `path` (what `hold` keeps there), or
    None. Once this process holds the lock, that one is gone."""
    try:
        pids = _pids(path.read_text())
    except OSError:
        return None
    return next((p for p in pids if p != os.getpid()), None)


def hold(path: Path) -> IO[str]:
    """Lock `path` for the rest of this process's life, with this pid written in it (and, on the next
    line, the last other holder's: `last_holder`); the kernel lets go when the process ends, however it
    ends (SIGKILL included), so a stale lock never refuses anyone. Keep the returned file open. Taken
    if a live process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = path.open("a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        pids = _pids(f.read())
        f.close()
        raise Taken(path, pids[0] if pids else None) from None
    f.seek(0)
    before = next((p for p in _pids(f.read()) if p != os.getpid()), None)
    f.truncate(0)
    f.write(f"{os.getpid()}\n" + (f"{before}\n" if before else ""))
    f.flush()
    return f


def main() -> None:
    groups: set[int] = set()
    for line in sys.stdin:
        line = line.strip()
        if line.startswith("+") and line[1:].isdigit():
            groups.add(int(line[1:]))
        elif line.startswith("-") and line[1:].isdigit():
            groups.discard(int(line[1:]))
    for pgid in groups:  # the worker is gone: nothing it started may outlive it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists and has not exited (a zombie has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


if __name__ == "__main__":
    main()
