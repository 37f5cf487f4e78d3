"""The JVM side of the embedded stack: which Java runs it, and each engine's classpath.

Apache Kafka and Neo4j are not vendored: `connectors/jvm/<engine>/pom.xml` pins a release, Maven resolves
its runtime classpath from Maven Central into Maven's local repository (~/.m2 unless TASKSTREAM_MAVEN_REPO
says otherwise), and the resolved classpath is cached under TASKSTREAM_JVM_CACHE (~/.cache/taskstream),
keyed by the pom's digest. A later start whose jars are all still there needs neither Maven nor the
network. Every failure is a `JvmError` whose message is one line naming what is missing.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from taskstream.connectors.keeper import pid_alive

from taskstream.settings import Settings

JVM_DIR = Path(__file__).resolve().parent / "jvm"
MIN_JAVA = 17  # Kafka 4 brokers and Neo4j 5.26 both need Java 17 or newer
# Pinned, so a resolution does not depend on the plugin version a Maven installation defaults to.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
MAVEN_TIMEOUT_S = 900.0

Progress = Callable[[str], None]


class JvmError(RuntimeError):
    """The JVM side cannot start; the message is one line naming what is wrong."""


@dataclass(frozen=True)
class Java:
    path: str
    version: int  # the feature release: 17, 21, 25


@dataclass(frozen=True)
class Engine:
    name: str  # the folder under connectors/jvm/
    label: str  # for people: "Apache Kafka 4.1.1"
    version: str
    pom: Path = Path()  # default: connectors/jvm/<name>/pom.xml

    def __post_init__(self) -> None:
        if self.pom == Path():
            object.__setattr__(self, "pom", JVM_DIR / self.name / "pom.xml")


def _pom_version(name: str, prop: str) -> str:
    text = (JVM_DIR / name / "pom.xml").read_text()
    found = re.search(rf"<{re.escape(prop)}>([^<]+)</{re.escape(prop)}>", text)
    if found is None:
        raise JvmError(f"{JVM_DIR / name / 'pom.xml'} pins no <{prop}>")
    return found.group(1).strip()


def kafka_engine() -> Engine:
    version = _pom_version("kafka", "kafka.version")
    return Engine("kafka", f"Apache Kafka {version}", version)


def neo4j_engine() -> Engine:
    version = _pom_version("neo4j", "neo4j.version")
    return Engine("neo4j", f"Neo4j community {version}", version)


# ---- Java ---------------------------------------------------------------------------------------------


def java_candidate(settings: Settings) -> tuple[str | None, str]:
    """The java binary to use and where it was found (for messages)."""
    if settings.java:
        return settings.java, "TASKSTREAM_JAVA"
    home = os.environ.get("JAVA_HOME")
    if home:
        return str(Path(home) / "bin" / "java"), "JAVA_HOME"
    return shutil.which("java"), "PATH"


def parse_java_version(text: str) -> int | None:
    """The feature release from `java -version` output: 'version "17.0.15"' -> 17, '"1.8.0_412"' -> 8."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def find_java(settings: Settings) -> Java:
    path, where = java_candidate(settings)
    if not path or not Path(path).is_file():
        raise JvmError(
            f"no Java found (looked at {where}{': ' + path if path else ''}): Apache Kafka and Neo4j need "
            f"Java {MIN_JAVA} or newer; install one or set TASKSTREAM_JAVA"
        )
    try:
        done = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=30, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JvmError(f"cannot run {path} -version: {exc}") from exc
    version = parse_java_version(done.stderr + done.stdout)
    if version is None:
        raise JvmError(f"{path} (from {where}) did not say its version: {(done.stderr or done.stdout).strip()[:120]}")
    if version < MIN_JAVA:
        raise JvmError(
            f"Java {version} at {path} (from {where}) is too old: Apache Kafka 4 and Neo4j 5.26 need Java "
            f"{MIN_JAVA} or newer; set TASKSTREAM_JAVA to a newer one"
        )
    return Java(path, version)


def find_maven() -> str | None:
    return shutil.which("mvn")


# ---- classpaths -----------------------------------------------------------------------------------------


def cache_file(settings: Settings, engine: Engine) -> Path:
    digest = hashlib.sha256(engine.pom.read_bytes()).hexdigest()[:16]
    repo = hashlib.sha256(settings.maven_repo.encode()).hexdigest()[:8]  # another repository, other paths
    return settings.jvm_cache_dir / f"{engine.name}-{engine.version}-{digest}-{repo}.classpath"


def cached_classpath(settings: Settings, engine: Engine) -> str | None:
    """The cached classpath if every jar on it is still there, else None."""
    try:
        text = cache_file(settings, engine).read_text().strip()
    except OSError:
        return None
    jars = text.split(os.pathsep) if text else []
    if not jars or not all(Path(j).is_file() for j in jars):
        return None
    return text


