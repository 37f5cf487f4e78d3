"""What the benchmarks share: a throwaway embedded stack on either engine pair (free ports, a temporary
state dir, `up` then `down`), the process table of a running stack, summaries of repeated runs, and the
results files."""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

# The two engine pairs a stack runs on: the design's (Apache Kafka, Neo4j) and the pip-only fallback.
KINDS = {
    "kafka": {"TASKSTREAM_BROKER": "kafka", "TASKSTREAM_GRAPH_BACKEND": "neo4j"},
    "fallback": {"TASKSTREAM_BROKER": "noida", "TASKSTREAM_GRAPH_BACKEND": "ladybug"},
}
PORTS = ("KAFKA", "KAFKA_CONTROLLER", "REGISTRY", "POSTGRES", "GRAPH", "NEO4J")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kinds(arg: str) -> list[str]:
    """--engines kafka | fallback | both"""
    return list(KINDS) if arg == "both" else [arg]


@contextmanager
def embedded_stack(kind: str = "kafka", **extra: str) -> Iterator[dict[str, str]]:
    """Yields the TASKSTREAM_* environment of a running stack (plus `extra` settings); stops it afterwards
    and removes its state directory (kept, and named, if TASKSTREAM_BENCH_KEEP is set)."""
    state = Path(tempfile.mkdtemp(prefix=f"taskstream-bench-{kind}-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    env["TASKSTREAM_STATE_DIR"] = str(state)
    for name in PORTS:
        env[f"TASKSTREAM_{name}_PORT"] = str(free_port())
    env.update(KINDS[kind])
    env.update({f"TASKSTREAM_{k.upper()}": v for k, v in extra.items()})
    cli = [sys.executable, "-m", "taskstream"]
    done = subprocess.run([*cli, "up"], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"taskstream up failed ({kind}):\n{done.stdout}\n{done.stderr}")
    try:
        yield env
    finally:
        subprocess.run([*cli, "down"], env=env, capture_output=True)
        if os.environ.get("TASKSTREAM_BENCH_KEEP"):
            print(f"kept the stack's state (logs, data) in {state}", file=sys.stderr)
        else:  # a bench's stacks add up to tens of GB in /tmp
            shutil.rmtree(state, ignore_errors=True)


def settings_of(env: dict[str, str]) -> Any:
    """The stack's settings as its CLI sees them (engines chosen, the generated Neo4j password read)."""
    from taskstream.connectors.engines import choose

    from taskstream.settings import Settings

    return choose(Settings.from_env(env), probe=False).settings


def services(env: dict[str, str]) -> dict[str, int]:
    """Service name -> pid of a running stack."""
    status = json.loads((Path(env["TASKSTREAM_STATE_DIR"]) / "run" / "supervisor.json").read_text())
    return {name: v["pid"] for name, v in status["services"].items() if v.get("pid")}


def children_map() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """pid and every process under it (`children`: a children_map() taken already)."""
    children = children_map() if children is None else children
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def tree_rss(pid: int, children: dict[int, list[int]] | None = None) -> float:
    """The resident memory of pid and every process under it, in MiB."""
    total = 0
    for p in descendants(pid, children):
        try:
            with open(f"/proc/{p}/status") as f:
                total += next((int(ln.split()[1]) for ln in f if ln.startswith("VmRSS")), 0)
        except OSError:
            continue
    return total / 1024


class PeakRss:
    """The peak resident memory of named process trees, sampled when asked (at most every `every` s)."""

    def __init__(self, pids: dict[str, int], every: float = 0.5) -> None:
        self.pids, self.every = dict(pids), every
        self.peak = dict.fromkeys(pids, 0.0)
        self.last = 0.0

    def watch(self, name: str, pid: int) -> None:
        """Samples one more process tree from now on."""
        self.pids[name] = pid
        self.peak.setdefault(name, 0.0)

    def sample(self) -> None:
        if time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        children = children_map()
        for name, pid in self.pids.items():
            self.peak[name] = max(self.peak[name], tree_rss(pid, children))

    def mib(self) -> dict[str, float]:
        return {name: round(v, 1) for name, v in self.peak.items()}


def tree_cpu(pid: int) -> float:
    """CPU seconds of pid and every process under it, with the children they waited for."""
    total = 0.0
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            # own user + system, and that of waited-for children (a finished task process)
            total += sum(int(x) for x in parts[11:15]) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return total


def thread_times(pid: int, tid: int | None = None) -> tuple[float, float, float]:
    """(now, seconds on a CPU, seconds runnable and waiting for one) of a thread (default: the process's
    main thread), from /proc/PID/task/TID/schedstat: between two readings, the first two over the time
    between them say how much of it the thread ran and how much it waited in the run queue (on two
    shared cores, the worker's event loop waits for a core about as long as the others take it)."""
    with open(f"/proc/{pid}/task/{tid or pid}/schedstat") as f:
        run_ns, wait_ns = (int(x) for x in f.read().split()[:2])
    return time.monotonic(), run_ns / 1e9, wait_ns / 1e9


def worker_loop_times(pid: int | None) -> tuple[float, float, float] | None:
    """`thread_times` of a worker's main thread (its event loop), or None where there is nothing to read:
    no worker among the stack's services (the peers bench starts its own), or one gone meanwhile."""
    if pid is None:
        return None
    try:
        return thread_times(pid)
    except OSError:
        return None


def thread_shares(before: tuple[float, float, float], after: tuple[float, float, float]) -> dict[str, float]:
    """The shares of the time between two `thread_times` readings the thread ran and waited for a core."""
    span = max(1e-9, after[0] - before[0])
    ran, waited = after[1] - before[1], after[2] - before[2]
    return {"on_cpu": round(ran / span, 3), "waiting_for_a_core": round(waited / span, 3)}


def machine_ticks() -> tuple[int, int, int]:
    """The machine's CPU ticks so far (/proc/stat): busy (neither idle, iowait nor stolen), stolen by
    the host, and all."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4] - ticks[7], ticks[7], sum(ticks)


def machine_shares(before: tuple[int, int, int], after: tuple[int, int, int]) -> dict[str, float]:
    """The machine's busy and stolen shares between two `machine_ticks()`."""
    total = max(1, after[2] - before[2])
    return {"busy": round((after[0] - before[0]) / total, 3), "steal": round((after[1] - before[1]) / total, 3)}


# The speed probe's fixed piece of work: ~5.5 ms of one core's CPU on this machine's kind when it is fast.
PROBE_WORK = 50_000


def probe_work(n: int = PROBE_WORK) -> float:
    """CPU milliseconds this thread took for a fixed piece of pure-Python work (dict stores, int to str):
    the same work, so more milliseconds mean a slower machine at that moment."""
    start = time.thread_time()
    kept: dict[int, tuple[int, str]] = {}
    for i in range(n):
        kept[i & 1023] = (i, str(i))
    return (time.thread_time() - start) * 1000


# The probe's own process: the work every `every` seconds, each sample's milliseconds a line, until
# it is killed or its parent is gone (a bench that died without stopping it leaves no loop behind).
PROBE_LOOP = (
    "import os, sys, time\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "from _stack import probe_work\n"
    "while os.getppid() == int(sys.argv[3]):\n"
    "    time.sleep(float(sys.argv[2]))\n"
    "    print(round(probe_work(), 3), flush=True)\n"
)


class SpeedProbe:
    """The machine's speed through a run, to read its figures by: the probe's work timed every `every`
    seconds (~1% of a core), as CPU time, so waiting for a core does not count. These virtual
    machines' cores run the same work at speeds up to twice apart within seconds, idle or busy
    (docs/measurements.md, 2026-12-07, twenty-third): a run's rate moves with them, and a change to
    the code is only seen beside the probe's figure for its runs. The work runs in a process of its
    own: in a thread of the bench's process it would hold the GIL from a sender for up to 5 ms.

        with SpeedProbe() as probe:
            ...  # the run
        probe.summary()  # the work's milliseconds: median, min, max over the run
    """

    def __init__(self, every: float = 0.5) -> None:
        self.every = every
        self.samples: list[float] = []
        self._out = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by stop)
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> SpeedProbe:
        here = str(Path(__file__).resolve().parent)
        self._proc = subprocess.Popen([sys.executable, "-c", PROBE_LOOP, here, str(self.every), str(os.getpid())],
                                      stdout=self._out, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        self._out.seek(0)
        self.samples = [float(line) for line in self._out.read().split()]
        self._out.close()
        if not self.samples:  # a run shorter than `every`: one sample all the same
            self.samples.append(probe_work())

    def __enter__(self) -> SpeedProbe:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def summary(self) -> dict[str, Any]:
        xs = self.samples
        return {"median": round(statistics.median(xs), 2), "min": round(min(xs), 2), "max": round(max(xs), 2),
                "samples": len(xs)}  # fmt: skip


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int, peak: bool = False) -> float:
    key = "VmHWM" if peak else "VmRSS"
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return 0.0


def summary(values: list[float]) -> dict[str, Any]:
    """Median and range of repeated runs (and the runs themselves)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "runs": []}
    return {
        "median": round(statistics.median(vals), 3),
        "min": round(min(vals), 3),
        "max": round(max(vals), 3),
        "runs": [round(v, 3) for v in vals],
    }


def percentiles_ms(seconds: list[float]) -> dict[str, float | None]:
    """p50, p90 and p99 of latencies given in seconds, in milliseconds (None for none)."""
    vals = sorted(seconds)

    def at(q: float) -> float | None:
        return round(vals[min(len(vals) - 1, int(q * len(vals)))] * 1000, 1) if vals else None

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99)}


def open_loop(rate: float, n: int, send: Callable[[float], None]) -> tuple[float, float]:
    """Sends n tasks open loop at `rate` per second: the i-th is due at start + i / rate and sent then,
    send(due), or at once if the sender is behind (its latency counts from `due` all the same). Returns
    (the start, the sender's worst lateness in seconds)."""
    start = time.time() + 0.1
    late = 0.0
    for i in range(n):
        due = start + i / rate
        pause = due - time.time()
        if pause > 0:
            time.sleep(pause)
        else:
            late = max(late, -pause)
        send(due)
    return start, late


def when() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_report(path: Path, report: dict[str, object]) -> None:
    """Print a benchmark's figures and keep them in its results file."""
    text = json.dumps(report, indent=2)
    print(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def start_worker(env: dict[str, str], index: int) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """A Faust worker of a stack started with workers=0 (`taskstream serve worker`), its output in
    bench-worker-<index>.log under the state directory (appended; the caller closes the file)."""
    state = Path(env["TASKSTREAM_STATE_DIR"])
    log = open(state / f"bench-worker-{index}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "taskstream", "serve", "worker", "--index", str(index)],
        env=env,
        cwd=state,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return proc, log


def add_set_option(ap: Any) -> None:
    """`--set NAME=VALUE` (repeatable): run the stack with a setting changed (TASKSTREAM_<NAME>)."""
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a stack setting, e.g. claim_ahead=32; results go to a file of their own")  # fmt: skip


def set_settings(ap: Any, items: list[str]) -> dict[str, str]:
    bad = [item for item in items if "=" not in item or item.startswith("=")]
    if bad:
        ap.error(f"--set takes NAME=VALUE, not {bad[0]!r}")
    return dict(item.split("=", 1) for item in items)
