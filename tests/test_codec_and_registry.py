"""The wire contract: Avro envelopes in the Confluent format, and the embedded registry's checks."""

from __future__ import annotations

import dataclasses
import io
import json
import threading
from collections.abc import Iterator
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.schema_registry_client import Schema
from confluent_kafka.serialization import MessageField, SerializationContext
from hypothesis import given
from hypothesis import strategies as st
from taskstream.connectors.registry import make_server
from taskstream.schemas import records as r
from taskstream.schemas.codec import Codec, DecodeError, UnknownSchemaError, from_avro, schema_text, to_avro

from taskstream.core import events as e
from taskstream.core.model import Resources
from tests.strategies import specs, text


@pytest.fixture()
def registry(tmp_path) -> Iterator[SchemaRegistryClient]:  # type: ignore[no-untyped-def]
    server = make_server("127.0.0.1", 0, tmp_path / "registry.json")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield SchemaRegistryClient({"url": f"http://127.0.0.1:{server.server_address[1]}"})
    server.shutdown()


def _records_in(schema: dict) -> dict[str, list[str]]:
    """Every named record in a schema -> its field names."""
    out: dict[str, list[str]] = {}

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") == "record":
                out[node["name"].split(".")[-1]] = [f["name"] for f in node["fields"]]
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return out


def test_every_class_matches_its_avro_record_field_for_field() -> None:
    avro = {}
    for env in ("command", "event", "input", "queued"):
        avro.update(_records_in(json.loads(schema_text(env))))
    tables = {**r.EVENT_PAYLOADS, **r.INPUT_BODIES, **r.COMMAND_BODIES}
    tables.update(
        {
            r.NS + n: c
            for n, c in (
                ("TaskSpec", r.TaskSpec),
                ("TaskEvent", r.EventRecord),
                ("Command", r.CommandRecord),
                ("TaskInput", r.InputRecord),
                ("QueuedTask", r.QueuedTask),
                ("FieldProblem", r.FieldProblem),
                ("AdmittedTask", r.AdmittedTask),
                ("PackedEvent", r.PackedEvent),
            )
        }
    )
    for full, cls in tables.items():
        name = full.removeprefix(r.NS)
        assert sorted(avro[name]) == sorted(f.name for f in dataclasses.fields(cls)), name
    # the whole lifecycle named in ARCHITECTURE.md has a schema
    for needed in (
        "TaskSubmitted",
        "TaskAdmitted",
        "TaskRejected",
        "TaskReady",
        "TaskQueued",
        "TaskClaimed",
        "TaskStarted",
        "TaskHeartbeat",
        "TaskSucceeded",
        "TaskFailed",
        "TaskRetryScheduled",
        "TaskTimedOut",
        "TaskCancelled",
        "TaskReprioritized",
        "TaskDeadLettered",
    ):
        assert needed in avro


TASK_PAYLOADS = st.one_of(
    st.builds(e.TaskSubmitted, text, specs()),
    *[st.builds(cls) for cls in e.EVENT_TYPES if cls is not e.TaskSubmitted],
)
PAYLOADS = st.one_of(
    TASK_PAYLOADS,
    st.builds(
        r.TaskEvents,
        st.lists(
            st.builds(r.PackedEvent, text, text, st.integers(0, 2**40), st.integers(0, 2**41), TASK_PAYLOADS),
            max_size=4,
        ).map(tuple),  # fmt: skip
    ),
    st.builds(r.SubmissionAccepted, text, st.none() | text, text, st.dictionaries(text, text, max_size=3)),
    st.builds(
        r.TasksAdmitted,
        text,
        st.lists(
            st.builds(
                r.AdmittedTask,
                text,
                specs(),
                st.lists(text, max_size=3).map(tuple),
                st.lists(text, max_size=2).map(tuple),
            ),
            max_size=3,
        ).map(tuple),
    ),
    st.builds(
        r.SubmissionRejected,
        text,
        text,
        st.lists(st.builds(r.FieldProblem, st.none() | text, text, text), max_size=3).map(tuple),
    ),
    st.builds(r.TenantSet, text, text, st.none() | st.integers(0, 2**31 - 1), st.floats(0.001, 1000)),
)


