"""Which engines a stack runs on.

The default is what the design names: Apache Kafka and Neo4j, started by the project where the JVM side
can run (Java >= 17, and Maven or jars it resolved before). Where it cannot, the pip-only pair: noida-db
and Ladybug, with one line saying why. TASKSTREAM_BROKER (kafka | noida) and TASKSTREAM_GRAPH_BACKEND
(neo4j | ladybug) choose explicitly; an external broker (TASKSTREAM_KAFKA_BOOTSTRAP) is taken to be Kafka.

The first `taskstream up` of a state directory records the choice in `<state>/engines.json`; later
commands on that directory (`up` again, `submit`, `status`, ...) read it, so a stack keeps the engines
its data was written with, and CLI commands need not probe for Java.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from taskstream.connectors import jvm
from taskstream.connectors.embedded_neo4j import read_password

from taskstream.settings import Settings

FALLBACK = "noida-db and Ladybug, the pip-only fallback"


class EngineError(RuntimeError):
    """The engines asked for cannot run here; one line saying why."""


@dataclass(frozen=True)
class Choice:
    settings: Settings  # broker and graph_backend decided
    note: str = ""  # one line for `up` to print when it fell back


def record_path(settings: Settings) -> Path:
    return settings.state_dir / "engines.json"


def recorded(settings: Settings) -> dict[str, Any]:
    try:
        data = json.loads(record_path(settings).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record(settings: Settings) -> None:
    path = record_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"broker": settings.broker, "graph": settings.graph_backend}) + "\n")


def jvm_problem(settings: Settings) -> str | None:
    """Why the JVM engines cannot run here (one line), or None if they can."""
    try:
        jvm.find_java(settings)
    except jvm.JvmError as exc:
        return str(exc)
    engines = (jvm.kafka_engine(), jvm.neo4j_engine())
    if jvm.find_maven() is None and not all(jvm.cached_classpath(settings, e) for e in engines):
        return "Maven (mvn) is not installed and the Kafka and Neo4j jars were not resolved before"
    return None


def choose(settings: Settings, probe: bool = True) -> Choice:
    """Decide the broker and the graph backend. `probe`: look for Java and Maven if still undecided (else
    take the JVM engines as available)."""
    rec = recorded(settings)
    broker = settings.broker or ("kafka" if not settings.embedded_kafka else str(rec.get("broker", "")))
    graph = settings.graph_backend or ("neo4j" if settings.neo4j_uri else str(rec.get("graph", "")))
    note = ""
    if not broker or not graph:
        problem = jvm_problem(settings) if probe else None
        if problem is not None:
            note = f"{problem}: running on {FALLBACK}"
        broker = broker or ("kafka" if problem is None else "noida")
        graph = graph or ("neo4j" if problem is None else "ladybug")
    s = replace(settings, broker=broker, graph_backend=graph)
    if s.embedded_neo4j and not s.neo4j_password:
        s = replace(s, neo4j_password=read_password(s) or "")
    return Choice(s, note)


def check_record(settings: Settings) -> None:
    """Refuse to start a state directory on another broker than its log was written to: the projections'
    checkpoints are offsets in that log."""
    was = recorded(settings).get("broker")
    if settings.embedded_kafka and was and was != settings.broker:
        raise EngineError(
            f"the state directory {settings.state_dir} holds a {was} log; starting it on {settings.broker} "
            f"would lose it: set TASKSTREAM_BROKER={was}, or use another TASKSTREAM_STATE_DIR"
        )


def prepare_jvm(settings: Settings, progress: jvm.Progress | None = None) -> None:
    """Resolve (once) the classpaths of the JVM engines this stack starts, showing progress."""
    if settings.embedded_kafka and settings.broker == "kafka":
        jvm.ensure(settings, jvm.kafka_engine(), progress)
    if settings.embedded_neo4j:
        jvm.ensure(settings, jvm.neo4j_engine(), progress)


def describe(settings: Settings) -> str:
    """One line naming the engines, for `up` and `status`."""
    if settings.broker == "kafka":
        broker = f"{jvm.kafka_engine().label} (embedded)" if settings.embedded_kafka else "Kafka (external)"
    else:
        broker = "noida-db (embedded)" if settings.embedded_kafka else "noida-db (external)"
    if settings.graph_backend == "neo4j":
        graph = f"{jvm.neo4j_engine().label} (embedded)" if settings.embedded_neo4j else "Neo4j (external)"
    else:
        graph = "Ladybug (embedded)"
    return f"{broker} · {graph}"
