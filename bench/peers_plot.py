"""The plots of a bench/peers.py results file (run in the peers' environment, which has matplotlib):
tasks per second of each system per workload, the worker's CPU milliseconds per task, and the open-loop
submit -> start latency at each level; with --table, the figures as the Markdown tables
docs/benchmarks.md shows instead.

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
    """Per workload and system: tasks/s, seconds, worker CPU ms and peak RSS, service CPU ms per task and
    peak RSS, and taskstream's ratio to the peer (median tasks/s over median tasks/s); then the latency
    levels."""
    rows = ["| workload | system | tasks/s | seconds | worker CPU ms/task | worker peak RSS MiB | services CPU ms/task "
            "| services peak RSS MiB | taskstream / peer |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for workload, by in report["workloads"].items():
        for system, fig in by.items():
            size = report["sizes"][workload]
            name = f"{workload} ({size} s a level)" if workload == "latency" else f"{workload} ({size})"
            if "unable" in fig:
                rows.append(f"| {name} | {system} | unable: {fig['unable']} | | | | | | |")
                continue
            services = ", ".join(
                f"{k} {v['median']:.1f}" for k, v in fig["service_cpu_ms_per_task"].items() if v["median"]
            )
            rss = ", ".join(
                f"{k} {v['median']:.0f}" for k, v in fig.get("service_peak_rss_mib", {}).items() if v["median"]
            )
            ratio = report["ratios_taskstream_over_peer"][workload].get(system)
            ratio_cell = f"{ratio:.3f}" if isinstance(ratio, float) else "-"
            rows.append(
                f"| {name} | {system} | {cell(fig, 'tasks_per_second')} | {cell(fig, 'seconds', 2)} "
                f"| {cell(fig, 'worker_cpu_ms_per_task', 2)} | {cell(fig, 'worker_peak_rss_mib', 0)} | {services} "
                f"| {rss} | {'' if system == 'taskstream' or workload == 'latency' else ratio_cell} |"
            )
    latency = report["workloads"].get("latency")
    if latency:
        rows += ["", "| latency level | system | rate tasks/s | submit -> start p50 ms | p90 ms | p99 ms "
                 "| taskstream / peer, p50 and p99 |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for system, fig in latency.items():
            for level, lv in (fig.get("levels") or {}).items():
                r = (report["ratios_taskstream_over_peer"]["latency"].get(system) or {}).get(level) or {}
                ratio = (
                    ""
                    if system == "taskstream"
                    else " / ".join(f"{r[q]:.1f}" if r.get(q) else "-" for q in ("p50", "p99"))
                )
                rows.append(
                    f"| {level} | {system} | {cell(lv, 'rate_tasks_per_s')} | {cell(lv, 'p50')} | {cell(lv, 'p90')} "
                    f"| {cell(lv, 'p99')} | {ratio} |"
                )
    return "\n".join(rows)


def latency_plot(path: Path, report: dict, systems: list[str]) -> Path | None:
    """One panel per level: each system's median p50 (bar, range as whiskers) and median p99 (dot)."""
    latency = report["workloads"].get("latency")
    if not latency:
        return None
    levels = [f"{int(s * 100)}%" for s in report.get("latency_shares", (0.25, 0.5, 0.75))]
    fig, axes = plt.subplots(1, len(levels), figsize=(3.4 * len(levels), 3.6), squeeze=False)
    for ax, level in zip(axes[0], levels, strict=True):
        for i, system in enumerate(systems):
            lv = ((latency.get(system) or {}).get("levels") or {}).get(level) or {}
            p50, p99 = lv.get("p50") or {}, lv.get("p99") or {}
            if p50.get("median") is None:
                continue
            colour = "tab:orange" if system == "taskstream" else "tab:blue"
            ax.bar([i], [p50["median"]], yerr=[[p50["median"] - p50["min"]], [p50["max"] - p50["median"]]],
                   color=colour, capsize=3)  # fmt: skip
            if p99.get("median") is not None:
                ax.plot([i], [p99["median"]], "k_", markersize=14)
        ax.set_xticks(range(len(systems)), systems, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"at {level} of its own maximum", fontsize=9)
        ax.set_yscale("log")
        ax.set_xlim(-0.6, len(systems) - 0.4)
    axes[0][0].set_ylabel("submit -> start ms: p50 (bar), p99 (dash)", fontsize=8)
    fig.suptitle(f"{path.with_suffix('').name}: open loop, {report['when']}, {report['runs']} run(s)", fontsize=9)
    fig.tight_layout()
    out = path.with_name(f"{path.with_suffix('').name}-latency.png")
    fig.savefig(out, dpi=110)
    return out


def main() -> int:
    path = Path(sys.argv[1])
    report = json.loads(path.read_text())
    if "--table" in sys.argv[2:]:
        print(table(report))
        return 0
    stem = path.with_suffix("").name
    workloads = {w: by for w, by in report["workloads"].items() if w != "latency"}
    systems = sorted({s for by in report["workloads"].values() for s in by}, key=lambda s: (s != "taskstream", s))
    if (latency := latency_plot(path, report, systems)) is not None:
        print(latency)
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
