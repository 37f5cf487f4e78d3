"""The supervisor: starts the embedded stack's services as child processes under the state directory,
waits for each to be ready, restarts any that die, and stops them in reverse order on SIGTERM.

`taskstream up` launches it detached and waits for its status file to say ready (or why not);
`taskstream down` signals it and waits for it to finish.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskstream.connectors import services as sv
from taskstream.connectors.keeper import pid_alive as pid_alive  # the CLI asks the supervisor module
from taskstream.settings import Settings

log = logging.getLogger("taskstream.supervisor")
INFRA = {"broker", "postgres", "registry", "neo4j"}  # started together, before bootstrap


def status_file(settings: Settings) -> Path:
    return sv.run_dir(settings) / "supervisor.json"


def read_status(settings: Settings) -> dict[str, Any] | None:
    try:
        return json.loads(status_file(settings).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _die_with_parent() -> None:
    """Child pre-exec hook: get SIGTERM if the supervisor dies, so no service is orphaned."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Child:
    spec: sv.ServiceSpec
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    started: float = 0.0


class Supervisor:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.children: list[Child] = []
        self.stopping = False
        self.status: dict[str, Any] = {"pid": os.getpid(), "status": "starting", "error": "", "services": {}}

    # -- status -------------------------------------------------------------------------------------
    def _write(self, **changes: Any) -> None:
        self.status.update(changes)
        self.status["services"] = {
            c.spec.name: {
                "pid": c.proc.pid if c.proc else None,
                "restarts": c.restarts,
                "log": str(sv.log_dir(self.settings) / f"{c.spec.name}.log"),
            }
            for c in self.children
        }
        path = status_file(self.settings)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.status, indent=2))
        os.replace(tmp, path)

    # -- children -----------------------------------------------------------------------------------
    def _spawn(self, child: Child) -> None:
        spec = child.spec
        sv.ready_file(self.settings, spec.name).unlink(missing_ok=True)
        logf = open(sv.log_dir(self.settings) / f"{spec.name}.log", "ab")  # noqa: SIM115 - child owns it
        env = {**os.environ, **self.settings.env(), **spec.env, "PYTHONUNBUFFERED": "1"}
        child.proc = subprocess.Popen(  # noqa: S603 - argv list built by services.py
            spec.argv,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.settings.state_dir,
            preexec_fn=_die_with_parent,
        )
        logf.close()
        child.started = time.monotonic()
        log.info("started %s (pid %d)", spec.name, child.proc.pid)
        self._write()

    def _wait_ready(self, child: Child) -> None:
        deadline = time.monotonic() + child.spec.ready_timeout
        while time.monotonic() < deadline and not self.stopping:
            assert child.proc is not None
            if child.proc.poll() is not None:
                raise sv.ServiceError(
                    f"{child.spec.name} exited with status {child.proc.returncode} while starting: "
                    f"{self._log_tail(child.spec.name)}"
                )
            if child.spec.ready():
                log.info("%s is ready (%.1fs)", child.spec.name, time.monotonic() - child.started)
                return
            time.sleep(0.2)
        if not self.stopping:
            raise sv.ServiceError(
                f"{child.spec.name} was not ready within {child.spec.ready_timeout:.0f}s: "
                f"{self._log_tail(child.spec.name)}"
            )

    def _log_tail(self, name: str) -> str:
        try:
            lines = (sv.log_dir(self.settings) / f"{name}.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        useful = [ln for ln in lines if ln.strip()][-3:]
        return " | ".join(useful) or "(empty log)"

    def _stop_child(self, child: Child) -> None:
        proc = child.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM if child.spec.name != "postgres" else signal.SIGINT)  # SIGINT: fast shutdown
        try:
            proc.wait(child.spec.stop_timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in %.0fs; killing it", child.spec.name, child.spec.stop_timeout)
            proc.kill()
            proc.wait()
        log.info("stopped %s", child.spec.name)

    # -- main ---------------------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stopping = True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            specs = sv.embedded_specs(self.settings)
            self.children = [Child(s) for s in specs]
            self._write()
            infra = [c for c in self.children if c.spec.name in INFRA]
            services = [c for c in self.children if c.spec.name not in INFRA]
            # Each group is started at once and then waited for: the two JVMs take seconds to start,
            # and the Python services a second of CPU each; in sequence that adds up at every `up`.
            for group in (infra, services):
                if self.stopping:
                    break
                if group is services:
                    from taskstream.connectors.bootstrap import bootstrap

                    bootstrap(self.settings)
                for child in group:
                    if child.spec.prepare and not self.stopping:
                        child.spec.prepare()
                    if not self.stopping:
                        self._spawn(child)
                for child in group:
                    if child.proc is not None:
                        self._wait_ready(child)
            if not self.stopping:
                self._write(status="ready")
                log.info("taskstream is up")
            self._watch()
        except Exception as exc:
            log.exception("start-up failed")
            self._write(status="failed", error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            self.stopping = True
        self._write(status="stopping")
        for child in reversed(self.children):
            self._stop_child(child)
        failed = self.status.get("error")
        self._write(status="failed" if failed else "stopped")
        return 1 if failed else 0

    def _watch(self) -> None:
        while not self.stopping:
            now = time.monotonic()
            for child in self.children:
                proc = child.proc
                if proc is not None and proc.poll() is not None and not self.stopping:
                    log.error(
                        "%s exited with status %s: %s",
                        child.spec.name,
                        proc.returncode,
                        self._log_tail(child.spec.name),
                    )
                    child.proc = None
                    child.restarts += 1
                    # quick restart first, then back off up to 30 s between attempts
                    up_for = now - child.started
                    delay = 0.5 if up_for > 60 else min(30.0, 0.5 * 2 ** min(child.restarts, 6))
                    child.next_start = now + delay
                    self._write()
                if child.proc is None and now >= child.next_start and not self.stopping:
                    log.info("restarting %s (restart %d)", child.spec.name, child.restarts)
                    self._spawn(child)
            time.sleep(0.3)


def main(settings: Settings) -> int:
    for d in (sv.run_dir(settings), sv.log_dir(settings)):
        d.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return Supervisor(settings).run()
