"""Choosing and starting the engines: Kafka and Neo4j from Maven-resolved jars where a JVM runs, the
pip-only pair where it does not, one-line errors for what is missing, and one source of broker
settings for the embedded broker and docker-compose."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest
import yaml
from taskstream.connectors import embedded_kafka, engines, jvm

from taskstream.settings import Settings
from tests.conftest import ROOT, jvm_problem, stack_env, taskstream


def fake_java(tmp_path: Path, version_line: str) -> Path:
    """An executable that answers `-version` as a Java of that version would (on stderr)."""
    path = tmp_path / "java"
    path.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "25" 2025-09-16', 25),
        ('java version "1.8.0_412"', 8),
        ('openjdk version "21.0.2-ea" 2024-01-16', 21),
        ("no version here", None),
    ],
)
def test_java_versions_are_read_from_what_java_prints(text: str, version: int | None) -> None:
    assert jvm.parse_java_version(text) == version


def test_a_missing_java_is_named_in_one_line(tmp_path: Path) -> None:
    s = Settings(state_dir=tmp_path, java=str(tmp_path / "no-java-here"))
    with pytest.raises(jvm.JvmError) as err:
        jvm.find_java(s)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"no Java found (looked at TASKSTREAM_JAVA: {tmp_path / 'no-java-here'})" in msg and "17" in msg


def test_a_too_old_java_is_named_with_its_version(tmp_path: Path) -> None:
    s = Settings(state_dir=tmp_path, java=str(fake_java(tmp_path, 'openjdk version "11.0.2" 2019-01-15')))
    with pytest.raises(jvm.JvmError) as err:
        jvm.find_java(s)
    assert str(err.value).startswith(f"Java 11 at {tmp_path / 'java'} (from TASKSTREAM_JAVA) is too old")


def test_without_a_jvm_the_choice_falls_back_and_says_why(tmp_path: Path) -> None:
    s = Settings.from_env({"TASKSTREAM_STATE_DIR": str(tmp_path), "TASKSTREAM_JAVA": str(tmp_path / "none")})
    choice = engines.choose(s)
    assert (choice.settings.broker, choice.settings.graph_backend) == ("noida", "ladybug")
    assert choice.note.startswith("no Java found") and choice.note.endswith(engines.FALLBACK)
    explicit = engines.choose(Settings.from_env({"TASKSTREAM_STATE_DIR": str(tmp_path), "TASKSTREAM_BROKER": "noida"}))
    assert explicit.settings.broker == "noida"


def test_up_without_java_says_so_in_one_line_and_would_run_the_fallback(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in stack_env(tmp_path / "state").items()
        if k not in ("TASKSTREAM_BROKER", "TASKSTREAM_GRAPH_BACKEND")
    }
    env["TASKSTREAM_JAVA"] = str(tmp_path / "no-java")
    with socket.socket() as taken:  # stop `up` right after it has chosen, before it starts anything
        taken.bind(("127.0.0.1", int(env["TASKSTREAM_KAFKA_PORT"])))
        taken.listen()
        out = taskstream(env, "up", check=False, timeout=60)
    assert out.returncode == 1
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    note = " ".join(ln.strip() for ln in lines[:-1])
    assert note.startswith("note: no Java found") and "noida-db and Ladybug" in note, out.stderr
    assert "(Kafka broker) is taken" in lines[-1]


def test_a_jar_maven_cannot_resolve_is_named(tmp_path: Path) -> None:
    if jvm.find_maven() is None:
        pytest.skip("no Maven here")
    pom = tmp_path / "pom.xml"
    pom.write_text(
        (jvm.JVM_DIR / "kafka" / "pom.xml").read_text().replace("<kafka.version>", "<kafka.version>0.0.1-none")
    )
    engine = jvm.Engine("kafka", "Apache Kafka 0.0.1-none", "0.0.1-none", pom=pom)
    s = Settings(state_dir=tmp_path, jvm_cache=str(tmp_path / "cache"))
    seen: list[str] = []
    with pytest.raises(jvm.JvmError) as err:
        jvm.classpath(s, engine, seen.append)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("Maven could not resolve Apache Kafka 0.0.1-none")
    assert "kafka_2.13" in msg and "0.0.1-none" in msg
    assert seen and "resolving Apache Kafka 0.0.1-none from Maven Central" in seen[0]


def test_a_cached_classpath_is_used_without_maven_and_a_stale_one_is_not(tmp_path: Path) -> None:
    jar = tmp_path / "a.jar"
    jar.write_bytes(b"PK")
    s = Settings(state_dir=tmp_path, jvm_cache=str(tmp_path / "cache"))
    engine = jvm.kafka_engine()
    path = jvm.cache_file(s, engine)
    path.parent.mkdir(parents=True)
    path.write_text(str(jar))
    assert jvm.cached_classpath(s, engine) == str(jar)
    jar.unlink()
    assert jvm.cached_classpath(s, engine) is None


def test_the_embedded_broker_and_docker_compose_share_their_broker_settings() -> None:
    shared = embedded_kafka.read_properties(embedded_kafka.BROKER_PROPERTIES)
    node = embedded_kafka.server_properties(Settings())
    assert {k: node[k] for k in shared} == shared, "the embedded broker overrides a shared setting"
    assert not set(shared) & set(embedded_kafka.NODE_KEYS)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    kafka = compose["services"]["kafka"]
    assert kafka["image"] == f"apache/kafka:{jvm.kafka_engine().version}", "compose runs another Kafka release"
    mounts = [v for v in kafka["volumes"] if "broker.properties" in v]
    assert mounts == ["./connectors/jvm/kafka/broker.properties:/mnt/shared/config/server.properties:ro"]
    as_env = {k.removeprefix("KAFKA_").lower().replace("_", ".") for k in kafka["environment"]}
    assert not as_env & set(shared), f"compose overrides {sorted(as_env & set(shared))}"
    image = compose["services"]["neo4j"]["image"]
    assert image == f"neo4j:{jvm.neo4j_engine().version}-community", "compose runs another Neo4j release"


def test_the_state_directory_keeps_the_broker_its_log_was_written_to(tmp_path: Path) -> None:
    s = Settings.from_env({"TASKSTREAM_STATE_DIR": str(tmp_path), "TASKSTREAM_BROKER": "noida"})
    engines.record(engines.choose(s).settings)
    assert engines.choose(Settings.from_env({"TASKSTREAM_STATE_DIR": str(tmp_path)})).settings.broker == "noida"
    other = engines.choose(Settings.from_env({"TASKSTREAM_STATE_DIR": str(tmp_path), "TASKSTREAM_BROKER": "kafka"}))
    with pytest.raises(engines.EngineError) as err:
        engines.check_record(other.settings)
    assert "holds a noida log" in str(err.value) and "TASKSTREAM_BROKER=noida" in str(err.value)


def test_kafka_and_neo4j_are_the_default_where_a_jvm_runs(tmp_path: Path) -> None:
    if why := jvm_problem():
        pytest.skip(f"no JVM here: {why}")
    choice = engines.choose(Settings.from_env({"TASKSTREAM_STATE_DIR": str(tmp_path)}))
    assert (choice.settings.broker, choice.settings.graph_backend, choice.note) == ("kafka", "neo4j", "")


def test_the_first_up_shows_jar_resolution_and_later_ones_need_no_maven(tmp_path: Path) -> None:
    """A fresh classpath cache: `up` resolves both engines through Maven, saying so. Then, with Maven
    gone from PATH, the cached classpaths are enough. (A taken port stops `up` before it starts
    anything, after the JVM side is ready.)"""
    import os
    import shutil

    if why := jvm_problem():
        pytest.skip(f"no JVM here: {why}")
    env = {**stack_env(tmp_path / "state"), "TASKSTREAM_JVM_CACHE": str(tmp_path / "cache")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", int(env["TASKSTREAM_NEO4J_PORT"])))
        taken.listen()
        first = taskstream(env, "up", check=False, timeout=600)
        assert first.returncode == 1 and "(Neo4j Bolt) is taken" in first.stderr, first.stderr
        for label in (jvm.kafka_engine().label, jvm.neo4j_engine().label):
            assert f"resolving {label} from Maven Central" in first.stdout, first.stdout
            assert f"resolved {label}" in first.stdout
        # Maven now fails if asked at all (and says so in a file): the cache must be enough
        shim = tmp_path / "bin"
        shim.mkdir()
        called = tmp_path / "mvn-was-called"
        (shim / "mvn").write_text(f"#!/bin/sh\ntouch {called}\nexit 1\n")
        (shim / "mvn").chmod(0o755)
        later_env = {**env, "PATH": f"{shim}{os.pathsep}{env['PATH']}"}
        assert shutil.which("mvn", path=later_env["PATH"]) == str(shim / "mvn")
        later = taskstream(later_env, "up", check=False, timeout=120)
    assert later.returncode == 1 and "(Neo4j Bolt) is taken" in later.stderr, later.stderr
    assert not called.exists(), "Maven was run although every jar was cached"
    assert "resolving" not in later.stdout


def test_a_new_cluster_id_is_kafka_s_format_and_never_reads_as_an_option() -> None:
    """The storage tool takes `-t -abc...` for a missing value: one random id in 64 starts with '-'."""
    ids = [embedded_kafka.new_cluster_id() for _ in range(5000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)
    assert len(set(ids)) == len(ids)
    assert any("-" in i for i in ids)  # '-' stays a valid character elsewhere in the id


def test_a_new_neo4j_password_never_reads_as_an_option_to_neo4j_admin() -> None:
    """`neo4j-admin dbms set-initial-password -8g...` printed its usage: one random password in 64
    starts with '-' (a CI run's stack failed to start so)."""
    from taskstream.connectors import embedded_neo4j

    pws = [embedded_neo4j.new_password() for _ in range(5000)]
    assert all(len(p) == 32 and not p.startswith("-") for p in pws)
    assert len(set(pws)) == len(pws) and any("-" in p for p in pws)


def test_a_stored_cluster_id_is_kept_unless_it_starts_with_a_dash(tmp_path: Path) -> None:
    s = Settings(state_dir=tmp_path)
    first = embedded_kafka.cluster_id(s)
    assert embedded_kafka.cluster_id(s) == first
    (embedded_kafka.home(s) / "cluster-id").write_text("-bad0123456789abcdefgh\n")
    again = embedded_kafka.cluster_id(s)
    assert not again.startswith("-") and embedded_kafka.cluster_id(s) == again


@pytest.mark.parametrize("jit", ["quick", "full", None])
def test_the_embedded_engines_compile_with_c2_unless_told_quick(tmp_path: Path, jit: str | None) -> None:
    """TASKSTREAM_JVM_JIT: "full" (the default) leaves both JVMs their tiered compilation, C2 included;
    "quick" stops them at the first tier, for a stack that lives minutes (docs/measurements.md)."""
    from taskstream.connectors import embedded_neo4j

    from taskstream.settings import SettingsError

    jar = tmp_path / "a.jar"
    jar.write_bytes(b"PK")
    env = {"TASKSTREAM_STATE_DIR": str(tmp_path), "TASKSTREAM_JVM_CACHE": str(tmp_path / "cache")}
    env["TASKSTREAM_JAVA"] = str(fake_java(tmp_path, 'openjdk version "17.0.15" 2025-04-15'))
    if jit is not None:
        env["TASKSTREAM_JVM_JIT"] = jit
    s = Settings.from_env(env)
    for engine in (jvm.kafka_engine(), jvm.neo4j_engine()):
        path = jvm.cache_file(s, engine)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(str(jar))
    for argv in (embedded_kafka.java_argv(s, "kafka.Kafka", server=True), embedded_neo4j.java_argv(s, "Main")):
        assert ("-XX:TieredStopAtLevel=1" in argv) == (jit == "quick"), argv
        assert argv.index("-cp") > max((i for i, a in enumerate(argv) if a.startswith("-XX:")), default=0)
    with pytest.raises(SettingsError, match="TASKSTREAM_JVM_JIT='c2': expected 'quick'"):
        Settings.from_env({**env, "TASKSTREAM_JVM_JIT": "c2"})
