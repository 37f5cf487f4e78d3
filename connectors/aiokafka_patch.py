"""What taskstream changes in aiokafka (Faust's Kafka client), on every broker. Pinned to aiokafka 0.14.0
(pyproject). The broker-specific adjustment (idle fetch backoff on noida-db) is in connectors/noida.py."""

from __future__ import annotations

from typing import Any

_MARK = "_taskstream_read_committed"


def read_committed_only() -> None:
    """Make every aiokafka consumer in this process read_committed. Admission writes its events in Kafka
    transactions (streams/admitter.py); Faust asks for read_committed only when it runs exactly_once
    itself, and its worker consumer would otherwise see the records of aborted admissions."""
    import aiokafka

    init = aiokafka.AIOKafkaConsumer.__init__
    if getattr(init, _MARK, False):
        return

    def patched(self: Any, *topics: Any, **kwargs: Any) -> None:
        kwargs["isolation_level"] = "read_committed"
        init(self, *topics, **kwargs)

    setattr(patched, _MARK, True)
    aiokafka.AIOKafkaConsumer.__init__ = patched  # type: ignore[method-assign]
