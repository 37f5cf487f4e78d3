"""Avro in the Confluent wire format (magic byte, 4-byte schema id, body), over fastavro.

Writers register the envelope schema of each topic with the registry once and reuse the id. Readers
look the writer's schema up by id (cached) and resolve it against the reader schema shipped here, so
older and newer writers both decode. Anything that does not decode raises DecodeError with the reason;
callers route those bytes to the dead-letter topic.
"""

from __future__ import annotations

import dataclasses
import io
import json
import struct
import time
from collections.abc import Callable
from functools import cache
from importlib.resources import as_file, files
from typing import Any, cast

import fastavro
import fastavro.schema
from taskstream.schemas import records as r

from taskstream.core.events import TaskSubmitted
from taskstream.core.model import Backoff, Call, Resources, TaskSpec

MAGIC = 0
ENVELOPES = {
    "command": "io.taskstream.Command",
    "event": "io.taskstream.TaskEvent",
    "input": "io.taskstream.TaskInput",
    "queued": "io.taskstream.QueuedTask",
}


class CodecError(Exception):
    """Base for everything the codec refuses."""


class DecodeError(CodecError):
    """Bytes that are not a message we can read. `reason` says why, for the dead-letter headers."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class UnknownSchemaError(DecodeError):
    pass


@cache
def schema_text(envelope: str) -> str:
    """The self-contained JSON schema of an envelope (named types inlined), as registered."""
    path = files("taskstream.schemas").joinpath("avro", f"{ENVELOPES[envelope]}.avsc")
    with as_file(path) as p:  # named types resolve from sibling files, so this must be a real path
        loaded = fastavro.schema.load_schema(str(p), _write_hint=False)
    return json.dumps(loaded, separators=(",", ":"))


@cache
def parsed(envelope: str) -> Any:
    return fastavro.parse_schema(json.loads(schema_text(envelope)))


# ---- Python objects <-> Avro-shaped dicts ----------------------------------------------------------


_SCALAR, _SEQUENCE, _MAPPING = "scalar", "sequence", "mapping"
# type -> how to make it Avro-shaped: a dataclass's field names, or one of the kinds above. Cached per
# type: admission converts tens of thousands of records per submission, and dataclasses.fields() per
# value was most of the cost of encoding (measured in bench/admission_bench.py).
_SHAPES: dict[type, Any] = {
    **dict.fromkeys((str, int, float, bool, bytes, type(None)), _SCALAR),
    tuple: _SEQUENCE,
    list: _SEQUENCE,
    dict: _MAPPING,
}
_RESOURCES_SHAPE = "resources"
_SHAPES[Resources] = _RESOURCES_SHAPE


def _shape(t: type) -> Any:
    if dataclasses.is_dataclass(t):
        shape: Any = tuple(f.name for f in dataclasses.fields(t))
    elif issubclass(t, tuple | list):
        shape = _SEQUENCE
    elif issubclass(t, dict):
        shape = _MAPPING
    else:
        shape = _SCALAR
    _SHAPES[t] = shape
    return shape


def _plain(value: Any) -> Any:
    shape = _SHAPES.get(type(value)) or _shape(type(value))
    if shape is _SCALAR:
        return value
    if shape is _RESOURCES_SHAPE:  # its labels are pairs here and a map in Avro
        return {"cpu": value.cpu, "memory_mb": value.memory_mb, "gpu": value.gpu, "labels": dict(value.labels)}
    if shape is _SEQUENCE:
        return [_plain(v) for v in value]
    if shape is _MAPPING:
        return {k: _plain(v) for k, v in value.items()}
    return {name: _plain(getattr(value, name)) for name in shape}


_SHARED_MAX = 4096  # distinct values kept for sharing
_RESOURCES: dict[tuple[Any, ...], Resources] = {}
_BACKOFFS: dict[tuple[Any, ...], Backoff] = {}


def spec_from(d: dict[str, Any]) -> TaskSpec:
    """A TaskSpec from its decoded dict (which the decoder made fresh, so its maps are not copied).
    Equal Resources and Backoff values are shared: both are frozen, and a submission's tasks mostly
    repeat a few (admission decodes 10,000s of specs per submission)."""
    res, bo = d["resources"], d["backoff"]
    rkey = (res["cpu"], res["memory_mb"], res["gpu"], tuple(sorted(dict(res.get("labels") or {}).items())))
    resources = _RESOURCES.get(rkey)
    if resources is None:
        resources = Resources(*rkey)
        if len(_RESOURCES) < _SHARED_MAX:
            _RESOURCES[rkey] = resources
    bkey = (bo["initial_ms"], bo["factor"], bo["max_ms"], bo["jitter"])
    backoff = _BACKOFFS.get(bkey)
    if backoff is None:
        backoff = Backoff(*bkey)
        if len(_BACKOFFS) < _SHARED_MAX:
            _BACKOFFS[bkey] = backoff
    return TaskSpec(
        d["name"],
        d["tenant"],
        tuple(d["argv"]),
        d["env"],
        d["working_dir"],
        resources,
        d["execution_cap_ms"],
        d["retry_limit"],
        backoff,
        d["delay_tolerance_ms"],
        d["priority"],
        tuple(d["dependencies"]),
        d["not_before_ms"],
        d["labels"],
        _call_from(d.get("call")),
    )


def _call_from(value: Any) -> Call | None:
    """The optional Call: the decoder gives a union's record as (name, fields)."""
    if value is None:
        return None
    fields = value[1] if isinstance(value, tuple) else value
    return Call(fields["target"], fields["args_json"], fields["kwargs_json"])


