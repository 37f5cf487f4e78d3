"""Batches of a Faust stream's events that gather while the batch before is handled.

Faust's `Stream.take_events(max, within)` gathers only while it waits out `within`: while the batch it
yielded is being handled its buffer is held, and when nothing came it wakes every `within` anyway.
So the lifecycle either waited a window for every input (latency when idle) or, with a short one,
handled one-task admissions in batches of one to six, each a whole write (CPU when busy; docs/
measurements.md, "The lifecycle's window"). `gathered` yields whatever has arrived as soon as the
caller asks, and waits only when nothing has; what arrives while a batch is handled goes into the next
one, up to `most` (then the stream waits: the consumer's own flow control holds the partitions). An
event may weigh more than one (`weight`): a record that packs many tasks counts as what it packs.

Events are acked once the caller has handled their batch (it asks for the next one), as with
`take_events`, so Faust commits an offset only once what it carried was decided.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any


def _one(event: Any) -> int:
    return 1


async def gathered(stream: Any, most: int, weight: Callable[[Any], int] = _one) -> AsyncIterator[list[Any]]:
    """The events of `stream` (a Faust stream, as an agent gets it) in batches weighing at most `most`
    (or one event alone, however heavy)."""
    pending: list[Any] = []
    weighs = [0]  # what pending weighs
    arrived = asyncio.Event()  # pending is not empty
    room = asyncio.Event()  # pending is not full
    room.set()

    async def gather(value: Any) -> Any:  # a processor: runs for each value, in the stream's drainer
        event = stream.current_event
        if event is None:
            raise RuntimeError("a gathered value came without its event")
        heavy = weight(event)
        while pending and weighs[0] + heavy > most:
            room.clear()
            await stream.wait(room)
        pending.append(event)
        weighs[0] += heavy
        arrived.set()
        return value

    acks = stream.enable_acks
    stream.enable_acks = False  # acked here, once handled
    stream.add_processor(gather)
    stream._enable_passive(aiter(stream.channel))  # the drainer that runs the processors (as take_events)
    try:
        while not stream.should_stop:
            await stream.wait_for_stopped(arrived)
            if not pending:
                continue
            batch = pending[:]
            del pending[:]
            weighs[0] = 0
            arrived.clear()
            room.set()
            yield batch
            for event in batch:
                await stream.ack(event)
    finally:
        stream.enable_acks = acks
        stream._processors.remove(gather)
