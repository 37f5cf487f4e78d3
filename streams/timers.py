"""When each task's timer is due, without reading every timer at every tick.

The lifecycle agent keeps one timer per task in its `timers` table (what is due, for what purpose). The
worker's timer loop used to decode the whole table four times a second; with thousands of waiting tasks
(each with a recheck timer) that is most of a core. `TimerIndex` is a heap of (due, key) filled by the
agent as it sets timers and rebuilt from the table now and then (partitions taken over after a
rebalance bring timers this process never set). The table stays the truth: an entry popped from the
heap is fired only if the table still holds a timer for that key that is due.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable


class TimerIndex:
    def __init__(self) -> None:
        self._heap: list[tuple[int, bytes]] = []

    def note(self, key: bytes, due: int) -> None:
        heapq.heappush(self._heap, (due, key))

    def rebuild(self, timers: Iterable[tuple[bytes, int]]) -> None:
        self._heap = [(due, key) for key, due in timers]
        heapq.heapify(self._heap)

    def due(self, now: int) -> list[bytes]:
        """Keys with an entry due by `now` (each once; the caller checks them against the table)."""
        keys: set[bytes] = set()
        while self._heap and self._heap[0][0] <= now:
            keys.add(heapq.heappop(self._heap)[1])
        return sorted(keys)

    def __len__(self) -> int:
        return len(self._heap)
