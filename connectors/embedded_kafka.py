"""The embedded Apache Kafka broker: one KRaft node, broker and controller in one JVM, under the state
directory (`<state>/kafka`). Its settings are `connectors/jvm/kafka/broker.properties` (shared with
docker-compose.yml) plus the node's own: identity, listeners on loopback, the log directory.

The log directory is formatted once, before the first start (Kafka's storage tool), with a cluster id
kept beside it; later starts find it formatted and keep its data. The quorum is static (one voter named
in `controller.quorum.voters`), so a changed controller port applies at the next start.
"""

from __future__ import annotations

import base64
import subprocess
import uuid
from pathlib import Path

from taskstream.connectors.jvm import JVM_DIR, JvmError, class_data_options, ensure, jit_options, kafka_engine

from taskstream.settings import Settings

BROKER_PROPERTIES = JVM_DIR / "kafka" / "broker.properties"
LOG4J = JVM_DIR / "kafka" / "log4j2.properties"
NODE_ID = 1
# What the node says about itself; broker.properties (shared with docker-compose) sets none of these.
NODE_KEYS = (
    "process.roles",
    "node.id",
    "controller.quorum.voters",
    "listeners",
    "advertised.listeners",
    "controller.listener.names",
    "listener.security.protocol.map",
    "inter.broker.listener.name",
    "log.dirs",
)
# The G1 options Kafka's own start scripts use, and the heap from settings (Kafka's default is 1 GiB).
JVM_OPTIONS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)


def read_properties(path: Path) -> dict[str, str]:
    """key=value lines of a Java properties file (no continuation lines or escapes: ours use none)."""
    out: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise JvmError(f"{path}:{n}: expected key=value, got {line!r}")
        out[key.strip()] = value.strip()
    return out


def home(settings: Settings) -> Path:
    return settings.state_dir / "kafka"


def server_properties(settings: Settings) -> dict[str, str]:
    """The broker's whole configuration: the shared settings plus this node's."""
    s = settings
    shared = read_properties(BROKER_PROPERTIES)
    clash = sorted(set(shared) & set(NODE_KEYS))
    if clash:
        raise JvmError(f"{BROKER_PROPERTIES} must not set node settings: {', '.join(clash)}")
    node = {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "controller.quorum.voters": f"{NODE_ID}@{s.host}:{s.kafka_controller_port}",
        "listeners": f"PLAINTEXT://{s.host}:{s.kafka_port},CONTROLLER://{s.host}:{s.kafka_controller_port}",
        "advertised.listeners": f"PLAINTEXT://{s.host}:{s.kafka_port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(home(settings) / "data"),
    }
    return {**shared, **node}


def write_config(settings: Settings) -> Path:
    path = home(settings) / "server.properties"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# written by taskstream at every start: edit connectors/jvm/kafka/broker.properties instead"]
    lines += [f"{k}={v}" for k, v in server_properties(settings).items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def cluster_id(settings: Settings) -> str:
    """This broker's cluster id (Kafka's format: 16 random bytes, URL-safe base64), made once."""
    path = home(settings) / "cluster-id"
    if path.exists() and not path.read_text().startswith("-"):  # one made before ids were checked: never formatted
        return path.read_text().strip()
    cid = new_cluster_id()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cid + "\n")
    return cid


def new_cluster_id() -> str:
    """A fresh cluster id. Never one starting with '-': the storage tool took `-t -xyz...` for a missing
    value and an option (seen once in a bench run: one id in 64 starts so). Kafka's own `Uuid` draws
    again for the same reason."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def java_argv(settings: Settings, main: str, *args: str, server: bool = False) -> list[str]:
    engine = kafka_engine()
    java, cp = ensure(settings, engine)
    return [
        java.path,
        f"-Xmx{settings.kafka_heap_mb}m",
        f"-Xms{min(settings.kafka_heap_mb, 128)}m",
        *JVM_OPTIONS,
        *jit_options(settings),
        *(class_data_options(settings, engine, java, cp) if server else ()),
        f"-Dlog4j2.configurationFile={LOG4J}",
        "-cp",
        cp,
        main,
        *args,
    ]


def prepare(settings: Settings) -> None:
    """Write the configuration; format the log directory if this is its first start."""
    config = write_config(settings)
    data = home(settings) / "data"
    if (data / "meta.properties").exists():
        return
    data.mkdir(parents=True, exist_ok=True)
    argv = java_argv(settings, "kafka.tools.StorageTool", "format", "-t", cluster_id(settings), "-c", str(config))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603 - argv list
    if done.returncode != 0:
        tail = [ln for ln in (done.stderr + done.stdout).strip().splitlines() if ln.strip()][-1:] or ["no output"]
        raise JvmError(f"formatting the Kafka log directory {data} failed: {tail[0]}")


def argv(settings: Settings) -> list[str]:
    return java_argv(settings, "kafka.Kafka", str(home(settings) / "server.properties"), server=True)
