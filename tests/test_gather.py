"""The lifecycle's batches (streams/gather.py): what arrives while a batch is handled goes into the next
one, up to the bound; a batch does not wait once something has arrived; nothing is lost or repeated;
an event is acked once its batch has been handled. On a stand-in for the Faust stream's hooks that
`gathered` uses (the processors its drainer runs, one event at a time); the lifecycle's own use on a
real Faust stream is what every stack test of the dispatch modules goes through."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from taskstream.schemas import records as r
from taskstream.schemas.codec import Codec
from taskstream.streams.admission import CHUNK_TASKS
from taskstream.streams.context import EVENT_HEADER
from taskstream.streams.gather import gathered
from taskstream.streams.lifecycle import weight

from taskstream.core.model import TaskSpec


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


def test_a_batch_weighs_at_most_its_bound_and_an_event_heavier_than_that_comes_alone() -> None:
    """With a weight (the lifecycle's: a packed admission weighs the tasks it may pack), a batch holds
    what arrived while the one before was handled up to the bound in weight, not in events; an event
    heavier than the bound is a batch of its own rather than held for ever."""
    weights = {1: 1, 2: 3, 3: 2, 4: 2, 5: 9, 6: 1, 7: 1}

    async def main() -> list[list[int]]:
        stream = Stream()
        batches: list[list[int]] = []
        stream.queue.put_nowait(1)
        async with contextlib.aclosing(gathered(stream, 4, lambda event: weights[event.value])) as gathering:
            async for batch in gathering:
                batches.append([event.value for event in batch])
                if batches == [[1]]:
                    for n in range(2, 8):
                        stream.queue.put_nowait(n)
                    await asyncio.sleep(0.1)
                if sum(len(b) for b in batches) == len(weights):
                    break
        assert stream.drainer is not None
        stream.drainer.cancel()
        return batches

    batches = asyncio.run(asyncio.wait_for(main(), 20))
    assert batches == [[1], [2], [3, 4], [5], [6, 7]]


def test_the_lifecycle_weighs_a_packed_admission_as_about_the_tasks_it_packs_and_anything_else_as_one() -> None:
    codec = Codec({"event": 1}, lambda sid: pytest.fail("no lookup expected"))
    sid = str(uuid.uuid4())

    def admitted(n: int) -> bytes:
        tasks = tuple(r.AdmittedTask(str(uuid.uuid4()), TaskSpec(f"t{i}", "acme", ("true",)), (), (), sid)
                      for i in range(n))  # fmt: skip
        return codec.encode(r.EventRecord(f"{sid}:admitted:0:0", None, sid, 0, 1, "n", r.TasksAdmitted("n", tasks)))

    kind = [(EVENT_HEADER, b"TasksAdmitted")]
    for n in (1, 30, 200):  # no-op tasks: at least as many as it packs, and not many more
        assert n <= weight(kind, admitted(n)) <= n * 1.15, n
    assert weight(kind, admitted(CHUNK_TASKS)) == CHUNK_TASKS  # the most a record packs
    assert weight({EVENT_HEADER: b"TasksAdmitted"}, admitted(30)) == weight(kind, admitted(30))  # a dict
    assert weight(kind, b"x" * 10**7) == CHUNK_TASKS  # large specs: no more than a record packs
    assert weight([(EVENT_HEADER, b"TaskSubmitted")], admitted(30)) == 1  # any other event
    assert weight(None, admitted(30)) == 1  # an input: no headers
