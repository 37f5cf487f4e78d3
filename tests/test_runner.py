"""Callable tasks' runner processes (streams/runner.py), on real processes: output captured at the file
descriptor, exit statuses, the environment and directory of each call, reuse, and a killed runner."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from taskstream.streams.runner import CallFailed, Runners, resolve


def request(tmp: Path, target: str, *args: Any, env: dict[str, str] | None = None, **kwargs: Any) -> dict[str, Any]:
    return {
        "target": target,
        "args": list(args),
        "kwargs": kwargs,
        "env": env or {"PATH": os.environ["PATH"]},
        "cwd": str(tmp),
        "output": str(tmp / f"out-{target.replace(':', '-')}"),
    }


def test_calls_run_with_their_output_environment_and_directory_and_the_runner_is_reused(tmp_path: Path) -> None:
    async def go() -> None:
        runners = Runners(None)
        runner = await runners.acquire()
        try:
            ok = await runner.call(request(tmp_path, "builtins:print", "[/x] hello", 42))
            assert ok == {"exit_code": 0, "reason": ""}
            assert (tmp_path / "out-builtins-print").read_text() == "[/x] hello 42\n"
            # C-level writes to fd 1 land in the output too; env and cwd are the task's
            code = "import os; os.write(1, (os.getcwd() + ' ' + os.environ['TASKSTREAM_TASK_ID']).encode())"
            got = await runner.call(request(tmp_path, "builtins:exec", code, env={"TASKSTREAM_TASK_ID": "t-1"}))
            assert got["exit_code"] == 0
            assert (tmp_path / "out-builtins-exec").read_text() == f"{tmp_path} t-1"
            boom = await runner.call(request(tmp_path, "operator:truediv", 1, 0))
            assert boom == {"exit_code": 1, "reason": "raised ZeroDivisionError: division by zero"}
            assert "Traceback" in (tmp_path / "out-operator-truediv").read_text()
            assert (await runner.call(request(tmp_path, "sys:exit", 4)))["exit_code"] == 4
            missing = await runner.call(request(tmp_path, "no_such_module_here:f"))
            assert missing["exit_code"] == 1 and "No module named 'no_such_module_here'" in missing["reason"]
            runners.release(runner)
            again = await runners.acquire()
            assert again is runner  # one interpreter for many calls
            # the runner's own environment was restored after each call
            await again.call(request(tmp_path, "builtins:exec", "import os; print('TASKSTREAM_TASK_ID' in os.environ)"))
            assert (tmp_path / "out-builtins-exec").read_text() == "False\n"
        finally:
            runners.release(runner)
            await runners.close()

    asyncio.run(go())


def test_a_killed_runner_fails_its_call_and_is_not_reused(tmp_path: Path) -> None:
    async def go() -> None:
        runners = Runners(None)
        runner = await runners.acquire()
        call = asyncio.create_task(runner.call(request(tmp_path, "time:sleep", 30)))
        await asyncio.sleep(0.5)
        os.killpg(runner.pid, signal.SIGKILL)
        with pytest.raises(CallFailed, match="exit status -9"):
            await call
        await runner.close()
        runners.release(runner)
        fresh = await runners.acquire()
        try:
            assert fresh is not runner and fresh.pid != runner.pid
        finally:
            runners.release(fresh)
            await runners.close()

    asyncio.run(go())


def test_targets_resolve_through_dotted_attributes_and_must_be_callable() -> None:
    assert resolve("os.path:join") is os.path.join
    assert resolve("collections:OrderedDict.fromkeys") is not None
    with pytest.raises(TypeError, match="os:sep is not callable"):
        resolve("os:sep")
    with pytest.raises(AttributeError):
        resolve("os:no_such_function")
