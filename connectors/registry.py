"""A small schema registry serving the subset of the Confluent REST API that
`confluent_kafka.schema_registry` uses, with real compatibility checks (Apache avro's checker).

It is the embedded default; in production point TASKSTREAM_REGISTRY_URL at Confluent Schema Registry.
State is one JSON file, rewritten atomically on every change. Listens on loopback unless told otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

log = logging.getLogger(__name__)

LEVELS = {"NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE"}


class RegistryError(Exception):
    def __init__(self, status: int, code: int, message: str) -> None:
        self.status, self.code, self.message = status, code, message
        super().__init__(message)


def _normal(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def _compatible(reader: str, writer: str) -> tuple[bool, str]:
    result = ReaderWriterCompatibilityChecker().get_compatibility(avro.schema.parse(reader), avro.schema.parse(writer))
    ok = result.compatibility is SchemaCompatibilityType.compatible
    return ok, "; ".join(f"{m} at {'/'.join(loc)}" for m, loc in zip(result.messages, result.locations, strict=False))


class RegistryState:
    """Subjects, versions and ids, with Confluent's semantics for the calls we serve. Thread-safe."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.schemas: dict[int, str] = {}
        self.subjects: dict[str, list[dict[str, Any]]] = {}
        self.config: dict[str, str] = {"": "BACKWARD"}
        if path is not None and path.exists():
            raw = json.loads(path.read_text())
            self.schemas = {int(k): v for k, v in raw["schemas"].items()}
            self.subjects = raw["subjects"]
            self.config = raw["config"]

    def _save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"schemas": self.schemas, "subjects": self.subjects, "config": self.config}))
        os.replace(tmp, self.path)

    def _live(self, subject: str) -> list[dict[str, Any]]:
        versions = [v for v in self.subjects.get(subject, []) if not v.get("deleted")]
        if not versions:
            raise RegistryError(404, 40401, f"Subject '{subject}' not found.")
        return versions

    def level(self, subject: str | None) -> str:
        return self.config.get(subject or "", self.config[""])

    def _check(self, subject: str, text: str, against: list[dict[str, Any]]) -> list[str]:
        level = self.level(subject)
        if level == "NONE" or not against:
            return []
        previous = against if level.endswith("TRANSITIVE") else against[-1:]
        problems = []
        for v in previous:
            old = self.schemas[v["id"]]
            if level.startswith(("BACKWARD", "FULL")):
                ok, why = _compatible(text, old)
                if not ok:
                    problems.append(f"new schema cannot read data written with version {v['version']}: {why}")
            if level.startswith(("FORWARD", "FULL")):
                ok, why = _compatible(old, text)
                if not ok:
                    problems.append(f"version {v['version']} cannot read data written with the new schema: {why}")
        return problems

    def register(self, subject: str, text: str) -> int:
        try:
            avro.schema.parse(text)
        except Exception as exc:
            raise RegistryError(422, 42201, f"Invalid schema: {exc}") from exc
        norm = _normal(text)
        with self.lock:
            versions = [v for v in self.subjects.get(subject, []) if not v.get("deleted")]
            for v in versions:
                if _normal(self.schemas[v["id"]]) == norm:
                    return int(v["id"])
            problems = self._check(subject, text, versions)
            if problems:
                raise RegistryError(
                    409,
                    409,
                    "Schema being registered is incompatible with an earlier schema for "
                    f'subject "{subject}" ({self.level(subject)}): ' + "; ".join(problems),
                )
            sid = next((i for i, s in self.schemas.items() if _normal(s) == norm), None)
            if sid is None:
                sid = max(self.schemas, default=0) + 1
                self.schemas[sid] = text
            all_versions = self.subjects.setdefault(subject, [])
            all_versions.append({"version": max((v["version"] for v in all_versions), default=0) + 1, "id": sid})
            self._save()
            return sid

    def lookup(self, subject: str, text: str) -> dict[str, Any]:
        norm = _normal(text)
        with self.lock:
            for v in self._live(subject):
                if _normal(self.schemas[v["id"]]) == norm:
                    return {"subject": subject, "version": v["version"], "id": v["id"], "schema": self.schemas[v["id"]]}
        raise RegistryError(404, 40403, "Schema not found")

    def version(self, subject: str, version: str) -> dict[str, Any]:
        with self.lock:
            versions = self._live(subject)
            if version in ("latest", "-1"):
                v = versions[-1]
            else:
                found = [x for x in versions if str(x["version"]) == version]
                if not found:
                    raise RegistryError(404, 40402, f"Version {version} not found.")
                v = found[0]
            return {"subject": subject, "version": v["version"], "id": v["id"], "schema": self.schemas[v["id"]]}

    def compatibility(self, subject: str, version: str | None, text: str) -> dict[str, Any]:
        with self.lock:
            versions = [v for v in self.subjects.get(subject, []) if not v.get("deleted")]
            if version not in (None, "latest", "-1"):
                versions = [v for v in versions if str(v["version"]) == version]
            problems = self._check(subject, text, versions)
        return {"is_compatible": not problems, "messages": problems}

    def delete_subject(self, subject: str) -> list[int]:
        with self.lock:
            versions = self._live(subject)
            for v in versions:
                v["deleted"] = True
            self._save()
            return [v["version"] for v in versions]


