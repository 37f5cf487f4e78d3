"""Callable tasks' runner processes (streams/runner.py), on real processes: output captured at the file
descriptor, exit statuses, the environment and directory of each call, reuse, a killed runner, and the
scratch directory (empty for each call, what a call leaves kept as its attempt's)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from taskstream.streams.runner import CallFailed, Runners, resolve


def request(
    cwd: Path | None, target: str, *args: Any, env: dict[str, str] | None = None, keep: Path | None = None,
    **kwargs: Any,
) -> dict[str, Any]:  # fmt: skip
    return {
        "target": target,
        "args_json": json.dumps(list(args)),  # as a submission's call carries them
        "kwargs_json": json.dumps(kwargs),
        "env": env or {"PATH": os.environ["PATH"]},
        "cwd": str(cwd) if cwd is not None else None,
        "keep": str(keep or Path("/nonexistent/keep")),
        "limit": 4096,
    }


def test_calls_run_with_their_output_environment_and_directory_and_the_runner_is_reused(tmp_path: Path) -> None:
    async def go() -> None:
        runners = Runners(None, tmp_path / "runners")
        runner = await runners.acquire()
        try:
            ok = await runner.call(request(tmp_path, "builtins:print", "[/x] hello", 42))
            assert ok == {"exit_code": 0, "reason": "", "tail": "[/x] hello 42\n"}
            # C-level writes to fd 1 land in the output too; env and cwd are the task's
            code = "import os; os.write(1, (os.getcwd() + ' ' + os.environ['TASKSTREAM_TASK_ID']).encode())"
            got = await runner.call(request(tmp_path, "builtins:exec", code, env={"TASKSTREAM_TASK_ID": "t-1"}))
            assert got == {"exit_code": 0, "reason": "", "tail": f"{tmp_path} t-1"}  # the last call's output only
            boom = await runner.call(request(tmp_path, "operator:truediv", 1, 0))
            assert (boom["exit_code"], boom["reason"]) == (1, "raised ZeroDivisionError: division by zero")
            assert boom["tail"].startswith("Traceback")
            assert boom["tail"].endswith("ZeroDivisionError: division by zero\n")
            assert (await runner.call(request(tmp_path, "sys:exit", 4)))["exit_code"] == 4
            missing = await runner.call(request(tmp_path, "no_such_module_here:f"))
            assert missing["exit_code"] == 1 and "No module named 'no_such_module_here'" in missing["reason"]
            # only the last `limit` bytes come back
            long = await runner.call({**request(tmp_path, "builtins:print", "x" * 5000 + "END"), "limit": 10})
            assert long["tail"] == "xxxxxxEND\n"
            runners.release(runner)
            again = await runners.acquire()
            assert again is runner  # one interpreter for many calls
            # the runner's own environment was restored after each call
            code = "import os; print('TASKSTREAM_TASK_ID' in os.environ)"
            out = await again.call(request(tmp_path, "builtins:exec", code))
            assert out["tail"] == "False\n"
            # what a call changes of its environment and directory is not the next call's
            mess = "import os; os.environ['LEAKED'] = '1'; os.environ.pop('PATH'); os.chdir('/')"
            assert (await again.call(request(tmp_path, "builtins:exec", mess)))["exit_code"] == 0
            code = "import os; print('LEAKED' in os.environ, os.environ['PATH'], os.getcwd())"
            out = await again.call(request(tmp_path, "builtins:exec", code))
            assert out["tail"] == f"False {os.environ['PATH']} {tmp_path}\n"
            # nor the directory it removed while it was in it
            gone = tmp_path / "gone"
            gone.mkdir()
            rm = "import os; os.rmdir(os.getcwd())"
            assert (await again.call(request(gone, "builtins:exec", rm)))["exit_code"] == 0
            out = await again.call(request(tmp_path, "builtins:exec", "import os; print(os.getcwd())"))
            assert out["tail"] == f"{tmp_path}\n"
        finally:
            runners.release(runner)
            await runners.close()

    asyncio.run(go())


def test_surrogates_in_the_environment_and_in_a_reason_and_a_nan_argument_go_through(tmp_path: Path) -> None:
    """The protocol's lines are orjson's, which refuses lone surrogates (an environment variable read
    with surrogateescape can hold one, and so can an exception's message): such a line goes through
    json instead, both ways. Arguments stay json's own (NaN is not JSON, but json reads it)."""

    async def go() -> None:
        runners = Runners(None, tmp_path / "runners")
        runner = await runners.acquire()
        try:
            env = {"PATH": os.environ["PATH"], "ODD": "caf\udce9"}
            code = "import os; print(ascii(os.environ['ODD']))"
            got = await runner.call(request(tmp_path, "builtins:exec", code, env=env))
            assert got == {"exit_code": 0, "reason": "", "tail": "'caf\\udce9'\n"}
            odd = await runner.call(request(tmp_path, "builtins:exec", "raise ValueError('\\udce9')"))
            assert (odd["exit_code"], odd["reason"]) == (1, "raised ValueError: \udce9")
            nan = await runner.call(request(tmp_path, "builtins:print", float("nan"), sep="|"))
            assert nan == {"exit_code": 0, "reason": "", "tail": "nan\n"}
        finally:
            runners.release(runner)
            await runners.close()

    asyncio.run(go())


def test_a_killed_runner_fails_its_call_and_is_not_reused(tmp_path: Path) -> None:
    async def go() -> None:
        runners = Runners(None, tmp_path / "runners")
        runner = await runners.acquire()
        code = "import os, time; open('half-done', 'w').write('1'); print('started', flush=True); time.sleep(30)"
        call = asyncio.create_task(runner.call(request(None, "builtins:exec", code)))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if runner.tail(100):
                break
        os.killpg(runner.pid, signal.SIGKILL)
        with pytest.raises(CallFailed, match="exit status -9"):
            await call
        await runner.close()
        assert runner.tail(100) == "started\n"  # what the killed call printed, from the runner's file
        runner.keep_scratch(tmp_path / "work" / "t" / "1")  # what it left is its attempt's
        assert (tmp_path / "work" / "t" / "1" / "half-done").read_text() == "1"
        assert not runner.scratch.exists() and not runner.output.exists()
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


def test_a_call_without_a_directory_runs_in_an_empty_scratch_one_and_what_it_leaves_is_its_attempt_s(
    tmp_path: Path,
) -> None:
    """No folder or file is made for a call that leaves nothing; one that leaves files has them moved to
    its `keep` folder (beside an earlier one of the same name), and the next call starts empty again."""

    async def go() -> None:
        runners = Runners(None, tmp_path / "runners")
        runner = await runners.acquire()
        work = tmp_path / "work"
        try:
            look = "import os; print(os.getcwd(), sorted(os.listdir('.')))"
            first = await runner.call(request(None, "builtins:exec", look, keep=work / "a" / "1"))
            assert first["tail"] == f"{runner.scratch} []\n"
            assert not work.exists()  # nothing left, nothing made
            write = "open('result.txt', 'w').write('42'); print('wrote')"
            for _ in range(2):
                done = await runner.call(request(None, "builtins:exec", write, keep=work / "b" / "1"))
                assert done == {"exit_code": 0, "reason": "", "tail": "wrote\n"}
            assert (work / "b" / "1" / "result.txt").read_text() == "42"
            assert (work / "b" / "1.1" / "result.txt").read_text() == "42"  # the same attempt run again
            again = await runner.call(request(None, "builtins:exec", look, keep=work / "c" / "1"))
            assert again["tail"] == f"{runner.scratch} []\n"
            assert sorted(p.name for p in work.iterdir()) == ["b"]
        finally:
            runners.release(runner)
            await runners.close()
        assert list((tmp_path / "runners").iterdir()) == []  # closed runners leave nothing behind

    asyncio.run(go())


def test_the_files_of_runners_whose_worker_died_are_swept_and_a_live_worker_s_are_not(tmp_path: Path) -> None:
    scratch = tmp_path / "runners"
    scratch.mkdir()
    dead = 2**22 + 12345  # above pid_max's default: no process has it
    for name in (f"{dead}-1", f"{os.getpid()}-1"):
        (scratch / name).mkdir()
        (scratch / f"{name}.out").write_text("tail")
    (scratch / f"{dead}-2").mkdir()
    (scratch / f"{dead}-2" / "left.txt").write_text("a stopped call's file")  # kept: not empty
    Runners(None, scratch).sweep()
    assert {p.name for p in scratch.iterdir()} == {f"{dead}-2", f"{os.getpid()}-1", f"{os.getpid()}-1.out"}
