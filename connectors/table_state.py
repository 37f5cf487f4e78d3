"""The lifecycle's keyed state (task records, timers): read a key of one partition, write a batch.

`TableState` reads and writes a Faust table's RocksDB databases directly, a partition at a time, and
hands back the changelog records for the caller to produce with the batch's other writes. Faust's own
path per write was: its producer buffer, a FutureMessage and a callback per changelog record, the
record's offset written to RocksDB per record, the current event looked up for the partition; and two
RocksDB lookups per read (`in`, then `[]`). On these cores that was about a third of the worker's CPU
per no-op task (docs/measurements.md, "The lifecycle's state"). Here a read is one lookup in the
partition's database, a batch is one RocksDB write batch per partition, and the persisted offset is
set once per partition and batch, after its changelog records are durable.

What stays Faust's: the table's changelog topic and its recovery (on assignment Faust reads the
changelog from the persisted offset into the same databases before any input of the partition is
delivered), so a worker that takes a partition over finds what the last owner wrote. Values are the
raw bytes the table's raw serializers would write, so state written before this module existed reads
the same.

`MemoryState` is the same contract on a dict, for the pure tests.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

# (changelog topic, partition, key, value or None for a tombstone)
ChangelogRecord = tuple[str, int, bytes, bytes | None]


class KeyedState(Protocol):
    changelog_topic: str  # "" where there is none

    def read(self, partition: int, key: bytes) -> bytes | None: ...

    def write(self, partition: int, items: Mapping[bytes, bytes | None]) -> list[ChangelogRecord]: ...

    def changelog(self, partition: int, items: Mapping[bytes, bytes | None]) -> list[ChangelogRecord]: ...

    def persisted(self, partition: int, offset: int) -> None: ...

    def items(self) -> Iterator[tuple[bytes, bytes]]: ...


class TableState:
    """A Faust table (RocksDB store, raw keys and values) read and written by partition."""

    def __init__(self, table: Any) -> None:
        self.table = table

    @property
    def changelog_topic(self) -> str:
        return self.table.changelog_topic.get_topic_name()  # type: ignore[no-any-return]

    @property
    def _store(self) -> Any:
        return self.table.data  # the RocksDB store (faust.stores.rocksdb.Store)

    def read(self, partition: int, key: bytes) -> bytes | None:
        value = self._store._db_for_partition(partition).get(key)
        return value  # type: ignore[no-any-return]

    def write(self, partition: int, items: Mapping[bytes, bytes | None]) -> list[ChangelogRecord]:
        """Write the partition's keys (None: delete) in one RocksDB write batch; the changelog records
        that say the same, to be produced by the caller (then `persisted`)."""
        from rocksdict import WriteBatch

        store = self._store
        batch = WriteBatch(raw_mode=True)
        index = store._key_index  # which partition holds a key, for Faust's own reads without an event
        for key, value in items.items():
            if value is None:
                batch.delete(key)
                index.pop(key, None)
            else:
                batch.put(key, value)
                index[key] = partition
        store._db_for_partition(partition).write(batch)
        return self.changelog(partition, items)

    def changelog(self, partition: int, items: Mapping[bytes, bytes | None]) -> list[ChangelogRecord]:
        """The changelog records that say what `write` writes (sent before it: see streams/lifecycle.py)."""
        topic = self.changelog_topic
        return [(topic, partition, key, value) for key, value in items.items()]

    def persisted(self, partition: int, offset: int) -> None:
        """The changelog is durable up to `offset` in `partition`: Faust's recovery reads on from there."""
        from faust.types import TP

        self._store.set_persisted_offset(TP(self.changelog_topic, partition), offset)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every key of the partitions this worker holds, with its value."""
        for key, value in self.table.items():
            if value is not None:
                yield key, value


class MemoryState(dict):  # type: ignore[type-arg]
    """The same calls on a dict: no partitions, no changelog (the pure tests' state)."""

    changelog_topic = ""

    def read(self, partition: int, key: bytes) -> bytes | None:
        return self.get(key)  # type: ignore[no-any-return]

    def write(self, partition: int, items: Mapping[bytes, bytes | None]) -> list[ChangelogRecord]:
        for key, value in items.items():
            if value is None:
                self.pop(key, None)
            else:
                self[key] = value
        return []

    def changelog(self, partition: int, items: Mapping[bytes, bytes | None]) -> list[ChangelogRecord]:
        return []

    def persisted(self, partition: int, offset: int) -> None:
        pass

    def items(self) -> Iterator[tuple[bytes, bytes]]:  # type: ignore[override]
        yield from dict.items(self)
