"""Kafka plumbing shared by every process: topic layout, admin, producers, consumers, registry client."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.error import KafkaError
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.schema_registry_client import Schema
from taskstream.schemas.codec import ENVELOPES, Codec, schema_text

from taskstream.settings import Settings

MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # a submission of MAX_TASKS tasks fits; see docs/submissions.md


class KafkaSetupError(RuntimeError):
    pass


@dataclass(frozen=True)
class TopicPlan:
    key: str  # settings.topic(key) is the topic's name
    envelope: str | None  # which Avro envelope its values carry (None: raw bytes)
    config: dict[str, str]
    partitions: int | None = None  # None: settings.partitions


QUEUE_CONFIG = {"retention.ms": "604800000"}  # the default lane's queue ("queue" below) and every other lane's
# Every topic taskstream writes. Same partition count everywhere: events, task-inputs and the queue are
# co-partitioned by task id so one owner sees all of a task.
TOPICS: tuple[TopicPlan, ...] = (
    TopicPlan("commands", "command", {"max.message.bytes": str(MAX_MESSAGE_BYTES), "retention.ms": "-1"}),
    TopicPlan("events", "event", {"retention.ms": "-1", "max.message.bytes": str(MAX_MESSAGE_BYTES)}),
    TopicPlan("task-inputs", "input", {"retention.ms": "604800000"}),
    TopicPlan("queue", "queued", QUEUE_CONFIG),  # the default lane's queue (lane_topic)
    TopicPlan("dead-letters", None, {"retention.ms": "-1", "max.message.bytes": str(MAX_MESSAGE_BYTES)}),
    # Admission's own state (streams/admitter.py), JSON values: the linked part of each admitted
    # submission, co-partitioned with commands and written in the admission transaction ...
    TopicPlan(
        "admission-links",
        None,
        {"cleanup.policy": "compact", "retention.ms": "-1", "max.message.bytes": str(MAX_MESSAGE_BYTES)},
    ),
    # ... and the submitter cluster's heartbeats (connectors/ownership.py): a log of them, kept an hour.
    # Not compacted: noida-db's cleaner compacted heartbeats away before members read them (gaps of 3 s).
    TopicPlan("admission-members", None, {"cleanup.policy": "delete", "retention.ms": "3600000"}, partitions=1),
    # Every tenant set (streams/admitter.py's TenantBook), JSON, keyed by tenant: written in the admission
    # transaction that accepted it, read whole by every admission worker.
    TopicPlan("tenants", None, {"cleanup.policy": "compact", "retention.ms": "-1"}, partitions=1),
    # What each scheduler worker offers (streams/batcher.py), JSON, every heartbeat_ms: read by the
    # batcher, kept an hour. Not task history, so not on the events topic.
    TopicPlan("workers", None, {"cleanup.policy": "delete", "retention.ms": "3600000"}, partitions=1),
)
ADMISSION_GROUP_SUFFIX = "admission"  # consumer group (offsets only) of the admission workers
FAUST_TABLES = ("tasks", "timers")  # the Faust workers' tables (streams/app.py)


def faust_app_id(settings: Settings) -> str:
    return f"{settings.topic_prefix}-scheduler"


def faust_changelogs(settings: Settings) -> list[str]:
    """The changelog topics of the Faust workers' tables, named as Faust names them. Created here with
    the others: left to Faust, a fresh broker's metadata once lagged its creation, the worker took the
    changelog for missing (PartitionsMismatch on every table write) and no task ever moved."""
    return [f"{faust_app_id(settings)}-{table}-changelog" for table in FAUST_TABLES]


def subject(settings: Settings, key: str) -> str:
    return f"{settings.topic(key)}-value"


def admin(settings: Settings) -> AdminClient:
    # log_level 4: warnings and worse (a short-lived admin client logs its purged queue at info)
    return AdminClient({"bootstrap.servers": settings.bootstrap, "log_level": 4})


def ensure_topics(settings: Settings, timeout: float = 30.0) -> None:
    """Create missing topics; existing ones are left as they are."""
    client = admin(settings)
    topics = [NewTopic(settings.topic(t.key), t.partitions or settings.partitions, 1, config=t.config) for t in TOPICS]
    compact = {"cleanup.policy": "compact"}
    topics += [NewTopic(name, settings.partitions, 1, config=compact) for name in faust_changelogs(settings)]
    _create(client, topics, timeout)


def lane_topic(settings: Settings, lane: str) -> str:
    """The queue topic of a lane: `queue` for the default lane (settings.lane), `queue.<lane>` for the
    others. Partitioned as the queue is, so a task's records share its partition number everywhere."""
    return settings.topic("queue") if lane == settings.lane else settings.topic(f"queue.{lane}")


def ensure_lane_topics(settings: Settings, lanes: Iterable[str], timeout: float = 30.0) -> None:
    """Create the queue topics of these lanes where missing (a worker reading a lane makes it exist)."""
    topics = [NewTopic(lane_topic(settings, lane), settings.partitions, 1, config=QUEUE_CONFIG) for lane in lanes]
    _create(admin(settings), topics, timeout)


def _create(client: AdminClient, topics: list[NewTopic], timeout: float) -> None:
    futures = client.create_topics(topics, request_timeout=timeout)
    for name, fut in futures.items():
        try:
            fut.result(timeout)
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaSetupError(f"cannot create topic {name}: {err.str()}") from exc


def registry_client(settings: Settings) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": settings.registry})


def register_schemas(settings: Settings, client: SchemaRegistryClient | None = None) -> dict[str, int]:
    """Register each topic's envelope under <topic>-value (idempotent). Returns envelope -> schema id."""
    client = client or registry_client(settings)
    ids: dict[str, int] = {}
    for t in TOPICS:
        if t.envelope is not None:
            sid = client.register_schema(subject(settings, t.key), Schema(schema_text(t.envelope), "AVRO"))
            ids[t.envelope] = sid
    return ids


def make_codec(settings: Settings, wait_s: float = 30.0) -> Codec:
    """A codec whose ids are registered; waits for the registry for up to `wait_s` seconds. (It tried
    30 times instead, and each try of the registry client retries on its own: a registry that was not
    there took 135 s to be reported.)"""
    client = registry_client(settings)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            ids = register_schemas(settings, client)
            return Codec(ids, lambda sid: client.get_schema(sid).schema_str)
        except Exception as exc:  # registry not up yet
            if time.monotonic() + 1 > deadline:
                raise KafkaSetupError(f"schema registry at {settings.registry} did not answer: {exc}") from exc
            time.sleep(1)


def producer(settings: Settings, **extra: Any) -> Producer:
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "message.max.bytes": MAX_MESSAGE_BYTES + 65536,
    }
    conf.update(extra)
    return Producer(conf)


def consumer(settings: Settings, group: str, **extra: Any) -> Consumer:
    """A read_committed consumer that commits nothing by itself (every reader here tracks its own
    offsets), with what this broker needs (connectors/broker.py)."""
    from taskstream.connectors.broker import consumer_config

    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "fetch.max.bytes": 4 * MAX_MESSAGE_BYTES,
        "max.partition.fetch.bytes": 2 * MAX_MESSAGE_BYTES,
        # a fetch answer can hold several of the largest records
        "receive.message.max.bytes": 4 * MAX_MESSAGE_BYTES + 65536,
        **consumer_config(settings),
    }
    conf.update(extra)
    return Consumer(conf)


ENVELOPE_OF_TOPIC = {t.key: t.envelope for t in TOPICS}
assert set(ENVELOPES) >= {e for e in ENVELOPE_OF_TOPIC.values() if e}