def _typed(cls: type, d: dict[str, Any]) -> Any:
    kw = dict(d)
    if "spec" in kw:
        kw["spec"] = spec_from(kw["spec"])
    if cls is r.SubmitDag or cls is r.Schedule:
        kw["tasks"] = tuple(spec_from(t) for t in kw["tasks"])
    if cls is r.SubmissionRejected:
        kw["errors"] = tuple(r.FieldProblem(**p) for p in kw["errors"])
    if cls is r.TasksAdmitted:
        kw["tasks"] = tuple(
            r.AdmittedTask(
                t["task_id"], spec_from(t["spec"]), tuple(t["dependents"]), tuple(t["references"]), t["submission_id"]
            )
            for t in kw["tasks"]
        )
    if cls is r.Inputs:
        kw["items"] = tuple(from_avro("input", m) for m in kw["items"])
    if cls is r.TaskEvents:
        kw["events"] = tuple(
            r.PackedEvent(
                m["task_id"],
                m["submission_id"],
                m["version"],
                m["event_ms"],
                _branch(r.EVENT_PAYLOADS, m["payload"], "packed event"),
            )  # fmt: skip
            for m in kw["events"]
        )
    return cls(**kw)


def _branch(table: dict[str, type], value: tuple[str, dict[str, Any]], what: str) -> Any:
    name, body = value
    cls = table.get(name)
    if cls is None:
        raise DecodeError(f"{what} type {name} is not known to this version of taskstream")
    return _typed(cls, body)


_TASK_SUBMITTED = r.NS + "TaskSubmitted"
_TASKS_ADMITTED = r.NS + "TasksAdmitted"
_TASK_EVENTS = r.NS + "TaskEvents"
_SUBMIT_DAG = r.NS + "SubmitDag"
_INPUTS = r.NS + "Inputs"


_RESOURCES_AVRO: dict[Resources, dict[str, Any]] = {}
_BACKOFF_AVRO: dict[Backoff, dict[str, Any]] = {}


