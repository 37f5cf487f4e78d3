"""The one seam between taskstream and the broker under it: Apache Kafka, or noida-db (the pip-only
fallback). Agents, projections, the SDK and the CLI ask this module how to behave, never which broker
runs. On Kafka nothing here changes a client's defaults beyond what docs/measurements.md gives a reason
for; on noida-db it switches on the workarounds in connectors/noida.py.

Differences that remain, each measured (docs/measurements.md, "Kafka and noida-db side by side"):

| | Apache Kafka | noida-db |
|---|---|---|
| empty fetch | held until records arrive or fetch.wait.max.ms | answered at once: idle consumers rest unassigned |
| fetch size limits | honoured | ignored: consumers accept any size |
| a SIGKILLed group member | expired after its session timeout | never expired: admission keeps its own membership |
| a restarted Faust worker | given partitions once the dead session expired | leaves the group for its dead run first |
| a transactional id after an abort | reusable | its later records are hidden: never reused |
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskstream.connectors import noida
from taskstream.connectors.ownership import GroupOwnership, Owner, Ownership

from taskstream.settings import Settings


@dataclass(frozen=True)
class Broker:
    name: str
    holds_empty_fetches: bool
    expires_dead_members: bool


KAFKA = Broker("kafka", holds_empty_fetches=True, expires_dead_members=True)
NOIDA = Broker("noida", holds_empty_fetches=False, expires_dead_members=False)


def of(settings: Settings) -> Broker:
    return NOIDA if settings.broker == "noida" else KAFKA


def projection_linger(settings: Settings, name: str = "") -> float:
    """How long a projection's small batch waits for more records (seconds): the graph's own setting,
    the others' shared one. Not on noida-db, where a consumer waiting in a fetch spins on the broker
    (connectors/noida.py)."""
    ms = settings.graph_linger_ms if name == "graph" else settings.projection_linger_ms
    return ms / 1000 if of(settings) is KAFKA else 0.0


def consumer_config(settings: Settings) -> dict[str, Any]:
    """librdkafka consumer settings this broker needs beyond taskstream's own."""
    return dict(noida.CONSUMER_CONFIG) if of(settings) is NOIDA else {}


class Waiting:
    """An idle consumer on Kafka stays assigned: its next poll waits in the broker's long-poll."""

    def rest(self, next_offsets: dict[int, int], stop: threading.Event) -> bool:
        return False  # nothing to reassign

    def woke(self) -> None:
        pass

    def big_batch(self, msgs: list[Any]) -> bool:
        return False


def idle(settings: Settings, consumer: Any, topic: str, first: float = 0.005, ceiling: float = 0.1) -> Any:
    """How an assigned librdkafka consumer spends idle time: `rest(next_offsets, stop)` returns True when
    it unassigned the consumer (the caller assigns again at `next_offsets`); `big_batch(msgs)` says
    whether to unassign while a large batch is worked on (the caller reassigns after)."""
    if of(settings) is NOIDA:
        return noida.Resting(consumer, topic, first=first, ceiling=ceiling)
    return Waiting()


def poll_timeout(settings: Settings) -> float:
    """How long one poll of an idle consumer waits (a Kafka poll costs nothing while it waits)."""
    return 0.05 if of(settings) is NOIDA else 0.5


def admission_ownership(settings: Settings, owner: Owner, state: Any) -> Ownership:
    if of(settings) is NOIDA:
        return noida.HeartbeatOwnership(settings, owner, state)
    return GroupOwnership(settings, owner, state)


def install_client_patches(settings: Settings, member_file: Path | None = None) -> None:
    """Adjust aiokafka (Faust's client) for this broker, before the Faust app is built. `member_file`:
    where a consumer-group member (a Faust worker) keeps its member id from one run to the next. On
    noida-db, which never expires a SIGKILLed member, a restarted member leaves the group for its dead
    predecessor first (connectors/noida.py); Kafka expires it after the session timeout."""
    if of(settings) is NOIDA:
        noida.install_idle_backoff(settings.idle_backoff_ms / 1000)
        if member_file is not None:
            noida.leave_for_predecessor(settings, member_file)
            noida.remember_group_member(member_file)


def faust_settings(settings: Settings) -> dict[str, Any]:
    """Consumer-group timing for the Faust workers. On Kafka a SIGKILLed worker's partitions move after
    the session timeout (Faust's default: 60 s); noida-db never expires it (docs/measurements.md)."""
    timeout = settings.worker_session_timeout_ms / 1000
    return {
        "broker_session_timeout": timeout,
        "broker_heartbeat_interval": max(0.5, min(3.0, timeout / 5)),
        "broker_rebalance_timeout": max(timeout * 2, 20.0),
    }
