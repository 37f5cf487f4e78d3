"""Fixtures for tests that need the embedded stack: one real stack per session and engine pair, on free
ports, in a temporary state directory, started and stopped with the same `taskstream up` / `down` users
run.

Every stack test runs on the engines the design names, Apache Kafka and Neo4j ("kafka"). Tests marked
`fallback` (end to end, fuzz, admission crash points, replay) run on noida-db and Ladybug too
("fallback"), in the same session: pytest groups the tests by engine pair and stops one pair's stack
before it starts the other's. Where no JVM can run the Kafka/Neo4j tests are skipped with the reason,
never counted as passed.
"""

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
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from taskstream.settings import Settings

# These machines are shared and the suite runs stacks beside the pure tests: how fast hypothesis draws
# its examples says nothing about the code under test (too_slow failed a test that passes alone).
hypothesis_settings.register_profile("shared-machine", suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("shared-machine")

ROOT = Path(__file__).resolve().parent.parent


def free_ports(n: int) -> list[int]:
    """n distinct free ports: each socket is held until all are chosen (one at a time, the kernel gave
    the same port twice, and a stack's broker and PostgreSQL were set on one port)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


KINDS = {
    "kafka": {"TASKSTREAM_BROKER": "kafka", "TASKSTREAM_GRAPH_BACKEND": "neo4j"},
    "fallback": {"TASKSTREAM_BROKER": "noida", "TASKSTREAM_GRAPH_BACKEND": "ladybug"},
}
PORTS = ("KAFKA", "KAFKA_CONTROLLER", "REGISTRY", "POSTGRES", "GRAPH", "NEO4J")


def stack_env(state_dir: Path, kind: str = "kafka") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKSTREAM_")}
    env.update({f"TASKSTREAM_{name}_PORT": str(port) for name, port in zip(PORTS, free_ports(len(PORTS)), strict=True)})
    env["TASKSTREAM_STATE_DIR"] = str(state_dir)
    env.update(KINDS[kind])
    # A test's stack lives minutes: C1 alone spares it C2's compiling (the default, "full", is for a
    # stack that stays up; test_readme runs the main command with it)
    env["TASKSTREAM_JVM_JIT"] = "quick"
    return env


_JVM: list[str | None] = []


def jvm_problem() -> str | None:
    """Why Kafka and Neo4j cannot run here, or None (asked once per session)."""
    if not _JVM:
        from taskstream.connectors.engines import jvm_problem as probe

        _JVM.append(probe(Settings.from_env({})))
    return _JVM[0]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Stack tests run on Kafka + Neo4j; those marked `fallback` on noida-db + Ladybug as well."""
    if "stack_kind" in metafunc.fixturenames:
        kinds = ["kafka", "fallback"] if metafunc.definition.get_closest_marker("fallback") else ["kafka"]
        metafunc.parametrize("stack_kind", kinds, indirect=True, scope="session")


@pytest.fixture(scope="session")
def stack_kind(request: pytest.FixtureRequest) -> str:
    kind = str(getattr(request, "param", "kafka"))
    if kind == "kafka" and (why := jvm_problem()):
        pytest.skip(f"Apache Kafka and Neo4j cannot run here: {why}")
    return kind


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
    def __init__(self, state_dir: Path, kind: str = "kafka") -> None:
        self.kind = kind
        self.env = stack_env(state_dir, kind)

    @property
    def settings(self) -> Settings:
        """The stack's settings as its CLI sees them (engines chosen, the generated Neo4j password read)."""
        from taskstream.connectors.engines import choose

        return choose(Settings.from_env(self.env), probe=False).settings

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
def stack(tmp_path_factory: pytest.TempPathFactory, stack_kind: str) -> Iterator[Stack]:
    with running(Stack(tmp_path_factory.mktemp(f"stack-{stack_kind}") / "state", stack_kind)) as s:
        yield s


@contextmanager
def neo4j_server(home: Path) -> Iterator[tuple[str, str, str]]:
    """A Neo4j server of its own (the embedded launcher's), for tests of the graph store itself; yields
    (uri, user, password) and stops it after."""
    from taskstream.connectors import embedded_neo4j

    s = Settings(state_dir=home, neo4j_port=free_port(), graph_backend="neo4j", neo4j_heap_mb=384)
    embedded_neo4j.prepare(s)
    log = (home / "neo4j.log").open("ab")
    proc = subprocess.Popen(
        embedded_neo4j.argv(s),
        env={**os.environ, **embedded_neo4j.env(s)},
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: proc.poll() is not None or embedded_neo4j.ready(s), 120, "Neo4j to answer")
        assert proc.poll() is None, (home / "neo4j.log").read_text()[-2000:]
        yield s.neo4j_url, s.neo4j_user, embedded_neo4j.read_password(s) or ""
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


GATE_WAIT = (
    "import os, sys, time\n"
    "end = time.monotonic() + 120\n"
    "while not os.path.exists(sys.argv[1]) and time.monotonic() < end:\n"
    "    time.sleep(0.05)\n"
    "sys.exit(0 if os.path.exists(sys.argv[1]) else 1)"
)


def gated(gate: Path) -> list[str]:
    """The argv of a task that runs until the file `gate` exists (two minutes at most, then it fails). A
    test that needs the worker's slots held while it looks creates the file when it is done looking: a
    timed sleep can end first on a slow machine and let the next tasks in."""
    return [sys.executable, "-c", GATE_WAIT, str(gate)]


def wait_until(
    check: Callable[[], Any],
    timeout: float = 120,
    what: str = "condition",
    every: float = 0.3,
    show: Callable[[], Any] | None = None,
) -> Any:
    """`check()` once it is truthy; on timeout an AssertionError naming `what`, the last value and, if
    given, what `show()` says of the state then (a predicate's None alone says nothing of why)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    seen = "" if show is None else f"; {show()!r}"
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}{seen}")


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[Path]:
    """The gate file of a test's gated tasks (`gated`), created when the test ends whatever its outcome:
    a test that fails before it opens the gate would otherwise leave a module's stack busy with its
    tasks for two minutes, and every test after it on that stack failing for that alone."""
    path = tmp_path / "gate"
    yield path
    path.touch()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that need neither shared stack first, then the Kafka stack's, then the fallback's: a shared
    stack is up only while its own tests run (an idle fallback stack took most of a core from the tests
    that ran beside it). Within a stack's tests, those marked `big_history` go last: every replay of the
    shared stack's log after a 4,000-task DAG cost ~10 s more, and its swap ~20 s (the replay tests
    took 89 s instead of ~35)."""
    rank = {None: 0, "kafka": 1, "fallback": 2}

    def kind(item: pytest.Item) -> Any:
        spec = getattr(item, "callspec", None)
        return spec.params.get("stack_kind") if spec is not None else None

    # a case of a `fallback` test marked `kafka_only` (e.g. one kill point of several) runs on Kafka alone
    dropped = [item for item in items if kind(item) == "fallback" and item.get_closest_marker("kafka_only")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]
    items.sort(key=lambda item: (rank.get(kind(item), 0), item.get_closest_marker("big_history") is not None))
