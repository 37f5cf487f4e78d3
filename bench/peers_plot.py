"""The plots of a bench/peers.py results file (run in the peers' environment, which has matplotlib):
tasks per second of each system per workload, and the worker's CPU milliseconds per task.

    python bench/peers_plot.py bench/results/peers.json  ->  bench/results/peers-throughput.png, ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    path = Path(sys.argv[1])
    report = json.loads(path.read_text())
    stem = path.with_suffix("").name
    workloads = report["workloads"]
    systems = sorted({s for by in workloads.values() for s in by}, key=lambda s: (s != "taskstream", s))
    for key, label, name in (
        ("tasks_per_second", "tasks per second (median; bars: range)", "throughput"),
        ("worker_cpu_ms_per_task", "worker CPU ms per task (median)", "cpu"),
    ):
        fig, axes = plt.subplots(1, len(workloads), figsize=(3.2 * len(workloads), 3.6), squeeze=False)
        for ax, (workload, by) in zip(axes[0], workloads.items(), strict=True):
            xs, meds, lo, hi, colours = [], [], [], [], []
            for i, system in enumerate(systems):
                fig_ = by.get(system) or {}
                s = fig_.get(key) or {}
                if "unable" in fig_ or s.get("median") is None:
                    ax.text(i, 0, "unable" if "unable" in fig_ else "n/a", rotation=90, ha="center", va="bottom",
                            fontsize=8)  # fmt: skip
                    continue
                xs.append(i)
                meds.append(s["median"])
                lo.append(s["median"] - s["min"])
                hi.append(s["max"] - s["median"])
                colours.append("tab:orange" if system == "taskstream" else "tab:blue")
            ax.bar(xs, meds, yerr=[lo, hi], color=colours, capsize=3)
            ax.set_xticks(range(len(systems)), systems, rotation=30, ha="right", fontsize=8)
            ax.set_title(f"{workload} ({report['sizes'][workload]})", fontsize=9)
            ax.set_yscale("log")
        axes[0][0].set_ylabel(label, fontsize=8)
        fig.suptitle(f"{stem}: {report['when']}, {report['runs']} run(s) each", fontsize=9)
        fig.tight_layout()
        out = path.with_name(f"{stem}-{name}.png")
        fig.savefig(out, dpi=110)
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
