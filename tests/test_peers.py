"""The peers benchmark cannot rot: its short mode runs every workload on taskstream and on each peer,
and every pair has a figure (or the peer says why it cannot express the workload). Not the figures'
values: those belong to the benchmark (bench/peers.py, docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, jvm_problem

SYSTEMS = ("taskstream", "celery", "pgqueuer", "procrastinate")
WORKLOADS = ("burn_pre", "burn_live", "burn_single", "latency", "chain", "fan", "random_dag")
LEVELS = ("25%", "50%", "75%")


def test_the_quick_peers_run_has_a_figure_for_every_workload_on_every_system(tmp_path: Path) -> None:
    if why := jvm_problem():
        pytest.skip(f"taskstream's side runs on Apache Kafka and Neo4j, which cannot run here: {why}")
    out = tmp_path / "peers.json"
    done = subprocess.run(
        [sys.executable, "bench/peers.py", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["quick"] is True and set(report["durability"]) == set(SYSTEMS)
    for workload in WORKLOADS:
        for system in SYSTEMS:
            fig = report["workloads"][workload][system]
            if "unable" in fig:
                assert system != "taskstream", f"taskstream could not run {workload}"
                assert fig["unable"], f"{system} is unable to run {workload} without saying why"
                continue
            assert fig["failed_runs"] == 0, (workload, system, fig)
            if workload == "latency":  # a submit -> start figure at each level, at rates that rise
                assert list(fig["levels"]) == list(LEVELS), (system, fig)
                rates = [fig["levels"][lv]["rate_tasks_per_s"]["median"] for lv in LEVELS]
                assert 0 < rates[0] < rates[1] < rates[2], (system, rates)
                assert all(fig["levels"][lv]["p50"]["median"] > 0 for lv in LEVELS), (system, fig["levels"])
            else:
                assert fig["tasks_per_second"]["median"] > 0, (workload, system, fig)
            assert all(run["ran"] == run["tasks"] for run in fig["runs"]), (workload, system, fig["runs"])
            assert fig["worker_peak_rss_mib"]["median"] > 0 and fig["worker_cpu_ms_per_task"]["median"] > 0
            probe = fig["speed_probe_ms"]  # the machine's speed through each run, to read the figure by
            assert probe["median"] > 0 and len(probe["runs"]) == len(fig["runs"]), (workload, system, probe)
            services = fig["service_peak_rss_mib"]
            assert services and all(v["median"] > 0 for v in services.values()), (workload, system, services)
    able = {s for s in SYSTEMS[1:] for w in WORKLOADS if "unable" not in report["workloads"][w][s]}
    assert able == set(SYSTEMS[1:]), "every peer ran some workload"
    ratios = report["ratios_taskstream_over_peer"]
    assert ratios["burn_live"]["celery"] is not None and ratios["random_dag"]["celery"] is None
    assert ratios["latency"]["pgqueuer"]["50%"]["p50"] is not None
    for plot in ("throughput", "cpu", "latency"):
        assert (tmp_path / f"peers-{plot}.png").stat().st_size > 1000
