"""Callable tasks (`call: module:function`): run in long-lived runner processes, one call at a time.

A task given as a callable does not pay for a new interpreter: the worker keeps up to `worker_slots`
runner processes (`python -m taskstream.streams.runner`), each importing what its calls need once. A
runner reads one request per line on its stdin (JSON: target, args, kwargs, env, cwd, output file) and
answers one line on its own copy of the original stdout; while a call runs, its file descriptors 1 and
2 point at the output file, so `print`, `logging` and C-level writes all land in the task's output tail.

A runner is a process group of its own like an argv task's, with the same protections: the kernel
kills it when its worker dies (PR_SET_PDEATHSIG), and so does the worker's keeper. Stopping a call
(cancelled, over its cap, drained) kills the runner's group, SIGTERM then SIGKILL; the next call gets
a fresh runner. What a call returns is not kept; an exception is printed to the output with its
traceback and ends the attempt with exit status 1; `SystemExit(n)` ends it with status n.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import signal
import sys
import traceback
from typing import Any

from taskstream.connectors.keeper import Keeper, die_with_parent

RESULT_LIMIT = 1 << 20  # one answer line


class CallFailed(Exception):
    """The runner died or answered nonsense (the attempt ends with the runner's exit status)."""


class Runner:
    """The worker's end of one runner process."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.retired = False  # its call was stopped: it is being killed, never reused

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and not self.retired

    async def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the runner reads end of file and exits
        try:
            await asyncio.wait_for(self.proc.wait(), 2.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if not line:
            await self.proc.wait()
            raise CallFailed(f"the runner process ended (exit status {self.proc.returncode})")
        try:
            answer: dict[str, Any] = json.loads(line)
        except ValueError as exc:
            raise CallFailed(f"the runner answered something that is not JSON: {line[:200]!r}") from exc
        return answer


class Runners:
    """Idle runners kept for the next call; a runner whose call was stopped is not reused."""

    def __init__(self, keeper: Keeper | None) -> None:
        self.keeper = keeper
        self.idle: list[Runner] = []

    async def acquire(self) -> Runner:
        while self.idle:
            runner = self.idle.pop()
            if runner.alive:
                return runner
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "taskstream.streams.runner",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # a process group of its own: killed whole
            preexec_fn=die_with_parent,
            limit=RESULT_LIMIT,
        )
        if self.keeper is not None:
            self.keeper.watch(proc.pid)
        return Runner(proc)

    def release(self, runner: Runner) -> None:
        if runner.alive:
            self.idle.append(runner)
            return
        if runner.proc.stdin is not None:
            runner.proc.stdin.close()
        if self.keeper is not None:
            self.keeper.forget(runner.pid)

    async def close(self) -> None:
        """Stop the idle runners (a busy one is stopped by its call's end)."""
        idle, self.idle = self.idle, []
        for runner in idle:
            await runner.close()


# ---- the runner process ----------------------------------------------------------------------------


def resolve(target: str) -> Any:
    """`package.module:attr.path` -> the object. Raises ImportError / AttributeError with the target named."""
    module_name, _, path = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in path.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{target} is not callable (it is {type(obj).__name__})")
    return obj


def _run_one(req: dict[str, Any]) -> dict[str, Any]:
    out = os.open(req["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    code, reason = 0, ""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        try:
            resolve(req["target"])(*req["args"], **req["kwargs"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:  # noqa: BLE001 - any failure of the task is its attempt's outcome
            traceback.print_exc()
            code, reason = 1, f"raised {type(exc).__name__}: {exc}"[:1000]
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
        os.close(out)
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
    return {"exit_code": code, "reason": reason}


def main() -> None:
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    null_in = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_in, 0)  # a call reading stdin reads nothing, as an argv task does
    null_out = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null_out, 1)
    for line in requests:
        answer = _run_one(json.loads(line))
        answers.write(json.dumps(answer).encode() + b"\n")


if __name__ == "__main__":
    main()
