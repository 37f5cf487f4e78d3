"""Schedules' timing, pure: cron times read in a time zone, a late timer, what is refused and why."""

from __future__ import annotations

from datetime import UTC, datetime

from taskstream.core.schedule import fire, iso, next_due, problems


def ms(*parts: int) -> int:
    return int(datetime(*parts, tzinfo=UTC).timestamp() * 1000)


def test_cron_times_are_read_in_the_schedule_s_time_zone_across_daylight_saving() -> None:
    # 09:00 in New York is 14:00 UTC in January and 13:00 UTC in July
    assert next_due("0 9 * * *", "America/New_York", ms(2026, 1, 15)) == ms(2026, 1, 15, 14)
    assert next_due("0 9 * * *", "America/New_York", ms(2026, 7, 15)) == ms(2026, 7, 15, 13)
    assert next_due("0 9 * * *", "UTC", ms(2026, 7, 15, 9)) == ms(2026, 7, 16, 9)  # strictly after
    assert next_due("* * * * * */2", "UTC", ms(2026, 1, 1) + 500) == ms(2026, 1, 1) + 2000  # seconds last
    assert iso(ms(2026, 7, 15, 13), "Europe/Berlin") == "2026-07-15T15:00:00.000+02:00"


def test_a_timer_fires_for_its_own_time_once_and_a_late_one_skips_the_times_missed() -> None:
    due = ms(2026, 1, 1, 0, 5)
    assert fire("*/5 * * * *", "UTC", due, due - 1) == (None, due)  # not yet: wait for it
    assert fire("*/5 * * * *", "UTC", due, due + 30) == (due, ms(2026, 1, 1, 0, 10))
    # late by less than a minute past the next time: that one is still submitted, next
    assert fire("*/5 * * * *", "UTC", due, ms(2026, 1, 1, 0, 10, 30)) == (due, ms(2026, 1, 1, 0, 10))
    # down for three hours: one submission for the time it was due, then on from a minute ago
    assert fire("*/5 * * * *", "UTC", due, ms(2026, 1, 1, 3, 2)) == (due, ms(2026, 1, 1, 3, 5))
    assert fire("* * * * * */2", "UTC", due, due + 100_000) == (due, due + 40_000 + 2_000)


def test_bad_names_cron_expressions_and_zones_are_each_named() -> None:
    assert problems("acme", "nightly", "0 2 * * *", "Europe/Berlin") == []
    found = dict(problems("a b", "x/y", "61 * * * *", "Mars/Olympus"))
    assert set(found) == {"tenant", "name", "cron", "timezone"}
    assert "'61 * * * *'" in found["cron"] and "'Mars/Olympus'" in found["timezone"]


def test_the_example_schedule_file_is_a_valid_schedule() -> None:
    from pathlib import Path

    import yaml

    from taskstream.core.submission import check_submission, parse_document

    doc = yaml.safe_load((Path(__file__).parent.parent / "examples" / "nightly-schedule.yaml").read_text())
    timing = doc.pop("schedule")
    sub = parse_document(doc)
    assert problems(sub.tenant, timing["name"], timing["cron"], timing["timezone"]) == []
    assert check_submission(sub) == [] and [t.name for t in sub.tasks] == ["extract", "report"]
