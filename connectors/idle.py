"""Adjustments to aiokafka (Faust's client), pinned to aiokafka 0.14.0 (pyproject).

Client-side idle backoff for aiokafka (Faust's client) against brokers that answer empty fetches at
once instead of long-polling (noida-db, measured in ARCHITECTURE.md: ~2,000 fetches/s per idle consumer,
most of a core).

aiokafka sends the next fetch to a broker as soon as the previous one returns. We wrap the coroutine
that handles one fetch so that an empty answer holds the slot for `seconds` before the next request;
a fetch that brought records returns at once. Pinned to aiokafka 0.14.0 (pyproject), whose
`Fetcher._proc_fetch_request` returns True exactly when it buffered new records.
"""

from __future__ import annotations

import asyncio
from typing import Any

_MARK = "_taskstream_idle_backoff"


def install_idle_backoff(seconds: float) -> None:
    from aiokafka.consumer.fetcher import Fetcher

    current = Fetcher._proc_fetch_request
    if getattr(current, _MARK, None) is not None:
        setattr(current, _MARK, seconds)
        return
    original = current

    async def proc_fetch_request(self: Any, assignment: Any, node_id: Any, request: Any) -> bool:
        got = await original(self, assignment, node_id, request)
        if not got:
            try:
                await asyncio.sleep(getattr(proc_fetch_request, _MARK))
            except asyncio.CancelledError:
                return False  # closing or reassigned: the original swallows cancellation the same way
        return bool(got)

    setattr(proc_fetch_request, _MARK, seconds)
    Fetcher._proc_fetch_request = proc_fetch_request  # type: ignore[method-assign]


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
