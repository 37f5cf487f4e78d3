"""The cyclic garbage collector's policy for the long-running processes (worker, projectors, admission).

With CPython's defaults (700, 10, 10) a worker running a 10,000-task DAG spent a fifth of its CPU in the
collector: ~1,450 young collections and 15 full ones, each full one 110-130 ms of CPU on this machine,
walking every object the process had built at start-up (Faust, aiokafka, its modules: ~250,000) while
the event loop stood still. The projectors spent about a sixth of theirs, mostly in young collections.

Two changes, both measured with a `gc.callbacks` probe over the same DAG run (docs/measurements.md):
- `for_service`: young collections every YOUNG container allocations instead of 700, so a few a
  second at full speed instead of a hundred;
- `started`: once the process holds what it keeps for its life, one full collection and then
  `gc.freeze()`, which takes those objects out of every later collection.
The worker's collector time fell from 1.75-2.3 s to 0.24-0.31 s of CPU over the run; a cycle of garbage
is still found, by the next young collection or, once it has survived two, by the next full one.
"""

from __future__ import annotations

import gc

YOUNG = 20_000  # container allocations between young collections (CPython's default: 700)
MIDDLE = 10  # young collections between middle ones (the default)
OLD = 10  # middle collections between full ones (the default; CPython also waits for 25% growth)


def for_service() -> None:
    """Set this process's collection thresholds; called first thing in a long-running process."""
    gc.set_threshold(YOUNG, MIDDLE, OLD)


def started() -> None:
    """Collect once and freeze what survives: the start-up's objects are never walked again."""
    gc.collect()
    gc.freeze()