def classpath(settings: Settings, engine: Engine, progress: Progress | None = None) -> str:
    """The engine's runtime classpath: from the cache, else resolved by Maven (and cached)."""
    cached = cached_classpath(settings, engine)
    if cached is not None:
        return cached
    mvn = find_maven()
    if mvn is None:
        raise JvmError(
            f"Maven (mvn) is not installed, and the jars of {engine.label} were not resolved before: "
            "install Maven, or set TASKSTREAM_BROKER=noida TASKSTREAM_GRAPH_BACKEND=ladybug"
        )
    out = cache_file(settings, engine)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{engine.name}-", suffix=".tmp")
    os.close(fd)
    argv = [mvn, "-B", "-f", str(engine.pom)]
    if settings.maven_repo:
        argv.append(f"-Dmaven.repo.local={settings.maven_repo}")
    argv += [f"{DEPENDENCY_PLUGIN}:build-classpath", f"-Dmdep.outputFile={tmp}", "-Dmdep.includeScope=runtime"]
    try:
        lines = _run_maven(argv, engine, progress)
        text = Path(tmp).read_text().strip()
        if not text:
            raise JvmError(f"Maven resolved no jars for {engine.label}: {_maven_error(lines)}")
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return text


def _run_maven(argv: list[str], engine: Engine, progress: Progress | None) -> list[str]:
    """Run Maven, reporting downloads as they happen; the lines it printed. Raises on failure."""
    downloaded = 0
    lines: list[str] = []
    started = time.monotonic()
    if progress:
        progress(f"resolving {engine.label} from Maven Central (first start; later ones use the cache)")
    try:
        proc = subprocess.Popen(  # noqa: S603 - argv list
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True
        )
    except OSError as exc:
        raise JvmError(f"cannot run Maven ({argv[0]}): {exc}") from exc
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if line.startswith("Downloaded from") or "] Downloaded from" in line:
            downloaded += 1
            if progress:
                progress(f"resolving {engine.label} from Maven Central: {downloaded} file(s) downloaded")
    try:
        code = proc.wait(MAVEN_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        raise JvmError(f"Maven did not resolve {engine.label} within {MAVEN_TIMEOUT_S:.0f}s") from exc
    if code != 0:
        raise JvmError(f"Maven could not resolve {engine.label}: {_maven_error(lines)}")
    if progress:
        took = time.monotonic() - started
        progress(f"resolved {engine.label} in {took:.0f}s ({downloaded} file(s) downloaded)")
    return lines


def _maven_error(lines: list[str]) -> str:
    """The one line of Maven's output that says what went wrong."""
    errors = [ln.removeprefix("[ERROR]").strip() for ln in lines if ln.startswith("[ERROR]")]
    errors = [e for e in errors if e and not e.startswith(("->", "To see", "Re-run", "For more", "[Help"))]
    for e in errors:
        found = re.search(r"(Could not resolve dependencies.*|The following artifacts could not be resolved.*)", e)
        if found:
            return found.group(1)[:400]
    return (errors[0] if errors else (lines[-1] if lines else "no output"))[:400]


def jit_options(settings: Settings) -> list[str]:
    """The JIT compiler options of an embedded engine's JVM (Settings.jvm_jit). "full" (the default):
    the JVM's own tiered compilation. "quick": C1 only, which spares a short-lived stack C2's compiling
    (on 2 cores its threads took about half of both servers' CPU in a stack's first minutes) at the
    price of ~25-30% more of the broker's CPU per task once a stack has been up a while
    (docs/measurements.md)."""
    return ["-XX:TieredStopAtLevel=1"] if settings.jvm_jit == "quick" else []


# ---- class data sharing ---------------------------------------------------------------------------------


def class_data_options(settings: Settings, engine: Engine, java: Java, cp: str) -> list[str]:
    """JVM options for an application class-data archive (AppCDS): the engine's classes, parsed once and
    mapped at later starts. Measured here: Neo4j ready in 4.4 s instead of 5.9-7.5 s, Kafka in 3.5 s
    instead of 4.3 s. The first start writes the archive when its JVM exits normally (a few seconds
    more at that `down`), under a name of its own; the next start moves a finished one into place.
    An archive that does not match (another JDK, a changed classpath) is ignored by the JVM."""
    key = hashlib.sha256(f"{java.path}|{java.version}|{cp}".encode()).hexdigest()[:16]
    cache = settings.jvm_cache_dir
    final = cache / f"{engine.name}-{key}.jsa"
    for done in sorted(cache.glob(f"{engine.name}-{key}.*.jsa.part")):
        pid = int(done.name.split(".")[-3]) if done.name.split(".")[-3].isdigit() else 0
        if pid and pid_alive(pid):
            continue  # still being written by a running JVM
        if not final.exists() and done.stat().st_size > 0:
            os.replace(done, final)
        else:
            done.unlink(missing_ok=True)
    if final.exists():
        return [f"-XX:SharedArchiveFile={final}", "-Xshare:auto"]
    cache.mkdir(parents=True, exist_ok=True)
    # Named after the process that starts the JVM (the supervisor), which outlives it: a part file whose
    # starter is gone was finished, or abandoned by a JVM that was killed (then the JVM rejects it).
    return [f"-XX:ArchiveClassesAtExit={cache / f'{engine.name}-{key}.{os.getpid()}.jsa.part'}"]


def ensure(settings: Settings, engine: Engine, progress: Progress | None = None) -> tuple[Java, str]:
    """Java and the engine's classpath, or a JvmError saying what is missing."""
    java = find_java(settings)
    return java, classpath(settings, engine, progress)