@given(PAYLOADS, st.integers(0, 2**40), st.none() | text)
def test_event_records_round_trip(payload: object, version: int, task_id: str | None) -> None:
    codec = Codec({"event": 7}, lambda sid: pytest.fail("no lookup expected"))
    rec = r.EventRecord("id", task_id, "sub", version, 123, "node", payload)  # type: ignore[arg-type]
    data = codec.encode(rec)
    assert data[:5] == b"\x00\x00\x00\x00\x07"
    assert codec.decode("event", data) == rec


@given(specs())
def test_commands_round_trip(spec: r.TaskSpec) -> None:
    codec = Codec({"command": 1}, lambda sid: pytest.fail("no lookup expected"))
    for body in (
        r.SubmitDag("acme", (spec,), "key", {"a": "b"}),
        r.CancelTaskRequest("t", "why"),
        r.ReprioritizeTaskRequest("t", 4),
        r.SetTenant("acme", "free"),
        r.SetTenant("acme", "premium", 7, False, 2.5),
    ):
        cmd = r.CommandRecord("c", 1, body, "me")  # type: ignore[arg-type]
        assert codec.decode("command", codec.encode(cmd)) == cmd


def test_setting_tenants_is_a_compatible_change_of_the_command_and_event_schemas(
    registry: SchemaRegistryClient,
) -> None:
    """SetTenant (commands) and TenantSet (events) were added as their unions' last branches: the
    registry takes each schema after the one without it (BACKWARD), and earlier branches keep their
    indexes."""
    for env, subject, field_name, branch in (
        ("command", "p.commands-value", "body", "io.taskstream.SetTenant"),
        ("event", "p.events-value", "payload", "io.taskstream.TenantSet"),
    ):
        new = json.loads(schema_text(env))
        old = json.loads(json.dumps(new))
        union = next(f for f in old["fields"] if f["name"] == field_name)
        names = [(t["name"] if isinstance(t, dict) else t).split(".")[-1] for t in union["type"]]
        at = names.index(branch.split(".")[-1])
        assert at >= len(names) - 3, names  # the last branch (of events, the one before TaskLimitExceeded)
        union["type"] = union["type"][:at]
        for version in (old, new):
            registry.register_schema(subject, Schema(json.dumps(version), "AVRO"))
        assert registry.get_latest_version(subject).version == 2


def test_the_limit_exceeded_and_unqueued_events_are_a_compatible_change_and_round_trip_alone_and_packed(
    registry: SchemaRegistryClient,
) -> None:
    """TaskLimitExceeded, then TaskUnqueued, were added as the events union's last branches (and the packed
    events' last): the registry takes the schema after the one without them (BACKWARD), and each
    round-trips alone and packed."""
    new = json.loads(schema_text("event"))
    old = json.loads(json.dumps(new))
    union = next(f for f in old["fields"] if f["name"] == "payload")["type"]
    assert union[-2:] == ["io.taskstream.TaskLimitExceeded", "io.taskstream.TaskUnqueued"], union[-2:]
    del union[-2:]
    packed = next(b for b in union if isinstance(b, dict) and b["name"].endswith("TaskEvents"))
    inner = packed["fields"][0]["type"]["items"]["fields"][-1]["type"]
    assert [b["name"].split(".")[-1] for b in inner[-2:]] == ["TaskLimitExceeded", "TaskUnqueued"]
    del inner[-2:]
    for version in (old, new):
        registry.register_schema("x.events-value", Schema(json.dumps(version), "AVRO"))
    assert registry.get_latest_version("x.events-value").version == 2
    codec = Codec({"event": 3}, lambda sid: pytest.fail("no lookup expected"))
    limited = e.TaskLimitExceeded("c1", "node-w1", "node-w2", "memory", "over its memory limit")
    unqueued = e.TaskUnqueued(3, "reprioritized from 0 to 5 while queued: ranked again")
    for ev in (limited, unqueued):
        for payload in (ev, r.TaskEvents((r.PackedEvent("t", "s", 7, 9, ev),))):
            rec = r.EventRecord("t:7", "t", "s", 7, 9, "node-w0", payload)  # type: ignore[arg-type]
            assert codec.decode("event", codec.encode(rec)) == rec


def named(schema: Any, name: str) -> dict[str, Any]:
    """The record called `name` wherever it is defined in `schema` (a parsed schema's JSON)."""
    if isinstance(schema, dict):
        if schema.get("type") == "record" and str(schema.get("name")).split(".")[-1] == name:
            return schema
        parts = [*schema.get("fields", ()), schema.get("type"), schema.get("items")]
    else:
        parts = schema if isinstance(schema, list) else []
    for part in parts:
        if isinstance(part, dict | list) and (found := named(part, name)):
            return found
    return {}


