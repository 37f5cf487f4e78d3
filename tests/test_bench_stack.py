"""The benchmarks' shared helpers that a figure depends on (bench/_stack.py), without a stack."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def load_stack() -> Any:
    path = Path(__file__).resolve().parents[1] / "bench" / "_stack.py"
    spec = importlib.util.spec_from_file_location("bench_stack", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_speed_probe_samples_through_a_run_and_sums_up_what_it_saw() -> None:
    stack = load_stack()
    with stack.SpeedProbe(every=0.05) as probe:
        time.sleep(1.0)
    got = probe.summary()
    assert got["samples"] == len(probe.samples) >= 4  # ~17 in 1 s after the probe's start, fewer on a loaded machine
    assert all(x > 0 for x in probe.samples)
    assert got["min"] <= got["median"] <= got["max"]
    assert got["min"] == round(min(probe.samples), 2) and got["max"] == round(max(probe.samples), 2)


def test_a_run_shorter_than_the_probe_s_period_still_has_one_sample() -> None:
    stack = load_stack()
    probe = stack.SpeedProbe(every=60).start()
    probe.stop()
    assert len(probe.samples) == 1 and probe.summary()["samples"] == 1


def test_the_probe_s_process_ends_when_the_bench_that_started_it_dies(tmp_path: Path) -> None:
    """A bench killed mid-run never stops its probe: the probe's loop ends by itself once its parent is gone."""
    bench = Path(__file__).resolve().parents[1] / "bench"
    pid_file = tmp_path / "probe.pid"
    script = (
        f"import sys; sys.path.insert(0, {str(bench)!r})\n"
        "from _stack import SpeedProbe\n"
        "p = SpeedProbe(every=0.05).start()\n"
        f"open({str(pid_file)!r}, 'w').write(str(p._proc.pid))\n"
        "import time; time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the bench never started its probe"
            time.sleep(0.05)
        probe_pid = int(pid_file.read_text())
        assert Path(f"/proc/{probe_pid}").exists()
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{probe_pid}").exists() and "Z" not in state_of(probe_pid):
        assert time.monotonic() < deadline, "the probe outlived its bench"
        time.sleep(0.05)


def state_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"  # gone meanwhile


def test_a_thread_s_shares_tell_a_busy_thread_from_a_sleeping_one() -> None:
    stack = load_stack()
    spin = "import time\nend = time.time() + 30\nwhile time.time() < end: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    sleeping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)  # both started
        before = {p.pid: stack.thread_times(p.pid) for p in (busy, sleeping)}
        time.sleep(1.0)
        shares = {p.pid: stack.thread_shares(before[p.pid], stack.thread_times(p.pid)) for p in (busy, sleeping)}
    finally:
        for p in (busy, sleeping):
            p.kill()
            p.wait()
    # the spinning thread ran or waited for a core through the second (on a loaded machine it waits more)
    ran, waited = shares[busy.pid]["on_cpu"], shares[busy.pid]["waiting_for_a_core"]
    assert ran > 0.2 and 0.8 < ran + waited < 1.2, shares
    assert shares[sleeping.pid]["on_cpu"] < 0.05 and shares[sleeping.pid]["waiting_for_a_core"] < 0.05, shares


def test_the_worker_loop_s_times_are_none_where_there_is_no_worker_to_read() -> None:
    stack = load_stack()
    assert stack.worker_loop_times(None) is None  # the stack runs no worker of its own (the peers bench)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert stack.worker_loop_times(gone.pid) is None  # a worker that ended meanwhile
    here = stack.worker_loop_times(os.getpid())
    assert here is not None and here[1] > 0  # this process's main thread has run
