"""The resource manager's decisions, pure: who watches which worker, and which running task is over a limit.

Every worker process is also a resource manager node. Each watches a share of the live workers, and
never itself while another node is live (the resource manager is itself watched): worker W is watched by
the live node N other than W with the highest rendezvous score hash(W, N). Every node computes the map
from the same advertisements, so the nodes agree without talking; when a node dies, only the workers it
watched move, each to the node with its next-highest score. Views differ for a moment when a node comes
or goes (two nodes may both watch a worker, or none for up to one advertisement period): a kill ordered
twice is decided once by the task's owner, and a moment without a watcher is shorter than any cap.

Watching means reading what each worker reports of its running tasks with its advertisement (resident
memory of the task's processes, how long it has run) and ordering the kill of a run over its limits:
resident memory above `memory_ratio` times the memory it asked for, or a run past its execution cap
that its worker did not end (the worker kills at the cap itself; this is the order when that failed).

No I/O and no clock: streams/resources.py reads the adverts and sends the orders.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MEMORY = "memory"
EXECUTION_CAP = "execution_cap"


def _score(worker: str, node: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{worker}\0{node}".encode(), digest_size=8).digest(), "big")


def watchers(nodes: Iterable[str], workers: Iterable[str] | None = None) -> dict[str, str]:
    """worker -> the node that watches it, given the live nodes (by default the workers are the nodes;
    a stopping worker still runs tasks while it drains, so it is watched but watches nothing). A lone
    node watches itself (no other is there to)."""
    live = sorted(set(nodes))
    out = {}
    for w in sorted(set(workers)) if workers is not None else live:
        others = [n for n in live if n != w] or [n for n in live if n == w]
        if others:
            out[w] = max(others, key=lambda n: (_score(w, n), n))
    return out


def watched_by(node: str, nodes: Iterable[str], workers: Iterable[str] | None = None) -> list[str]:
    """The workers `node` watches, given the live nodes (and workers)."""
    return sorted(w for w, n in watchers(nodes, workers).items() if n == node)


@dataclass(frozen=True, slots=True)
class Run:
    """One running task, as its worker reported it in its advertisement."""

    task_id: str
    claim_id: str
    pid: int
    ran_ms: int  # how long it has run, by the worker's own clock (no skew between nodes in it)
    cap_ms: int  # its execution cap
    memory_mb: int  # the memory it asked for
    rss_mb: float  # resident memory of its processes when reported


@dataclass(frozen=True, slots=True)
class Over:
    """A run to kill, and why."""

    run: Run
    limit: str  # MEMORY or EXECUTION_CAP
    reason: str


def over_limits(runs: Iterable[Run], memory_ratio: float, cap_slack_ms: int) -> list[Over]:
    """The runs over a limit. `memory_ratio`: a run is over once its resident memory passes this multiple
    of what it asked for (0: memory is not watched). `cap_slack_ms`: how long after its cap a run may
    still be reported (its worker's kill grace and an advertisement period) before it is ordered killed."""
    out = []
    for run in runs:
        limit_mb = run.memory_mb * memory_ratio
        if memory_ratio > 0 and run.memory_mb > 0 and run.rss_mb > limit_mb:
            why = (
                f"over its memory limit: {run.rss_mb:.0f} MB resident, the limit is {limit_mb:.0f} MB "
                f"({memory_ratio:g} x the {run.memory_mb} MB it asked for)"
            )
            out.append(Over(run, MEMORY, why))
        elif run.ran_ms > run.cap_ms + cap_slack_ms:
            why = f"still running {run.ran_ms / 1000:.1f}s into an execution cap of {run.cap_ms / 1000:g}s"
            out.append(Over(run, EXECUTION_CAP, why))
    return out


def runs_of(advert: Mapping[str, object]) -> list[Run]:
    """The runs a worker's advertisement reports (none from a worker that reports none). Malformed entries
    are skipped: an advertisement is a worker's say-so, and one bad entry must not hide the others."""
    out = []
    for item in advert.get("running") or ():  # type: ignore[attr-defined]
        try:
            out.append(
                Run(
                    str(item["task"]),
                    str(item["claim"]),
                    int(item["pid"]),
                    int(item["ran_ms"]),
                    int(item["cap_ms"]),
                    int(item["memory_mb"]),
                    float(item["rss_mb"]),
                )  # fmt: skip
            )
        except (KeyError, TypeError, ValueError):
            continue
    return out