def test_a_task_ready_again_after_a_hand_back_is_a_compatible_change_and_old_ones_were_not_handed_back(
    registry: SchemaRegistryClient,
) -> None:
    """TaskReady gained `handed_back` (with a default): the registry takes the schema after the one
    without it (BACKWARD); a TaskReady written before reads as not handed back, and a new one round-trips
    alone and packed."""
    new = json.loads(schema_text("event"))
    old = json.loads(json.dumps(new))
    ready = named(old, "TaskReady")
    assert [f["name"] for f in ready["fields"]] == ["reason", "handed_back"]
    del ready["fields"][-1]
    first = registry.register_schema("h.events-value", Schema(json.dumps(old), "AVRO"))
    second = registry.register_schema("h.events-value", Schema(json.dumps(new), "AVRO"))
    assert first != second and registry.get_latest_version("h.events-value").version == 2
    codec = Codec({"event": second}, lambda sid: registry.get_schema(sid).schema_str)
    before = r.EventRecord("t:3", "t", "s", 3, 9, "node-w0", e.TaskReady("all prerequisites succeeded"))
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(old), to_avro(before))
    got = codec.decode("event", b"\x00" + first.to_bytes(4, "big") + body.getvalue())
    assert got == before and got.payload.handed_back is False
    back = e.TaskReady("the lease of claim c1 expired: run again", handed_back=True)
    for payload in (back, r.TaskEvents((r.PackedEvent("t", "s", 7, 9, back),))):
        rec = r.EventRecord("t:7", "t", "s", 7, 9, "node-w0", payload)  # type: ignore[arg-type]
        assert codec.decode("event", codec.encode(rec)) == rec


def test_the_queue_record_standing_for_several_tasks_is_a_compatible_change_and_old_records_read_alone(
    registry: SchemaRegistryClient,
) -> None:
    """QueuedTask gained `also` (the further tasks it stands for): the registry takes the new schema
    after the one before it (BACKWARD), and a record written before decodes as one task."""
    new = json.loads(schema_text("queued"))
    old = {**new, "fields": [f for f in new["fields"] if f["name"] != "also"]}
    first = registry.register_schema("q.queue-value", Schema(json.dumps(old), "AVRO"))
    second = registry.register_schema("q.queue-value", Schema(json.dumps(new), "AVRO"))
    assert first != second and registry.get_latest_version("q.queue-value").version == 2
    spec = r.TaskSpec("t", "acme", ("true",))
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(old), to_avro(r.QueuedTask("a", 1, "default", 5, spec)))
    codec = Codec({"queued": second}, lambda sid: registry.get_schema(sid).schema_str)
    got = codec.decode("queued", b"\x00" + first.to_bytes(4, "big") + body.getvalue())
    assert got == r.QueuedTask("a", 1, "default", 5, spec) and r.queued_tasks(got) == [got]


def test_a_task_naming_its_own_submission_in_a_shared_admission_is_a_compatible_change(
    registry: SchemaRegistryClient,
) -> None:
    """AdmittedTask gained `submission_id` (with a default), so that small submissions can share a
    TasksAdmitted: the registry takes the events schema after the one without it (BACKWARD), and an
    admission written before reads with every task in the record's submission."""
    new = json.loads(schema_text("event"))
    old = _without(new, "AdmittedTask", "submission_id")
    assert old != new
    first = registry.register_schema("a.events-value", Schema(json.dumps(old), "AVRO"))
    second = registry.register_schema("a.events-value", Schema(json.dumps(new), "AVRO"))
    assert first != second and registry.get_latest_version("a.events-value").version == 2
    spec = r.TaskSpec("t", "acme", ("true",))
    rec = r.EventRecord("s1:admitted:0:0", None, "s1", 0, 2, "n", r.TasksAdmitted("n", (r.AdmittedTask("t1", spec),)))
    old_avro = to_avro(rec)
    for task in old_avro["payload"][1]["tasks"]:
        del task["submission_id"]
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(old), old_avro)
    codec = Codec({"event": second}, lambda sid: registry.get_schema(sid).schema_str)
    got = codec.decode("event", b"\x00" + first.to_bytes(4, "big") + body.getvalue())
    assert got == rec
    assert [x.submission_id for x in r.task_events(got)] == ["s1", "s1"]


