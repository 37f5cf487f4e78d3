"""The lifecycle's keyed state (connectors/table_state.py): the same contract on a real Faust table's
RocksDB store and on the pure tests' dict, and what Faust itself then sees (its lookups, and the
persisted offset its changelog recovery reads on from)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import faust
import pytest
from faust.types import TP
from taskstream.connectors.table_state import MemoryState, TableState


def faust_table(tmp_path: Path) -> Any:
    app = faust.App("state-test", broker="kafka://127.0.0.1:1", store="rocksdb://", datadir=str(tmp_path))
    return app.Table("tasks", default=None, partitions=4, key_type=bytes, value_type=bytes)


@pytest.mark.parametrize("kind", ["rocksdb", "memory"])
def test_a_batch_is_written_to_its_partition_and_said_again_as_changelog_records(tmp_path: Path, kind: str) -> None:
    state: Any = TableState(faust_table(tmp_path)) if kind == "rocksdb" else MemoryState()
    topic = state.changelog_topic
    written = state.write(2, {b"a": b"1", b"b": b"2"})
    assert state.read(2, b"a") == b"1" and state.read(2, b"b") == b"2"
    assert state.read(2, b"zz") is None
    again = state.write(2, {b"a": b"3", b"b": None})  # a later batch: changed, and deleted
    assert state.read(2, b"a") == b"3" and state.read(2, b"b") is None
    if kind == "memory":
        assert written == again == [] and topic == ""  # no changelog
        return
    assert topic == "state-test-tasks-changelog"
    assert written == [(topic, 2, b"a", b"1"), (topic, 2, b"b", b"2")]
    assert again == [(topic, 2, b"a", b"3"), (topic, 2, b"b", None)], "a deleted key's record is a tombstone"
    assert state.read(1, b"a") is None, "each partition has a database of its own"


def test_faust_sees_what_was_written_and_recovers_from_the_offset_said_durable(tmp_path: Path) -> None:
    table = faust_table(tmp_path)
    state = TableState(table)
    state.write(3, {b"t1": b"record"})
    # Faust's own lookup without an event (the timers' firing uses it) finds the key in its partition
    found = table.data._get_bucket_for_key(b"t1")
    assert found is not None and found.value == b"record"
    tp = TP(state.changelog_topic, 3)
    assert table.data.persisted_offset(tp) is None
    state.persisted(3, 41)
    assert table.data.persisted_offset(tp) == 41, "recovery reads the changelog on from offset 42"
    state.write(3, {b"t1": None})
    assert table.data._get_bucket_for_key(b"t1") is None
