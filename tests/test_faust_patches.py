"""taskstream's changes to Faust (connectors/faust_patches.py), on Faust's own Consumer.ack."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

from faust.transport.consumer import Consumer
from faust.types import TP
from taskstream.connectors.faust_patches import ack_processed_only


def fake_consumer(generation: int) -> SimpleNamespace:
    """The state Consumer.ack reads and writes, for one topic whose acks count."""
    return SimpleNamespace(
        app=SimpleNamespace(consumer_generation_id=generation, topics=SimpleNamespace(acks_enabled_for=lambda t: True)),
        _committed_offset=defaultdict(lambda: None),
        _acked_index=defaultdict(set),
        _acked=defaultdict(list),
        _unacked_messages=set(),
        _n_acked=0,
        _waiting_for_ack=None,
    )


class Msg(SimpleNamespace):
    __hash__ = object.__hash__  # Consumer.ack keeps messages in a set


def message(offset: int, generation: int, tracked: bool = True) -> Msg:
    return Msg(
        tracked=tracked,
        acked=False,
        tp=TP("taskstream.task-inputs", 0),
        offset=offset,
        topic="taskstream.task-inputs",
        generation_id=generation,
    )


def test_a_message_the_stream_skipped_is_not_acked_so_its_offset_is_not_committed() -> None:
    """Faust skips (does not track, does not hand to the agent) a message that arrives during a
    rebalance, then acks it; refused, its offset stays uncommitted until it is fetched and processed."""
    ack_processed_only()
    ack_processed_only()  # twice changes nothing
    c = fake_consumer(generation=3)
    skipped, processed = message(4, generation=2, tracked=False), message(5, generation=3)
    assert Consumer.ack(c, skipped) is False  # type: ignore[arg-type]
    assert Consumer.ack(c, message(6, generation=3, tracked=False)) is False  # type: ignore[arg-type]
    assert Consumer.ack(c, processed) is True  # type: ignore[arg-type]
    tp = TP("taskstream.task-inputs", 0)
    assert c._acked[tp] == [5] and 4 not in c._acked_index[tp] and not skipped.acked
    # fetched again after the rebalance's seek and processed this time, it is acked
    assert Consumer.ack(c, message(4, generation=3)) is True  # type: ignore[arg-type]
    assert sorted(c._acked[tp]) == [4, 5]