def _without(node: Any, record: str, field: str) -> Any:
    """A schema (parsed JSON) as it was before `record` gained `field`."""
    if isinstance(node, dict):
        if str(node.get("name", "")).split(".")[-1] == record and node.get("type") == "record":
            return {**node, "fields": [f for f in node["fields"] if f["name"] != field]}
        return {k: _without(v, record, field) for k, v in node.items()}
    if isinstance(node, list):
        return [_without(v, record, field) for v in node]
    return node


def _without_resource_labels(node: Any) -> Any:
    return _without(node, "Resources", "labels")


def test_the_worker_labels_a_task_needs_are_a_compatible_change_and_old_specs_need_none(
    registry: SchemaRegistryClient,
) -> None:
    """Resources gained `labels` (with a default): the registry takes each envelope holding a spec
    after the one without it (BACKWARD), and a spec written before needs no labels."""
    for env, subject in (("queued", "l.queue-value"), ("command", "l.commands-value"), ("event", "l.events-value")):
        new = json.loads(schema_text(env))
        old = _without_resource_labels(new)
        assert old != new
        registry.register_schema(subject, Schema(json.dumps(old), "AVRO"))
        registry.register_schema(subject, Schema(json.dumps(new), "AVRO"))
        assert registry.get_latest_version(subject).version == 2
    new = json.loads(schema_text("queued"))
    old = _without_resource_labels(new)
    first = registry.register_schema("l.queue-value", Schema(json.dumps(old), "AVRO"))
    spec = r.TaskSpec("t", "acme", ("true",), resources=Resources(2.0, 512, 0))
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(old), to_avro(r.QueuedTask("a", 1, "default", 5, spec)))
    latest = registry.get_latest_version("l.queue-value").schema_id
    codec = Codec({"queued": latest}, lambda sid: registry.get_schema(sid).schema_str)
    got = codec.decode("queued", b"\x00" + first.to_bytes(4, "big") + body.getvalue())
    assert got.spec.resources == Resources(2.0, 512, 0, ())
    needs = r.TaskSpec("t", "acme", ("true",), resources=Resources(labels=(("zone", "eu"),)))
    again = codec.decode("queued", codec.encode(r.QueuedTask("b", 1, "big", 5, needs)))
    assert again.spec.resources.labels == (("zone", "eu"),)


def test_inputs_packed_in_one_record_round_trip_and_the_input_schema_change_is_compatible(
    registry: SchemaRegistryClient,
) -> None:
    """TaskInput gained a body that packs several inputs (Inputs, the union's last branch, so the earlier
    branches keep their indexes), then Schedule, Promote, LimitExceeded and HolderGone, and FinishReport its
    started_ms and pid: the registry takes each schema after the one before it (BACKWARD), and a pack
    round-trips to the same inputs in order."""
    new = json.loads(schema_text("input"))
    old = json.loads(schema_text("input"))
    union = old["fields"][4]["type"]
    added = ["Inputs", "Schedule", "Promote", "LimitExceeded", "HolderGone"]
    old["fields"][4]["type"] = [b for b in union if b["name"].split(".")[-1] not in added]
    finish = next(b for b in old["fields"][4]["type"] if b["name"].endswith("FinishReport"))
    finish["fields"] = [f for f in finish["fields"] if f["name"] not in ("started_ms", "pid")]
    # each added last, in this order, so the earlier branches keep their indexes
    names = [b["name"] for b in new["fields"][4]["type"]]
    assert names[-len(added) :] == [f"io.taskstream.{n}" for n in added]
    assert names[: -len(added)] == [b["name"] for b in old["fields"][4]["type"]]
    steps = [old]
    for drop in range(len(added) - 1, -1, -1):  # with Inputs, then Schedule, Promote, LimitExceeded, ...
        step = json.loads(json.dumps(new))
        step["fields"][4]["type"] = step["fields"][4]["type"][: len(names) - drop]
        steps.append(step)
    for version in steps:  # each schema the topic has had: BACKWARD at every step
        registry.register_schema("p.task-inputs-value", Schema(json.dumps(version), "AVRO"))
    assert registry.get_latest_version("p.task-inputs-value").version == len(added) + 1
    members = [
        r.InputRecord("i1", "t1", 5, "w", r.ClaimRequest(1, "w", "c1")),
        r.InputRecord("i2", "t2", 6, "w", r.FinishReport("c2", 0, "out", 3, "", started_ms=4, pid=9)),
        r.InputRecord("i3", "t1", 7, "w", r.Heartbeat("c1")),
    ]
    members.append(r.InputRecord("i4", "t3", 8, "batcher", r.Promote("default")))
    members.append(r.InputRecord("i5", "t1", 9, "rm", r.LimitExceeded("c1", "memory", "over", "node-w2")))
    members.append(r.InputRecord("i6", "t2", 10, "node-w0", r.HolderGone("c2", "node-1-w0", "its worker died")))
    packed = r.pack_inputs(members, "w")
    codec = Codec({"input": 4}, lambda sid: pytest.fail("no lookup expected"))
    got = codec.decode("input", codec.encode(packed))
    assert got == packed and r.task_inputs(got) == members and got.task_id == "t1"
    assert r.task_inputs(members[0]) == [members[0]]


