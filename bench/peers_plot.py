"""The plots of a bench/peers.py results file (run in the peers' environment, which has matplotlib):
tasks per second of each system per workload, and the worker's CPU milliseconds per task; with
--table, the figures as the Markdown table docs/benchmarks.md shows instead.

    python bench/peers_plot.py bench/results/peers.json  ->  bench/results/peers-throughput.png, ...
    python bench/peers_plot.py bench/results/peers.json --table
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def cell(fig: dict, key: str, digits: int = 1) -> str:
    s = fig.get(key) or {}
    if s.get("median") is None:
        return "-"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def table(report: dict) -> str:
    """Per workload and system: tasks/s, seconds, worker CPU ms and peak RSS, service CPU ms per task, and
    taskstream's ratio to the peer (median tasks/s over median tasks/s)."""
    rows = ["| workload | system | tasks/s | seconds | worker CPU ms/task | worker peak RSS MiB | services CPU ms/task "
            "| taskstream / peer |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for workload, by in report["workloads"].items():
        for system, fig in by.items():
            name = f"{workload} ({report['sizes'][workload]})"
            if "unable" in fig:
                rows.append(f"| {name} | {system} | unable: {fig['unable']} | | | | | |")
                continue
            services = ", ".join(
                f"{k} {v['median']:.1f}" for k, v in fig["service_cpu_ms_per_task"].items() if v["median"]
            )
            ratio = report["ratios_taskstream_over_peer"][workload].get(system)
            rows.append(
                f"| {name} | {system} | {cell(fig, 'tasks_per_second')} | {cell(fig, 'seconds', 2)} "
                f"| {cell(fig, 'worker_cpu_ms_per_task', 2)} | {cell(fig, 'worker_peak_rss_mib', 0)} | {services} "
                f"| {'' if system == 'taskstream' else (f'{ratio:.3f}' if ratio is not None else '-')} |"
            )
    return "\n".join(rows)


def main() -> int:
    path = Path(sys.argv[1])
    report = json.loads(path.read_text())
    if "--table" in sys.argv[2:]:
        print(table(report))
        return 0
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
                    ax.text(i, 1.2, "unable" if "unable" in fig_ else "n/a", rotation=90, ha="center", va="bottom",
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
            top = max([m + h for m, h in zip(meds, hi, strict=True)] or [10])
            ax.set_ylim(1, top * 3)
            ax.set_xlim(-0.6, len(systems) - 0.4)
        axes[0][0].set_ylabel(label, fontsize=8)
        fig.suptitle(f"{stem}: {report['when']}, {report['runs']} run(s) each", fontsize=9)
        fig.tight_layout()
        out = path.with_name(f"{stem}-{name}.png")
        fig.savefig(out, dpi=110)
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
