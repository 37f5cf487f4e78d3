"""connectors/keeper.py `hold` and `last_holder`: a worker's index lock, released by the kernel however its
holder ends, remembers who held it last, so a worker started under that index knows whose claims are
now nobody's (streams/worker.release_predecessor). Real processes, a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from taskstream.connectors.keeper import Taken, hold, last_holder

HOLDER = (
    "import pathlib, sys, time; from taskstream.connectors.keeper import hold; "
    "f = hold(pathlib.Path(sys.argv[1])); print('held', flush=True); time.sleep(600)"
)


def holder(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_the_lock_names_its_last_holder_after_a_sigkill_and_after_this_process_takes_it(tmp_path: Path) -> None:
    path = tmp_path / "worker-0.lock"
    assert last_holder(path) is None  # never held
    first = holder(path)
    with pytest.raises(Taken) as taken:
        hold(path)
    assert taken.value.pid == first.pid
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    assert last_holder(path) == first.pid
    mine = hold(path)  # the kernel let go of the dead one's lock
    try:
        assert last_holder(path) == first.pid  # this process is not its own predecessor
        assert path.read_text().split() == [str(os.getpid()), str(first.pid)]
    finally:
        mine.close()
    mine = hold(path)  # taken again by the same process (the CLI's check, then the worker)
    mine.close()
    assert last_holder(path) == first.pid
    second = holder(path)
    second.send_signal(signal.SIGKILL)
    second.wait(10)
    assert last_holder(path) == second.pid
