"""Tenants and their tiers (the seed's subscription levels), pure.

A tier gives a tenant its defaults: a cap on the tasks it has queued, claimed or running at once, and a
weight, its share of the workers' capacity relative to other tenants' when more is ready than fits (the
batcher, taskstream/core/batcher.py). `taskstream tenants set NAME --tier T` creates or changes a
tenant; `--max-running N`, `--no-cap` and `--weight W` set its own cap or weight instead of the tier's.

Under TASKSTREAM_TENANTS=open (the default) a submission's tenant that was never set is taken as it
comes, at the standard tier; under `closed`, admission rejects it and names the command that creates it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from taskstream.core.submission import NAME_RE


@dataclass(frozen=True, slots=True)
class Tier:
    max_running: int | None  # None: no cap
    weight: float


TIERS: dict[str, Tier] = {
    "free": Tier(max_running=10, weight=1.0),
    "standard": Tier(max_running=None, weight=1.0),
    "premium": Tier(max_running=None, weight=4.0),
}
DEFAULT_TIER = "standard"  # what a tenant never set is, under TASKSTREAM_TENANTS=open
MAX_WEIGHT = 1_000.0


@dataclass(frozen=True, slots=True)
class TenantTerms:
    """A tenant as set: its tier, its cap (None: none) and weight, the tier's defaults applied."""

    tenant: str
    tier: str
    max_running: int | None
    weight: float


def resolve(
    tenant: str, tier: str, max_running: int | None, no_cap: bool, weight: float | None
) -> tuple[TenantTerms | None, list[tuple[str, str]]]:
    """The terms a SetTenant asks for, or (None, the (field, reason) of each thing wrong with it)."""
    problems: list[tuple[str, str]] = []
    if not tenant or not NAME_RE.match(tenant):
        problems.append(("tenant", f"must be 1-128 characters of letters, digits, '_', '.', ':', '-', got {tenant!r}"))
    if tier not in TIERS:
        problems.append(("tier", f"must be one of {', '.join(TIERS)}, got {tier!r}"))
    if max_running is not None and max_running < 0:
        problems.append(("max_running", f"must be 0 or more, got {max_running}"))
    if max_running is not None and no_cap:
        problems.append(("max_running", "is given together with no_cap: choose one"))
    if weight is not None and not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
        problems.append(("weight", f"must be above 0 and at most {MAX_WEIGHT:g}, got {weight!r}"))
    if problems:
        return None, problems
    t = TIERS[tier]
    cap = None if no_cap else (max_running if max_running is not None else t.max_running)
    return TenantTerms(tenant, tier, cap, weight if weight is not None else t.weight), []


def unknown(tenant: str) -> str:
    """The reason a submission of a tenant never set is rejected (TASKSTREAM_TENANTS=closed)."""
    return (
        f"tenant {tenant!r} does not exist here; create it with `taskstream tenants set {tenant} --tier "
        f"{DEFAULT_TIER}` (tiers: {', '.join(TIERS)})"
    )