def _spec_avro(s: TaskSpec) -> dict[str, Any]:
    """_plain(spec), written out: the SDK and admission encode one per task (10,000s per submission).
    Sequences go as they are (fastavro writes tuples as arrays) and the nested records of equal
    Resources and Backoff values are built once; the dicts are only read by the writer."""
    res = _RESOURCES_AVRO.get(s.resources)
    if res is None:
        r_ = s.resources
        res = {"cpu": r_.cpu, "memory_mb": r_.memory_mb, "gpu": r_.gpu, "labels": dict(r_.labels)}
        if len(_RESOURCES_AVRO) < _SHARED_MAX:
            _RESOURCES_AVRO[r_] = res
    bo = _BACKOFF_AVRO.get(s.backoff)
    if bo is None:
        b_ = s.backoff
        bo = {"initial_ms": b_.initial_ms, "factor": b_.factor, "max_ms": b_.max_ms, "jitter": b_.jitter}
        if len(_BACKOFF_AVRO) < _SHARED_MAX:
            _BACKOFF_AVRO[b_] = bo
    return {
        "name": s.name,
        "tenant": s.tenant,
        "argv": s.argv,
        "env": s.env if type(s.env) is dict else dict(s.env),
        "working_dir": s.working_dir,
        "resources": res,
        "execution_cap_ms": s.execution_cap_ms,
        "retry_limit": s.retry_limit,
        "backoff": bo,
        "delay_tolerance_ms": s.delay_tolerance_ms,
        "priority": s.priority,
        "dependencies": s.dependencies,
        "not_before_ms": s.not_before_ms,
        "labels": s.labels if type(s.labels) is dict else dict(s.labels),
        "call": None if s.call is None else _call_avro(s.call),
    }


def _call_avro(c: Call) -> dict[str, Any]:
    return {"target": c.target, "args_json": c.args_json, "kwargs_json": c.kwargs_json}


def _union(obj: Any) -> tuple[str, dict[str, Any]]:
    t = type(obj)
    if t is TaskSubmitted:
        return _TASK_SUBMITTED, {"submission_id": obj.submission_id, "spec": _spec_avro(obj.spec)}
    if t is r.TasksAdmitted:
        tasks = [
            {
                "task_id": a.task_id,
                "spec": _spec_avro(a.spec),
                "dependents": a.dependents,
                "references": a.references,
                "submission_id": a.submission_id,
            }
            for a in obj.tasks
        ]
        return _TASKS_ADMITTED, {"node": obj.node, "tasks": tasks}
    if t is r.TaskEvents:
        members = [
            {
                "task_id": m.task_id,
                "submission_id": m.submission_id,
                "version": m.version,
                "event_ms": m.event_ms,
                "payload": _union(m.payload),
            }
            for m in obj.events
        ]
        return _TASK_EVENTS, {"events": members}
    if t is r.SubmitDag:
        return _SUBMIT_DAG, {
            "tenant": obj.tenant,
            "tasks": [_spec_avro(s) for s in obj.tasks],
            "idempotency_key": obj.idempotency_key,
            "labels": dict(obj.labels),
        }
    names = {
        r.CancelTaskRequest: "CancelTask",
        r.ReprioritizeTaskRequest: "ReprioritizeTask",
    }
    return r.NS + names.get(type(obj), type(obj).__name__), _plain(obj)


def to_avro(obj: Any) -> dict[str, Any]:
    """An envelope record as the dict fastavro writes (unions of records in tuple notation)."""
    if type(obj) is r.EventRecord:  # the hot path: admission writes two per task
        return {
            "event_id": obj.event_id,
            "task_id": obj.task_id,
            "submission_id": obj.submission_id,
            "version": obj.version,
            "event_ms": obj.event_ms,
            "node": obj.node,
            "payload": _union(obj.payload),
        }
    if type(obj) is r.CommandRecord:  # a SubmitDag may hold 10,000s of specs: don't convert them twice
        return {
            "command_id": obj.command_id,
            "issued_ms": obj.issued_ms,
            "body": _union(obj.body),
            "issuer": obj.issuer,
        }
    if type(obj) is r.InputRecord and type(obj.body) is r.Inputs:
        items = {"items": [to_avro(m) for m in obj.body.items]}
        return {**{k: getattr(obj, k) for k in ("input_id", "task_id", "sent_ms", "sender")}, "body": (_INPUTS, items)}
    d = _plain(obj)
    if isinstance(obj, r.EventRecord):
        d["payload"] = _union(obj.payload)
    elif isinstance(obj, r.CommandRecord | r.InputRecord):
        d["body"] = _union(obj.body)
    return d


