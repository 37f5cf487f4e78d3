"""The benchmarks' shared helpers that a figure depends on (bench/_stack.py), without a stack."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any


def load_stack() -> Any:
    path = Path(__file__).resolve().parents[1] / "bench" / "_stack.py"
    spec = importlib.util.spec_from_file_location("bench_stack", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_speed_probe_samples_through_a_run_and_sums_up_what_it_saw() -> None:
    stack = load_stack()
    with stack.SpeedProbe(every=0.05) as probe:
        time.sleep(1.0)
    got = probe.summary()
    assert got["samples"] == len(probe.samples) >= 4  # ~17 in 1 s after the probe's start, fewer on a loaded machine
    assert all(x > 0 for x in probe.samples)
    assert got["min"] <= got["median"] <= got["max"]
    assert got["min"] == round(min(probe.samples), 2) and got["max"] == round(max(probe.samples), 2)


def test_a_run_shorter_than_the_probe_s_period_still_has_one_sample() -> None:
    stack = load_stack()
    probe = stack.SpeedProbe(every=60).start()
    probe.stop()
    assert len(probe.samples) == 1 and probe.summary()["samples"] == 1