def test_a_finish_report_with_its_start_round_trips_and_one_from_an_older_writer_has_none() -> None:
    """FinishReport gained started_ms and pid (a short run's start in its finish report's record): both
    round-trip, and a report written with the schema before them decodes with both None."""
    folded = r.InputRecord("i", "t", 5, "w", r.FinishReport("c", 0, "tail", 3, "", started_ms=4, pid=42))
    codec = Codec({"input": 3}, lambda sid: pytest.fail("no lookup expected"))
    assert codec.decode("input", codec.encode(folded)) == folded
    old = json.loads(schema_text("input"))
    finish = next(b for b in old["fields"][4]["type"] if b["name"].endswith("FinishReport"))
    finish["fields"] = [f for f in finish["fields"] if f["name"] not in ("started_ms", "pid")]
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(old), {
        "input_id": "i", "task_id": "t", "sent_ms": 5, "sender": "w",
        "body": ("io.taskstream.FinishReport",
                 {"claim_id": "c", "exit_code": 0, "output_tail": "tail", "duration_ms": 3, "reason": ""}),
    })  # fmt: skip
    older = Codec({"input": 9}, lambda sid: json.dumps(old))
    got = older.decode("input", b"\x00\x00\x00\x00\x63" + body.getvalue())
    assert got == r.InputRecord("i", "t", 5, "w", r.FinishReport("c", 0, "tail", 3, ""))
    assert got.body.started_ms is None and got.body.pid is None


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (None, "empty message"),
        (b"\x00\x00", "too short"),
        (b"\x01\x00\x00\x00\x01abc", "magic byte 1 is not 0"),
        (b"\x00\x00\x00\x00\x01\xff\xff\xff", "does not decode with schema id 1"),
    ],
)
def test_undecodable_bytes_say_why(data: bytes | None, reason: str) -> None:
    codec = Codec({"event": 1}, lambda sid: pytest.fail("no lookup expected"))
    with pytest.raises(DecodeError) as info:
        codec.decode("event", data)
    assert reason in info.value.reason


def test_an_unknown_schema_id_is_its_own_error(registry: SchemaRegistryClient) -> None:
    codec = Codec({}, lambda sid: registry.get_schema(sid).schema_str)
    with pytest.raises(UnknownSchemaError) as info:
        codec.decode("event", b"\x00\x00\x00\x03\xe7" + b"\x02")
    assert "schema id 999 is not known to the registry" in info.value.reason


def test_registration_is_idempotent_and_ids_are_shared(registry: SchemaRegistryClient) -> None:
    text_ = schema_text("event")
    a = registry.register_schema("t.events-value", Schema(text_, "AVRO"))
    b = registry.register_schema("t.events-value", Schema(text_, "AVRO"))
    c = registry.register_schema("copy-value", Schema(text_, "AVRO"))
    assert a == b == c
    assert registry.get_latest_version("t.events-value").version == 1
    assert json.loads(registry.get_schema(a).schema_str) == json.loads(text_)


def _evolved(extra_field: dict) -> str:
    schema = json.loads(schema_text("event"))
    schema["fields"].append(extra_field)
    return json.dumps(schema)


