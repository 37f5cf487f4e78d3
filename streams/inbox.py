"""Inputs handed to this worker's own task owner in-process, for tasks whose partition it holds.

A worker's executor reports on the tasks it runs (start, finish, heartbeats, claims, releases) to the
task's owner; the owner of a task that ends tells its dependents. Through the broker each such input is
a produce, a fetch and a delivery through Faust's machinery: about ten milliseconds on the way, and a
share of the worker's CPU per task (docs/measurements.md, "Inputs handed over in-process"). Where the
owner is this same worker, the input is handed over here instead:

- A report of this worker's own executor is not written to task-inputs at all. The owner's decision
  is what the log records (TaskStarted, TaskSucceeded, ...); the report itself only ever lived between
  the two, and they live and die in one process: if the worker dies before the decision is durable,
  the run's lease expires and the task runs again, as it would had the report been lost on its way.
- A signal the owner sends another task (PrerequisiteEnded, WatchPrerequisite) is written to
  task-inputs as before, so it survives this worker, and also decided in the same batch if the other
  task's partition is held here (`Lifecycle.on_batch`); its copy from the log arrives later and
  changes nothing.

Only while the partition is this worker's and no rebalance is under way (its state may be
recovering): otherwise, and for an input whose partition was given away before it was decided, the
input goes through the broker to whoever owns the partition then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field
from typing import Any

from taskstream.schemas import records as r


@dataclass
class LocalInput:
    """An input handed over in-process. It stands where a consumed message would: the topic and
    partition it would have been read from, its key; no offset; the record already decoded."""

    record: r.InputRecord
    topic: str
    partition: int
    logged: bool = False  # also written to task-inputs (its copy arrives later), or not at all
    codec: Any = None  # to give its bytes to the dead letters, should deciding it fail
    offset: int | None = None
    timestamp: float | None = None
    headers: dict[str, bytes] = field(default_factory=dict)

    @property
    def key(self) -> bytes:
        return self.record.task_id.encode()

    @property
    def value(self) -> bytes:
        return self.codec.encode(self.record) if self.codec is not None else b""


class Inbox:
    """Local inputs waiting for the owner's next batch, each with a future that is done once the batch
    that decided it is written (or once it was sent through the broker instead). The owner drains them
    into the batch it decides next, one consumed from the broker or, when none comes, one of its own."""

    def __init__(
        self, topic: str, partition_of: Callable[[str], int], held: Callable[[], Container[int]], codec: Any
    ) -> None:
        self.topic = topic  # task-inputs
        self.partition_of = partition_of  # task id -> its partition
        # the partitions this worker's lifecycle holds now (none while a rebalance runs): asked once for
        # all the inputs handed over together, not once each (the consumer's assignment is a new set of
        # every partition each time it is asked: 3% of a busy worker's time when asked per input)
        self.held = held
        self.codec = codec
        self.waiting: list[tuple[LocalInput, asyncio.Future[None]]] = []
        self.arrived = asyncio.Event()

    def local(self, recs: Iterable[r.InputRecord], logged: bool = False) -> list[LocalInput | None]:
        """Each input as a local one if its task's partition is held here now, else None (in order)."""
        held = self.held()
        out: list[LocalInput | None] = []
        for rec in recs:
            partition = self.partition_of(rec.task_id)
            out.append(LocalInput(rec, self.topic, partition, logged, self.codec) if partition in held else None)
        return out

    def put(self, item: LocalInput, fut: asyncio.Future[None] | None = None) -> asyncio.Future[None]:
        """Hand `item` over; `fut` (or a new future, returned) is done once it is decided and written."""
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
        self.waiting.append((item, fut))
        self.arrived.set()
        return fut

    def drain(self) -> list[tuple[LocalInput, asyncio.Future[None]]]:
        """What has arrived so far (perhaps nothing), in the order it did; the inbox is empty after."""
        self.arrived.clear()
        taken, self.waiting = self.waiting, []
        return taken

    async def wait(self) -> None:
        """Until something has arrived that is not drained yet."""
        while not self.waiting:
            self.arrived.clear()
            await self.arrived.wait()
