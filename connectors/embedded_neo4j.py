"""The embedded Neo4j community server: Bolt on loopback, authentication on, everything under
`<state>/neo4j` (configuration, data, logs, the generated password).

Started from the jars Maven resolved (connectors/jvm/neo4j/pom.xml) through the server's own entry point
and admin tool, so no code of ours is compiled against Neo4j (GPLv3). The password is generated at the
first start into `<state>/neo4j/password` (mode 0600) and set with `neo4j-admin dbms
set-initial-password` before the database first starts; clients read it from there
(connectors/engines.py). HTTP is off: nothing but Bolt listens, and only on the configured host.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

from taskstream.connectors.jvm import JvmError, class_data_options, ensure, jit_options, neo4j_engine

from taskstream.settings import Settings

ENTRY_POINT = "org.neo4j.server.CommunityEntryPoint"
ADMIN_TOOL = "org.neo4j.cli.AdminTool"
# The module openings and runtime options Neo4j's own launcher passes (its default neo4j.conf).
JVM_OPTIONS = (
    "-XX:+UseG1GC",
    "-XX:-OmitStackTraceInFastThrow",
    "-XX:+UnlockExperimentalVMOptions",
    "-XX:+TrustFinalNonStaticFields",
    "-XX:+DisableExplicitGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djdk.nio.maxCachedBufferSize=1024",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dlog4j2.disable.jmx=true",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--enable-native-access=ALL-UNNAMED",
)


def home(settings: Settings) -> Path:
    return settings.state_dir / "neo4j"


def password_file(settings: Settings) -> Path:
    return home(settings) / "password"


def read_password(settings: Settings) -> str | None:
    try:
        return password_file(settings).read_text().strip() or None
    except OSError:
        return None


def config(settings: Settings) -> dict[str, str]:
    s = settings
    return {
        "server.default_listen_address": s.host,
        "server.bolt.enabled": "true",
        "server.bolt.listen_address": f"{s.host}:{s.neo4j_port}",
        "server.bolt.advertised_address": f"{s.host}:{s.neo4j_port}",
        "server.http.enabled": "false",
        "server.https.enabled": "false",
        "dbms.security.auth_enabled": "true",
        "dbms.usage_report.enabled": "false",
        "server.memory.pagecache.size": f"{s.neo4j_pagecache_mb}m",
        # Bolt's shutdown waits Netty's quiet period (5 s) twice: `down` took 10.3 s in Neo4j alone, 0.4 s
        # with none. Nothing is cut short: every transaction has ended when Bolt shuts down.
        "internal.dbms.bolt.netty_server_shutdown_quiet_period": "0",
    }


def java_argv(settings: Settings, main: str, *args: str, heap_mb: int | None = None, server: bool = False) -> list[str]:
    engine = neo4j_engine()
    java, cp = ensure(settings, engine)
    heap = heap_mb or settings.neo4j_heap_mb
    cds = class_data_options(settings, engine, java, cp) if server else []
    return [
        java.path, f"-Xmx{heap}m", f"-Xms{min(heap, 256)}m", *JVM_OPTIONS, *jit_options(settings), *cds,
        "-cp", cp, main, *args,
    ]  # fmt: skip


def new_password() -> str:
    """A fresh password for the embedded server. Never one starting with '-': `neo4j-admin dbms
    set-initial-password -8g...` takes it for an option and prints its usage (one in 64 does; seen
    once in a CI run), as the Kafka storage tool did with such a cluster id."""
    while True:
        pw = secrets.token_urlsafe(24)
        if not pw.startswith("-"):
            return pw


def prepare(settings: Settings) -> None:
    """Write the configuration; at the first start, generate the password and set it."""
    h = home(settings)
    for d in ("conf", "data", "logs", "plugins", "import", "run"):
        (h / d).mkdir(parents=True, exist_ok=True)
    lines = ["# written by taskstream at every start (connectors/embedded_neo4j.py)"]
    lines += [f"{k}={v}" for k, v in config(settings).items()]
    (h / "conf" / "neo4j.conf").write_text("\n".join(lines) + "\n")
    if (h / "data" / "dbms" / "auth.ini").exists():
        if read_password(settings) is None:
            raise JvmError(f"{password_file(settings)} is missing: the Neo4j database in {h / 'data'} has a password")
        return
    pw = read_password(settings)
    if pw is None or pw.startswith("-"):  # none yet, or one a failed first start left (never accepted)
        pw = new_password()
        path = password_file(settings)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(pw + "\n")
    argv = java_argv(settings, ADMIN_TOOL, "dbms", "set-initial-password", pw, heap_mb=256)
    run_env = {**os.environ, **env(settings)}
    done = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
    if done.returncode != 0:
        tail = [ln for ln in (done.stderr + done.stdout).strip().splitlines() if ln.strip()][-1:] or ["no output"]
        raise JvmError(f"setting the Neo4j password failed: {tail[0]}")


def argv(settings: Settings) -> list[str]:
    h = home(settings)
    return java_argv(
        settings, ENTRY_POINT, f"--home-dir={h}", f"--config-dir={h / 'conf'}", "--console-mode", server=True
    )


def env(settings: Settings) -> dict[str, str]:
    return {"NEO4J_HOME": str(home(settings)), "NEO4J_CONF": str(home(settings) / "conf")}


def ready(settings: Settings) -> bool:
    """Bolt answers a query under the generated password."""
    import neo4j

    pw = read_password(settings)
    if pw is None:
        return False
    try:
        with neo4j.GraphDatabase.driver(settings.neo4j_url, auth=(settings.neo4j_user, pw)) as driver:
            driver.execute_query("RETURN 1")
        return True
    except Exception:
        return False
