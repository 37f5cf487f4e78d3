"""When a schedule is due: cron times read in a time zone, as pure functions of the times passed in.

A schedule's owner keeps the next time it is due (streams/lifecycle.py). At that time, on its own clock,
it submits the schedule's DAG once for that time, with an idempotency key naming it, so a second
firing for the same time (a redelivered timer, an owner let go on) admits nothing twice. Times missed
while no node ran are submitted late if they are less than a minute old (`CATCH_UP_MS`); older ones
are skipped: a stack down for a day does not submit a day's worth at once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from taskstream.core.submission import NAME_RE


def problems(tenant: str, name: str, cron: str, timezone: str) -> list[tuple[str, str]]:
    """(field, reason) for each thing wrong with a schedule's timing and names; empty if none."""
    out = []
    if not tenant or not NAME_RE.match(tenant):
        out.append(("tenant", f"must be a non-empty identifier, got {tenant!r}"))
    if not name or not NAME_RE.match(name):
        out.append(("name", f"must be 1-128 characters of letters, digits, '_', '.', ':', '-', got {name!r}"))
    if not croniter.is_valid(cron):
        out.append(("cron", f"is not a cron expression (five fields, or six with seconds last): {cron!r}"))
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        out.append(("timezone", f"is not a time zone this machine knows (e.g. UTC, Europe/Berlin): {timezone!r}"))
    return out


def next_due(cron: str, timezone: str, after_ms: int) -> int:
    """The first time after `after_ms` (epoch ms) that `cron` names, read in `timezone`."""
    start = datetime.fromtimestamp(after_ms / 1000, UTC).astimezone(ZoneInfo(timezone))
    return int(croniter(cron, start).get_next(float) * 1000)


CATCH_UP_MS = 60_000  # times missed by less than this are still submitted, late; older ones are skipped


def fire(cron: str, timezone: str, due_ms: int, at_ms: int) -> tuple[int | None, int]:
    """A timer for `due_ms` went off at `at_ms`: (the time to submit for, or None if it is not due yet;
    the next time to be due). A late timer submits for its own time; the times after it that are
    already past come next, one by one, if they are less than CATCH_UP_MS old, and are skipped if
    older (a stack down for a day does not submit a day's worth at once)."""
    if at_ms < due_ms:
        return None, due_ms
    following = next_due(cron, timezone, due_ms)
    if following < at_ms - CATCH_UP_MS:
        following = next_due(cron, timezone, at_ms - CATCH_UP_MS)
    return due_ms, following


def iso(ms: int, timezone: str) -> str:
    """`ms` as an ISO-8601 time in the schedule's zone (the label each of its submissions carries)."""
    return datetime.fromtimestamp(ms / 1000, UTC).astimezone(ZoneInfo(timezone)).isoformat(timespec="milliseconds")
