"""Time triggers on a real stack: many tasks due at one moment, owned by three scheduler nodes whose
clocks disagree by an injected offset (Settings.clock_offset_ms). Time only triggers an attempt; the
task's single owner decides, so each task runs once, early or late by at most its owner's skew."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from taskstream.connectors.kafka import consumer, make_codec
from taskstream.connectors.reading import end_offsets, read_to_end
from taskstream.schemas import records as r

from taskstream.core import events as e
from tests.conftest import Stack, running, wait_until
from tests.test_dispatch import Workers, all_succeeded, group_members, submit

pytestmark = pytest.mark.stack
SKEW_MS = 3_000
TASKS = 1_000


@pytest.fixture(scope="module")
def nodeless(tmp_path_factory: pytest.TempPathFactory, stack_kind: str) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp(f"triggers-{stack_kind}") / "state", stack_kind)
    # six partitions: each of three nodes owns some (with four, one was often left only standbys)
    s.env.update(TASKSTREAM_WORKERS="0", TASKSTREAM_PARTITIONS="6", TASKSTREAM_WORKER_SESSION_TIMEOUT_MS="6000")
    with running(s):
        yield s


def events_with_log_times(stack: Stack, task_ids: set[str]) -> dict[str, list[tuple[r.EventRecord, int]]]:
    """Each task's committed events from the log, each version once, with the time the broker was given
    the record carrying it (the producer's clock: the real one, never the injected skew)."""
    s = stack.settings
    codec = make_codec(s)
    c = consumer(s, f"triggers-{uuid.uuid4()}")
    out: dict[str, list[tuple[r.EventRecord, int]]] = {t: [] for t in task_ids}
    seen: set[str] = set()
    try:
        topic = s.topic("events")
        ends = end_offsets(c, topic, list(range(s.partitions)))
        for m in read_to_end(c, topic, dict.fromkeys(range(s.partitions), 0), ends=ends, timeout=60):
            for ev in r.task_events(codec.decode("event", m.value())):
                if ev.task_id in out and ev.event_id not in seen:
                    seen.add(ev.event_id)
                    out[ev.task_id].append((ev, m.timestamp()[1]))
    finally:
        c.close()
    return out


def test_a_thousand_tasks_due_at_once_on_three_skewed_nodes_each_run_once_within_the_skew(
    nodeless: Stack, tmp_path: Path
) -> None:
    workers = Workers(nodeless, tmp_path)
    try:
        for index, offset in enumerate((0, SKEW_MS, -SKEW_MS)):
            workers.start(index, env={"TASKSTREAM_CLOCK_OFFSET_MS": str(offset)})
        wait_until(lambda: group_members(nodeless) == 3, 60, "three nodes in the group")
        due = int(time.time() * 1000) + 10_000  # admitted before it, even on the fastest clock
        tasks = [{"name": f"t{i}", "call": "os:getpid", "not_before": due} for i in range(TASKS)]
        sid, ids = submit(nodeless, tasks)
        wait_until(lambda: all_succeeded(nodeless, sid, TASKS), 240, "every task to succeed", every=1.0)
    finally:
        workers.stop()

    log = events_with_log_times(nodeless, set(ids.values()))
    kinds = {t: Counter(type(ev.payload).__name__ for ev, _ in evs) for t, evs in log.items()}
    for tid, counted in kinds.items():  # once each, as the log says, and nothing fenced or expired
        assert [counted[k] for k in ("TaskReady", "TaskClaimed", "TaskStarted", "TaskSucceeded")] == [1] * 4, (
            tid,
            counted,
        )
        assert not counted["TaskLeaseExpired"] and not counted["CompletionRejected"], (tid, counted)
    late: dict[str, list[int]] = {}  # the deciding node -> how late each trigger was, real time
    for evs in log.values():
        ready, at = next((ev, ts) for ev, ts in evs if isinstance(ev.payload, e.TaskReady))
        assert ready.payload.reason == "earliest start time reached", ready
        late.setdefault(ready.node, []).append(at - due)
        started = next(ts for ev, ts in evs if isinstance(ev.payload, e.TaskStarted))
        assert started >= due - SKEW_MS - 500, f"started {due - started} ms before it was due"
    spread = {node: (min(v), sorted(v)[len(v) // 2], max(v)) for node, v in late.items()}
    print(f"\ntriggers by node (min, median, max ms late, real time): {spread}")
    assert sum(len(v) for v in late.values()) == TASKS
    assert len(late) >= 2, f"the skew needs nodes with different clocks deciding: {spread}"
    assert all(lo >= -SKEW_MS - 500 and hi <= SKEW_MS + 2_500 for lo, _, hi in spread.values()), spread