def test_an_incompatible_change_is_refused_and_a_compatible_one_accepted(registry: SchemaRegistryClient) -> None:
    subject = "t.events-value"
    registry.register_schema(subject, Schema(schema_text("event"), "AVRO"))
    with pytest.raises(SchemaRegistryError) as info:
        registry.register_schema(subject, Schema(_evolved({"name": "region", "type": "string"}), "AVRO"))
    assert info.value.http_status_code == 409
    assert "region" in info.value.error_message
    ok = registry.register_schema(
        subject, Schema(_evolved({"name": "region", "type": "string", "default": ""}), "AVRO")
    )
    assert registry.get_latest_version(subject).schema_id == ok
    assert registry.get_latest_version(subject).version == 2


def test_confluent_serializers_and_our_codec_agree(registry: SchemaRegistryClient) -> None:
    """A program using only confluent-kafka reads what we write and writes what we read."""
    ctx = SerializationContext("t.events", MessageField.VALUE)
    ser = AvroSerializer(registry, schema_text("event"), lambda obj, _c: to_avro(obj))
    spec = r.TaskSpec(name="a", tenant="t", argv=("echo", "hi"))
    rec = r.EventRecord("x:1", "x", "s", 1, 5, "n", e.TaskSubmitted("s", spec))
    data = ser(rec, ctx)
    sid = registry.get_latest_version("t.events-value").schema_id
    ours = Codec({"event": sid}, lambda i: registry.get_schema(i).schema_str)
    assert ours.decode("event", data) == rec
    de = AvroDeserializer(registry, return_record_name=True)
    theirs = de(ours.encode(rec), ctx)
    assert from_avro("event", {**theirs, "payload": tuple(theirs["payload"])}) == rec


def test_the_hand_written_event_encoding_equals_the_generic_one() -> None:
    """schemas/codec.py writes EventRecord and TaskSpec out by hand for speed; it must not drift."""
    from taskstream.schemas import codec as c
    from taskstream.schemas.records import EventRecord

    from taskstream.core.events import TaskSubmitted
    from taskstream.core.model import Backoff, Resources, TaskSpec

    spec = TaskSpec(
        "a",
        "t",
        ("x", "y"),
        {"A": "1"},
        "/w",
        Resources(2.0, 3, 1),
        5,
        6,
        Backoff(7, 2.5, 9, 0.1),
        10,
        11,
        ("d1", "d2"),
        12,
        {"l": "v"},
    )

    def written(envelope: str, d: dict[str, object]) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, c.parsed(envelope), d)
        return out.getvalue()

    rec = EventRecord("e", "t1", "s", 1, 2, "n", TaskSubmitted(submission_id="s", spec=spec))
    generic = {**c._plain(rec), "payload": (c._TASK_SUBMITTED, c._plain(rec.payload))}
    assert written("event", c.to_avro(rec)) == written("event", generic)
    packed = EventRecord(
        "e", None, "s", 0, 2, "n", r.TasksAdmitted("n", (r.AdmittedTask("t1", spec, ("t2",), ("x",)),))
    )
    generic = {**c._plain(packed), "payload": (c._TASKS_ADMITTED, c._plain(packed.payload))}
    assert written("event", c.to_avro(packed)) == written("event", generic)
    cmd = r.CommandRecord("c", 1, r.SubmitDag("t", (spec, spec), "k", {"a": "b"}), "me")
    generic = {**c._plain(cmd), "body": (c._SUBMIT_DAG, c._plain(cmd.body))}
    assert written("command", c.to_avro(cmd)) == written("command", generic)


def test_a_client_whose_registry_is_not_there_says_so_as_a_submit_error() -> None:
    import socket
    import time

    from taskstream.sdk import Client, SubmitError
    from taskstream.settings import Settings

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    s = Settings(registry_url=f"http://127.0.0.1:{port}", kafka_bootstrap="127.0.0.1:9")
    started = time.monotonic()
    with pytest.raises(SubmitError) as err:
        Client(s)
    print(f"reported after {time.monotonic() - started:.1f}s")  # it took 135 s before the deadline
    assert f"cannot reach the schema registry at http://127.0.0.1:{port} (is the stack up?)" in str(err.value)


