"""The lifecycle's batches (streams/gather.py): what arrives while a batch is handled goes into the next
one, up to the bound; a batch does not wait once something has arrived; nothing is lost or repeated;
an event is acked once its batch has been handled. On a stand-in for the Faust stream's hooks that
`gathered` uses (the processors its drainer runs, one event at a time); the lifecycle's own use on a
real Faust stream is what every stack test of the dispatch modules goes through."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

from taskstream.streams.gather import gathered


class Stream:
    """A Faust stream's hooks, as `gathered` uses them: its drainer runs the processors for each value,
    with the value's event as `current_event`, and waits for a processor that waits."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[int] = asyncio.Queue()
        self.channel = self  # aiter(channel): the drainer's source
        self._processors: list[Any] = []
        self.enable_acks = True
        self.should_stop = False
        self.current_event: Any = None
        self.acked: list[int] = []
        self.drainer: asyncio.Task[None] | None = None

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> int:  # never read here: the drainer reads the queue
        raise StopAsyncIteration

    def add_processor(self, processor: Any) -> None:
        self._processors.append(processor)

    def _enable_passive(self, source: Any) -> None:
        self.drainer = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        while True:
            value = await self.queue.get()
            self.current_event = SimpleNamespace(value=value)
            for processor in list(self._processors):
                await processor(value)
            self.current_event = None

    async def wait(self, event: asyncio.Event) -> None:
        await event.wait()

    async def wait_for_stopped(self, event: asyncio.Event) -> None:
        await event.wait()

    async def ack(self, event: Any) -> None:
        self.acked.append(event.value)


def test_a_batch_gathers_what_arrived_while_the_one_before_was_handled_up_to_its_bound() -> None:
    async def main() -> tuple[list[list[int]], Stream]:
        stream = Stream()
        batches: list[list[int]] = []
        stream.queue.put_nowait(1)
        async with contextlib.aclosing(gathered(stream, 3)) as gathering:
            async for batch in gathering:
                values = [event.value for event in batch]
                batches.append(values)
                if values == [1]:
                    assert stream.acked == [], "not acked before its batch is handled"
                    assert stream.enable_acks is False, "acked by gathered, not by the stream"
                    for n in range(2, 10):  # arrive while the first batch is being handled
                        stream.queue.put_nowait(n)
                    await asyncio.sleep(0.1)  # the drainer gathers them meanwhile, then waits for room
                    assert stream.queue.qsize() == 4, "the drainer waits at the bound: 3 gathered, the 4th held"
                if sum(len(b) for b in batches) == 9:
                    break
        assert stream.enable_acks is True and stream._processors == [], "the stream as it was"
        assert stream.drainer is not None
        stream.drainer.cancel()
        return batches, stream

    batches, stream = asyncio.run(asyncio.wait_for(main(), 20))
    assert batches[0] == [1], "a batch does not wait for more once something has arrived"
    assert batches[1] == [2, 3, 4], "what arrived meanwhile, up to the bound, in order"
    assert [n for b in batches for n in b] == list(range(1, 10)), "nothing lost, nothing twice"
    assert all(len(b) <= 3 for b in batches)
    assert stream.acked == [n for b in batches[:-1] for n in b], (
        "each batch acked once handled (not the last: left early)"
    )
