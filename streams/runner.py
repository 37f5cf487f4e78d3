"""Callable tasks (`call: module:function`): run in long-lived runner processes, one call at a time.

A task given as a callable does not pay for a new interpreter: the worker keeps up to `worker_slots`
runner processes (`python -m taskstream.streams.runner SCRATCH`), each importing what its calls need
once. A runner reads one request per line on its stdin (JSON: target, args_json, kwargs_json, env, cwd,
keep, limit) and answers one line on its own copy of the original stdout: the exit status, the reason, and
the tail of the call's output. While a call runs, its file descriptors 1 and 2 point at the runner's
output file (`SCRATCH.out`, emptied before each call), so `print`, `logging` and C-level writes all
land in the task's output tail.

A call without a working directory of its own runs in the runner's scratch directory (`SCRATCH`),
empty when the call starts; whatever the call leaves there is moved to `keep` (the attempt's folder
under the state directory, work/TASK/ATTEMPT) and the scratch directory made anew. A call that leaves
nothing costs no directory and no file of its own: on this machine's disk a folder and an output file
per call took ~0.3 ms, a tenth of a worker's CPU per no-op task (docs/measurements.md).

A runner is a process group of its own like an argv task's, with the same protections: the kernel
kills it when its worker dies (PR_SET_PDEATHSIG), and so does the worker's keeper. Stopping a call
(cancelled, over its cap, drained) kills the runner's group, SIGTERM then SIGKILL; the next call gets
a fresh runner, and the worker moves what the stopped call left in the scratch directory to its
`keep` (`Runner.keep_scratch`). What a call returns is not kept; an exception is printed to the output
with its traceback and ends the attempt with exit status 1; `SystemExit(n)` ends it with status n.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import orjson
from taskstream.connectors.keeper import Keeper, die_with_parent, pid_alive

RESULT_LIMIT = 1 << 20  # one answer line
RUNNERS_DIR = ".runners"  # under the state directory's work/: the runners' scratch directories
TAIL_LIMIT = RESULT_LIMIT // 8  # the most of a call's output an answer carries (escaped, it may grow 6x)


class CallFailed(Exception):
    """The runner died or answered nonsense (the attempt ends with the runner's exit status)."""


class Runner:
    """The worker's end of one runner process."""

    def __init__(self, proc: asyncio.subprocess.Process, scratch: Path) -> None:
        self.proc = proc
        self.scratch = scratch  # where its calls without a working directory run
        self.output = output_of(scratch)  # what its calls write to stdout and stderr
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

    def tail(self, limit: int) -> str:
        """The last `limit` bytes of what its last call wrote (for a call that got no answer)."""
        return read_tail(self.output, limit)

    def keep_scratch(self, keep: Path) -> None:
        """After a call that got no answer (stopped, or the runner died): move what the call left in the
        scratch directory to `keep`, and remove the runner's files. Never raises: a task's leftovers
        are not worth a worker's error."""
        with contextlib.suppress(OSError):
            if any(self.scratch.iterdir()):
                keep_leftovers(self.scratch, keep)
            else:
                self.scratch.rmdir()
        with contextlib.suppress(OSError):
            self.output.unlink()

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        self.send(request)
        return await self.answer()

    def send(self, request: dict[str, Any]) -> None:
        """Write one call's request, now (the runner takes one call at a time, so its pipe holds at most
        this request: nothing to wait for but the answer). A runner that has gone answers nothing:
        `answer` says so."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(encode_line(request))

    async def answer(self) -> dict[str, Any]:
        """The answer to the request sent last."""
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            await self.proc.wait()
            raise CallFailed(f"the runner process ended (exit status {self.proc.returncode})")
        try:
            answer: dict[str, Any] = decode_line(line)
        except ValueError as exc:
            raise CallFailed(f"the runner answered something that is not JSON: {line[:200]!r}") from exc
        return answer


class Runners:
    """Idle runners kept for the next call; a runner whose call was stopped is not reused. `scratch`:
    the folder under which each runner gets a scratch directory of its own (named after this process
    and a counter, so workers sharing a state directory never share one)."""

    def __init__(self, keeper: Keeper | None, scratch: Path | None = None) -> None:
        self.keeper = keeper
        self.idle: list[Runner] = []
        self.scratch = scratch or Path(tempfile.gettempdir()) / "taskstream-runners"
        self.started = 0

    def sweep(self) -> None:
        """Remove the output files and empty scratch directories of runners whose worker is gone (one
        SIGKILLed takes its runners with it); a scratch directory a stopped call left files in stays."""
        with contextlib.suppress(OSError):
            for entry in self.scratch.iterdir():
                pid = entry.name.split("-", 1)[0]
                if not pid.isdigit() or int(pid) == os.getpid() or pid_alive(int(pid)):
                    continue
                with contextlib.suppress(OSError):
                    if entry.name.endswith(".out"):
                        entry.unlink()
                    else:
                        entry.rmdir()

    async def acquire(self) -> Runner:
        while self.idle:
            runner = self.idle.pop()
            if runner.alive:
                return runner
        if not self.started:
            self.sweep()
        self.started += 1
        scratch = self.scratch / f"{os.getpid()}-{self.started}"
        scratch.mkdir(parents=True, exist_ok=True)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "taskstream.streams.runner",
            str(scratch),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,  # a process group of its own: killed whole
            preexec_fn=die_with_parent,
            limit=RESULT_LIMIT,
        )
        if self.keeper is not None:
            self.keeper.watch(proc.pid)
        return Runner(proc, scratch)

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
            with contextlib.suppress(OSError):
                runner.output.unlink()
                runner.scratch.rmdir()  # left empty by every call that was answered


def output_of(scratch: Path) -> Path:
    return scratch.with_name(scratch.name + ".out")


def read_tail(path: Path, limit: int) -> str:
    """The last `limit` bytes of a file, as text ("" if it cannot be read)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def keep_leftovers(scratch: Path, keep: Path) -> None:
    """Move the scratch directory's contents to `keep` (a name of its own beside it if an earlier run of
    the same attempt left some there already)."""
    keep.parent.mkdir(parents=True, exist_ok=True)
    target, n = keep, 1
    while target.exists():
        target, n = keep.with_name(f"{keep.name}.{n}"), n + 1
    os.rename(scratch, target)


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


def _use_env(env: dict[str, str]) -> None:
    """Make os.environ exactly `env`, changing only what differs: a call is given the same environment
    as the last one but for its task's own variables, and clearing and refilling the whole of it cost
    a third of the runner's time per no-op call."""
    have = dict(os.environ)
    for key in have.keys() - env.keys():
        del os.environ[key]
    for key, value in env.items():
        if have.get(key) != value:
            os.environ[key] = value


class _Call:
    """The runner's own state across calls: its output file, the null device (a call's fds 1 and 2 point
    there between calls), its scratch directory; the working directory is changed only for a call that
    needs another."""

    def __init__(self, scratch: Path, out: int) -> None:
        self.scratch, self.out = scratch, out
        self.null = os.open(os.devnull, os.O_WRONLY)
        self.cwd = os.getcwd()

    def run(self, req: dict[str, Any]) -> dict[str, Any]:
        """One call, its output into the output file (emptied first), in its working directory or else in
        the scratch directory; what it leaves in the scratch directory is moved to its `keep` folder. The
        environment is the call's from its start to the next call's (a call that changes it changes
        nothing for the next: `_use_env` makes it the next call's exactly)."""
        out = self.out
        os.ftruncate(out, 0)
        os.lseek(out, 0, os.SEEK_SET)
        code, reason = 0, ""
        try:
            os.dup2(out, 1)
            os.dup2(out, 2)
            _use_env(req["env"])
            want = req["cwd"] or str(self.scratch)
            if want != self.cwd:
                os.chdir(want)
                self.cwd = want
            try:
                # the submission's own JSON, read here with json as it was written (NaN and all)
                resolve(req["target"])(*json.loads(req["args_json"]), **json.loads(req["kwargs_json"]))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException as exc:  # noqa: BLE001 - any failure of the task is its attempt's outcome
                traceback.print_exc()
                code, reason = 1, f"raised {type(exc).__name__}: {exc}"[:1000]
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(self.null, 1)
            os.dup2(self.null, 2)
            try:
                if os.getcwd() != self.cwd:  # the call moved: the next call's chdir must not be skipped
                    self.cwd = ""
            except OSError:  # the call removed the directory it was in
                self.cwd = ""
        if req["cwd"] is None and any(self.scratch.iterdir()):  # the call left files: they are the attempt's
            try:
                keep_leftovers(self.scratch, Path(req["keep"]))
            except OSError as exc:
                reason = reason or f"its files could not be kept in {req['keep']}: {exc.strerror or exc}"
            self.scratch.mkdir(exist_ok=True)
            self.cwd = ""  # the directory it was in is gone (moved): the next call goes to the new one
        limit = min(int(req["limit"]), TAIL_LIMIT)
        size = os.fstat(out).st_size
        tail = os.pread(out, limit, max(0, size - limit)).decode("utf-8", errors="replace") if size else ""
        return {"exit_code": code, "reason": reason, "tail": tail}


def encode_line(obj: dict[str, Any]) -> bytes:
    """One line of the protocol (a request or an answer). orjson: the standard library's json took 2-3%
    of the worker's event loop per no-op call. A string orjson refuses (a lone surrogate, which an
    environment variable or an exception's message can hold) goes through json, which escapes it."""
    try:
        return orjson.dumps(obj) + b"\n"
    except orjson.JSONEncodeError:
        return json.dumps(obj).encode() + b"\n"


def decode_line(line: bytes) -> dict[str, Any]:
    """A line `encode_line` wrote (json's escaped surrogates, which orjson refuses, read by json)."""
    try:
        obj: dict[str, Any] = orjson.loads(line)
    except orjson.JSONDecodeError:
        obj = json.loads(line)
    return obj


def main() -> None:
    scratch = Path(sys.argv[1])
    scratch.mkdir(parents=True, exist_ok=True)
    out = os.open(output_of(scratch), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    null_in = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_in, 0)  # a call reading stdin reads nothing, as an argv task does
    null_out = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null_out, 1)
    call = _Call(scratch, out)
    for line in requests:
        answers.write(encode_line(call.run(decode_line(line))))


if __name__ == "__main__":
    main()