@given(specs(), specs())
def test_a_task_record_reads_back_as_written_whether_or_not_its_spec_was_kept(one: Any, other: Any) -> None:
    """streams/state_codec.py keeps recent tasks' specs with their plain form: a save of the same spec
    reuses the plain form, a load reuses the spec. What is read is always what was written: with the
    kept specs dropped, kept, or kept for another spec under the same task id."""
    from taskstream.streams import state_codec
    from taskstream.streams.state_codec import TaskRecord, dumps, loads

    from taskstream.core.model import Status, TaskState

    def record(spec: Any) -> TaskRecord:
        return TaskRecord(TaskState("t1", Status.READY, 3, spec, "s"), dependents=["t2"], lease_until_ms=9)

    state_codec._SPECS.clear()
    raw = dumps(record(one))
    state_codec._SPECS.clear()
    cold = loads(raw)  # built from the stored form
    warm = loads(raw)  # the kept spec
    assert cold == warm == record(one)
    assert dumps(warm) == raw
    raw_other = dumps(record(other))  # the same task id, another spec: what is kept is replaced
    assert loads(raw_other) == record(other)
    state_codec._SPECS["t1"] = (one, state_codec._plain(one))  # kept for one, stored for the other
    assert loads(raw_other).state.spec == other


@given(specs())
def test_a_task_record_stores_its_spec_as_the_generic_walk_would(spec: Any) -> None:
    """streams/state_codec.py stores a spec through the codec's written-out walk (`_spec_avro`, tuples
    and shared records included); the JSON it stores is byte for byte the generic walk's, and the spec
    reads back equal."""
    import orjson
    from taskstream.schemas.codec import _plain
    from taskstream.streams import state_codec
    from taskstream.streams.state_codec import TaskRecord, dumps, loads

    from taskstream.core.model import Status, TaskState

    state_codec._SPECS.clear()
    raw = dumps(TaskRecord(TaskState("t1", Status.READY, 3, spec, "s")))
    assert orjson.dumps(orjson.loads(raw)["state"]["spec"]) == orjson.dumps(_plain(spec))
    state_codec._SPECS.clear()
    assert loads(raw).state.spec == spec


@given(specs(), st.lists(st.text(max_size=8), max_size=3), st.integers(0, 5))
def test_a_kept_task_record_loads_as_decoded_and_is_never_shared(spec: Any, deps: list[str], rechecks: int) -> None:
    """streams/state_codec.py keeps the last record saved of each recent task with its bytes: a load of
    those bytes gets a copy of it instead of decoding. The copy equals what decoding gives; a change to
    the copy (or to the record saved) reaches neither the kept record nor the next load; bytes written
    by anyone else under the same task id are decoded."""
    from taskstream.streams import state_codec
    from taskstream.streams.state_codec import TaskRecord, dumps, loads

    from taskstream.core.model import Status, TaskState

    saved = TaskRecord(TaskState("t1", Status.READY, 3, spec, "s"), dependents=list(deps), rechecks=rechecks)
    raw = state_codec.save(saved)
    assert raw == dumps(saved)
    saved.dependents.append("changed after the save")
    saved.ended["p"] = "SUCCEEDED"
    first = state_codec.load("t1", raw)
    assert first == loads(raw)
    assert first.dependents == deps and first.ended == {}
    first.dependents.append("changed after the load")
    first.ended["q"] = "FAILED"
    again = state_codec.load("t1", raw)
    assert again == loads(raw) and again is not first
    other = dumps(TaskRecord(TaskState("t1", Status.RUNNING, 4, spec, "s"), dependents=["x"]))
    assert state_codec.load("t1", other) == loads(other)  # not the kept record: decoded
    state_codec._RECORDS.clear()
    assert state_codec.load("t1", raw) == loads(raw)


@pytest.mark.parametrize(
    ("status", "attempt", "failures"),
    [("RUNNING", 1, 0), ("RUNNING", 3, 2), ("RETRY_WAIT", 2, 2), ("QUEUED", 0, 0)],
)
def test_a_task_record_saved_before_failures_were_kept_reads_them_as_that_code_counted(
    status: str, attempt: int, failures: int
) -> None:
    """A table written by a worker of an earlier version has no `failures`: every attempt before the
    current one counts as a failed run (the current one too while it waits to be retried), which is
    what that version's retry decision counted. A record that has the field keeps what it says."""
    import orjson
    from taskstream.streams.state_codec import TaskRecord, dumps, loads

    from taskstream.core.model import Status, TaskState

    new = dumps(TaskRecord(TaskState("t1", Status(status), 7, None, "s", attempt=attempt, failures=0)))
    assert loads(new).state.failures == 0
    old = orjson.loads(new)
    del old["state"]["failures"]
    assert loads(orjson.dumps(old)).state.failures == failures
