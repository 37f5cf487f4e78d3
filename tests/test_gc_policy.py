"""The collector's policy for long-running processes (taskstream/gc_policy.py), in a fresh interpreter
each, so that the test process's own collector is left as it is."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import gc, json, weakref
from taskstream import gc_policy

before = gc.get_threshold()
gc_policy.for_service()
class Node: pass
kept = [Node() for _ in range(1000)]  # start-up objects the process keeps
gc_policy.started()
frozen = gc.get_freeze_count()
a, b = Node(), Node()  # a cycle made after start-up, then dropped
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": frozen,
                  "kept_frozen": gc.get_freeze_count() >= len(kept), "cycle_freed": gone() is None}))
"""


def test_thresholds_freeze_and_later_cycles_still_collected() -> None:
    import json

    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    got = json.loads(out)
    from taskstream import gc_policy

    assert got["before"] == [700, 10, 10]  # CPython's defaults, which the policy replaces
    assert got["after"] == [gc_policy.YOUNG, gc_policy.MIDDLE, gc_policy.OLD]
    assert got["frozen"] > 1000 and got["kept_frozen"]
    assert got["cycle_freed"]  # garbage made after the freeze is still found