def _handler(state: RegistryState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("registry: " + fmt, *args)

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except json.JSONDecodeError as exc:
                raise RegistryError(422, 42201, f"request body is not JSON: {exc}") from exc
            if not isinstance(body, dict):
                raise RegistryError(422, 42201, "request body must be a JSON object")
            return body

        def _schema_of(self, body: dict[str, Any]) -> str:
            if body.get("schemaType", "AVRO") != "AVRO":
                raise RegistryError(422, 42201, f"only AVRO schemas are served here, got {body.get('schemaType')}")
            if body.get("references"):
                raise RegistryError(422, 42201, "schema references are not supported by the embedded registry")
            text = body.get("schema")
            if not isinstance(text, str):
                raise RegistryError(422, 42201, "field 'schema' (a JSON string) is required")
            return text

        def _route(self, method: str) -> None:
            url = urlparse(self.path)
            parts = [unquote(p) for p in url.path.strip("/").split("/") if p]
            q = parse_qs(url.query)
            try:
                status, body = self._dispatch(method, parts, q)
            except RegistryError as err:
                status, body = err.status, {"error_code": err.code, "message": err.message}
            except Exception as exc:  # a bug here must answer, not hang the client
                log.exception("registry request failed")
                status, body = 500, {"error_code": 50001, "message": f"{type(exc).__name__}: {exc}"}
            self._send(status, body)

        def _dispatch(self, method: str, p: list[str], q: dict[str, list[str]]) -> tuple[int, Any]:
            ok = HTTPStatus.OK
            match method, p:
                case "GET", []:
                    return ok, {}
                case "GET", ["subjects"]:
                    return ok, sorted(s for s, vs in state.subjects.items() if any(not v.get("deleted") for v in vs))
                case "GET", ["schemas", "types"]:
                    return ok, ["AVRO"]
                case "GET", ["schemas", "ids", sid]:
                    text = state.schemas.get(int(sid)) if sid.isdigit() else None
                    if text is None:
                        raise RegistryError(404, 40403, f"Schema {sid} not found")
                    return ok, {"schema": text}
                case "GET", ["schemas", "ids", sid, "subjects"]:
                    return ok, sorted(s for s, vs in state.subjects.items() if any(str(v["id"]) == sid for v in vs))
                case "GET", ["subjects", subject, "versions"]:
                    return ok, [v["version"] for v in state._live(subject)]
                case "GET", ["subjects", subject, "versions", version]:
                    return ok, state.version(subject, version)
                case "GET", ["subjects", subject, "versions", version, "schema"]:
                    return ok, json.loads(state.version(subject, version)["schema"])
                case "POST", ["subjects", subject, "versions"]:
                    return ok, {"id": state.register(subject, self._schema_of(self._body()))}
                case "POST", ["subjects", subject]:
                    return ok, state.lookup(subject, self._schema_of(self._body()))
                case "DELETE", ["subjects", subject]:
                    return ok, state.delete_subject(subject)
                case "POST", ["compatibility", "subjects", subject, "versions", *rest]:
                    return ok, state.compatibility(subject, rest[0] if rest else None, self._schema_of(self._body()))
                case "GET", ["config"]:
                    return ok, {"compatibilityLevel": state.level(None)}
                case "GET", ["config", subject]:
                    return ok, {"compatibilityLevel": state.level(subject)}
                case "PUT", ["config", *subject]:
                    level = str(self._body().get("compatibility", "")).upper()
                    if level not in LEVELS:
                        raise RegistryError(422, 42203, f"Invalid compatibility level {level!r}")
                    with state.lock:
                        state.config[subject[0] if subject else ""] = level
                        state._save()
                    return ok, {"compatibility": level}
            raise RegistryError(404, 404, f"{method} /{'/'.join(p)} is not served by the embedded registry")

        def do_GET(self) -> None:  # noqa: N802
            self._route("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._route("POST")

        def do_PUT(self) -> None:  # noqa: N802
            self._route("PUT")

        def do_DELETE(self) -> None:  # noqa: N802
            self._route("DELETE")

    return Handler


def make_server(host: str, port: int, state_file: Path | None) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), _handler(RegistryState(state_file)))
    server.daemon_threads = True
    return server


def serve(host: str, port: int, state_file: Path) -> None:
    server = make_server(host, port, state_file)
    log.info("schema registry on http://%s:%d", host, server.server_address[1])
    server.serve_forever()