def from_avro(envelope: str, d: dict[str, Any]) -> Any:
    if envelope == "event":
        return r.EventRecord(**{**d, "payload": _branch(r.EVENT_PAYLOADS, d["payload"], "event")})
    if envelope == "command":
        return r.CommandRecord(**{**d, "body": _branch(r.COMMAND_BODIES, d["body"], "command")})
    if envelope == "input":
        return r.InputRecord(**{**d, "body": _branch(r.INPUT_BODIES, d["body"], "input")})
    if envelope == "queued":
        return _queued(d)
    raise ValueError(envelope)


def _queued(d: dict[str, Any]) -> r.QueuedTask:
    also = tuple(_queued(m) for m in d.get("also") or ())
    return r.QueuedTask(**{**d, "spec": spec_from(d["spec"]), "also": also})


def envelope_of(obj: Any) -> str:
    for name, cls in (
        ("event", r.EventRecord),
        ("command", r.CommandRecord),
        ("input", r.InputRecord),
        ("queued", r.QueuedTask),
    ):
        if isinstance(obj, cls):
            return name
    raise TypeError(f"not an envelope record: {type(obj).__name__}")


# ---- the codec --------------------------------------------------------------------------------------

UNKNOWN_ID_RETRY_S = 30.0  # how long a schema id the registry did not know is not asked for again
SchemaFetcher = Callable[[int], str]  # schema id -> schema JSON text


class Codec:
    """Encode our envelopes with registered ids; decode anything with a known writer schema.

    `ids` maps envelope name -> registered schema id (from `register_all`). `fetch` looks up an unknown
    writer schema by id (the registry), once per id.
    """

    def __init__(self, ids: dict[str, int], fetch: SchemaFetcher) -> None:
        self.ids = dict(ids)
        self._fetch = fetch
        self._writers: dict[int, Any] = {i: parsed(env) for env, i in ids.items()}
        self._unknown: dict[int, tuple[float, str]] = {}  # schema id -> (when the registry said no, why)

    def encode(self, obj: Any) -> bytes:
        env = envelope_of(obj)
        buf = io.BytesIO()
        buf.write(struct.pack(">bI", MAGIC, self.ids[env]))
        fastavro.schemaless_writer(buf, parsed(env), to_avro(obj))
        return buf.getvalue()

    def writer_schema(self, schema_id: int) -> Any:
        w = self._writers.get(schema_id)
        if w is None:
            missed = self._unknown.get(schema_id)
            if missed is not None and time.monotonic() - missed[0] < UNKNOWN_ID_RETRY_S:
                raise UnknownSchemaError(missed[1])
            try:
                text = self._fetch(schema_id)
            except Exception as exc:  # registry said no, or is unreachable
                reason = f"schema id {schema_id} is not known to the registry ({exc})"
                # Remember the miss for a while: a flood of records with made-up ids must not turn into
                # a flood of registry requests (each cost ~60 ms of a contended CPU, measured).
                if len(self._unknown) > 10_000:
                    self._unknown.clear()
                self._unknown[schema_id] = (time.monotonic(), reason)
                raise UnknownSchemaError(reason) from exc
            try:
                w = fastavro.parse_schema(json.loads(text))
            except Exception as exc:
                raise UnknownSchemaError(f"schema id {schema_id} does not parse ({exc})") from exc
            self._writers[schema_id] = w
        return w

    def decode(self, envelope: str, data: bytes | None) -> Any:
        if data is None:
            raise DecodeError("empty message (no value)")
        if len(data) < 5:
            raise DecodeError(f"{len(data)} bytes is too short for the Confluent wire format")
        magic, schema_id = struct.unpack(">bI", data[:5])
        if magic != MAGIC:
            raise DecodeError(f"magic byte {magic} is not 0: not the Confluent wire format")
        writer = self.writer_schema(schema_id)
        try:
            d = fastavro.schemaless_reader(io.BytesIO(data[5:]), writer, parsed(envelope), return_record_name=True)
        except Exception as exc:
            raise DecodeError(
                f"body does not decode with schema id {schema_id} as {ENVELOPES[envelope]}: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            return from_avro(envelope, cast(dict[str, Any], d))
        except DecodeError:
            raise
        except Exception as exc:
            raise DecodeError(f"decoded {ENVELOPES[envelope]} has an unusable shape: {exc}") from exc
