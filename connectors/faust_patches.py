"""What taskstream changes in Faust and in aiokafka (its Kafka client), on every broker. Pinned to
faust-streaming 0.15.3 and aiokafka 0.14.0 (pyproject). The broker-specific adjustment (idle fetch
backoff on noida-db) is in connectors/noida.py."""

from __future__ import annotations

from typing import Any

_MARK = "_taskstream_read_committed"
_ACK_MARK = "_taskstream_current_generation_only"


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


def ack_current_generation_only() -> None:
    """Never commit past a message that was not processed.

    Faust 0.15.3's stream skips a message fetched under an older consumer-group generation (one that
    arrived during a rebalance), and then acks it like a processed one (faust/streams.py, `_py_aiter`:
    skipped values are acked "otherwise the lag would increase"), so its offset is committed and the
    message is never processed. Measured: two Faust workers, one SIGKILLed; a PrerequisiteEnded written
    to the dead worker's partition before the survivor took it over was acked unprocessed, and its
    dependent waited for good (1 run in 3). Refused here: a message of an older generation is not acked,
    its offset stays uncommitted, and after the rebalance's seek it is fetched again and processed (the
    handlers are idempotent, so one that was processed just before the rebalance may run twice)."""
    from faust.transport.consumer import Consumer

    original = Consumer.ack
    if getattr(original, _ACK_MARK, False):
        return

    def ack(self: Any, message: Any) -> bool:
        generation = getattr(message, "generation_id", None)
        if generation is not None and generation != self.app.consumer_generation_id:
            return False
        return bool(original(self, message))

    setattr(ack, _ACK_MARK, True)
    Consumer.ack = ack  # type: ignore[method-assign]
