"""The batcher's pure decision (taskstream/core/batcher.py): K, rank order, tenant caps and weights, fit."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from taskstream.schemas import records as r

from taskstream.core import events as e
from taskstream.core.batcher import Candidate, Departures, Offer, Promotions, margin, plan, room, route
from taskstream.core.submission import parse_document
from taskstream.sdk import Client
from tests.conftest import Stack, gated, running, wait_until
from tests.test_dispatch import Workers, all_succeeded, history, story, submit

SMALL = Offer("w1", slots=4, claim_ahead=2, cpus=4.0, memory_mb=8192, gpus=0)
GPU = Offer("w2", slots=2, claim_ahead=0, cpus=8.0, memory_mb=65536, gpus=2)


def cands(tenant: str, n: int, **need: float) -> list[Candidate]:
    return [Candidate(f"{tenant}-{i}", tenant, **need) for i in range(n)]  # type: ignore[arg-type]


def test_k_is_what_the_live_workers_take_less_what_is_taken() -> None:
    assert room([SMALL, GPU], batch_ahead=3, occupied=0) == (4 + 2 + 3) + (2 + 0 + 3)
    assert room([SMALL, GPU], batch_ahead=3, occupied=10) == 4
    assert room([SMALL], batch_ahead=0, occupied=50) == 0  # more taken than offered: none, never negative
    assert room([], batch_ahead=16, occupied=0) == 0  # no live worker: nothing is promoted


def test_the_margin_grows_with_the_rate_of_promotions_shared_among_the_workers_within_its_bounds() -> None:
    assert margin(0.0, 1, 64, 256) == 64  # nothing promoted lately (slow tasks, or a start): batch_ahead
    assert margin(2.0, 1, 64, 256) == 64  # slow tasks: a later, more urgent one waits behind few
    assert margin(290.0, 1, 64, 256, lag_s=0.5) == 160  # 145 a worker, up to the next step of 16
    assert margin(290.0, 2, 64, 256, lag_s=0.5) == 80  # shared among two workers
    assert margin(2000.0, 1, 64, 256) == 256  # never beyond batch_ahead_max
    assert margin(2000.0, 1, 64, 64) == 64 and margin(2000.0, 1, 64, 16) == 64  # max at or below: fixed
    assert margin(2000.0, 0, 64, 256) == 64  # no live worker


def test_the_rate_of_promotions_counts_the_last_window_only() -> None:
    p = Promotions(window_s=5.0)
    assert p.rate(100.0) == 0.0
    p.add(100.0, 50)
    p.add(102.0, 0)  # a round that promoted nothing adds nothing
    p.add(103.0, 100)
    assert p.rate(105.0) == 30.0  # 150 over the 5 s since the first
    assert p.rate(106.0) == pytest.approx(100 / 3)  # the first is out of the window: 100 over 3 s
    assert p.rate(108.0) == 20.0
    assert p.rate(200.0) == 0.0


def test_the_rate_of_a_burst_after_a_quiet_spell_is_its_own() -> None:
    p = Promotions(window_s=5.0)
    p.add(100.0, 300)
    assert p.rate(100.0) == 300.0  # one round: over at least a second, not a rate of its own
    assert p.rate(100.5) == 300.0
    p.add(101.0, 300)
    assert p.rate(102.0) == 300.0  # 600 over the 2 s since the burst began, not over the whole window
    p.add(110.0, 10)
    assert p.rate(110.0) == 10.0  # the burst is out of the window: the next round's alone


def test_a_task_seen_leaving_is_remembered_until_the_read_model_has_had_time_to_show_it() -> None:
    d = Departures(keep_s=30.0)
    d.leave("a", 100.0)
    d.leave("b", 110.0)
    assert "a" in d and "b" in d and "c" not in d
    d.back("b")  # queued again (a retry): working again
    assert "b" not in d
    d.expire(129.0)
    assert "a" in d
    d.expire(131.0)  # 30 s on: the read model speaks for it again
    assert "a" not in d and len(d) == 0
    d.leave("c", 140.0)
    d.back("c")
    d.leave("c", 160.0)  # left again later: kept from then, not from the first time
    d.expire(175.0)
    assert "c" in d
    d.expire(191.0)
    assert "c" not in d


def test_one_tenant_gets_the_top_k_in_rank_order() -> None:
    c = cands("a", 10)
    chosen, too_big = plan(c, 4, {}, {}, [SMALL])
    assert chosen == c[:4] and too_big == []


def test_a_cap_stops_a_tenant_and_its_share_goes_to_the_others() -> None:
    a, b = cands("a", 10), cands("b", 10)
    ranked = [x for pair in zip(a, b, strict=True) for x in pair]
    chosen, _ = plan(ranked, 8, {"a": 2}, {}, [SMALL])
    assert [x.task_id for x in chosen if x.tenant == "a"] == ["a-0", "a-1"]
    assert [x.task_id for x in chosen if x.tenant == "b"] == [f"b-{i}" for i in range(6)]


def test_a_flooding_tenant_does_not_crowd_out_the_others_and_weights_set_the_shares() -> None:
    flood = cands("flood", 1000)
    late = cands("gold", 50) + cands("std", 50)  # ranked after every flood task (later deadlines)
    chosen, _ = plan(flood + late, 40, {}, {"gold": 2.0}, [SMALL])
    count = {t: sum(1 for x in chosen if x.tenant == t) for t in ("flood", "gold", "std")}
    assert count == {"flood": 10, "gold": 20, "std": 10}  # 1 : 2 : 1


def test_what_a_tenant_already_holds_counts_towards_its_share() -> None:
    """Room for one: it goes to the tenant furthest below its share of the working set, not the first
    in rank; with enough room the shares of the whole working set follow the weights."""
    flood, other = cands("flood", 100), cands("other", 10)
    chosen, _ = plan(flood + other, 1, {}, {}, [SMALL], holding={"flood": 5, "other": 1})
    assert chosen == other[:1]
    chosen, _ = plan(flood + other, 6, {}, {"other": 3.0}, [SMALL], holding={"flood": 6})
    assert [x.tenant for x in chosen].count("other") == 6  # 6 : 6 (its weight 3 to flood's 1 asks for 18)
    chosen, _ = plan(flood + other, 10, {}, {"other": 3.0}, [SMALL], holding={"flood": 2, "other": 2})
    assert [x.tenant for x in chosen].count("other") == 9  # then 3 : 11 of 14, the nearest to 1 : 3


def test_a_task_no_live_worker_fits_waits_and_smaller_ones_go_past_it() -> None:
    big = Candidate("big", "a", cpu=1.0, memory_mb=256, gpu=1)
    rest = cands("a", 3)
    chosen, too_big = plan([big, *rest], 3, {}, {}, [SMALL])
    assert too_big == [big] and chosen == rest
    chosen, too_big = plan([big, *rest], 3, {}, {}, [SMALL, GPU])  # a gpu worker is live: it fits
    assert too_big == [] and chosen == [big, *rest[:2]]


def test_a_task_goes_to_a_lane_all_of_whose_workers_fit_it_the_least_loaded_of_those() -> None:
    """A lane is read by every worker that names it, so a task goes only where every reader fits it;
    among those, the fewest queued per place wins, counting this round's; a task no lane fits whole
    goes where the largest share of its readers fit."""
    small = Offer("s", 2, 1, 2.0, 4096, 0)  # reads the default lane only
    big = Offer("b", 2, 1, 8.0, 32768, 0, ("default", "big"))
    bigger = Offer("bb", 2, 1, 16.0, 65536, 0, ("default", "big"))
    wide = Candidate("wide", "a", cpu=4.0)
    assert route([wide], [small, big], {}) == ["big"]  # the default lane has a reader too small for it
    narrow = cands("a", 4, cpu=0.5)
    # default: 6 places (small, big), big: 3; each goes where the queue per place is shortest (3/6 against
    # 0/3, then 1/3, then 2/3 against 3/6, then a tie of 2/3: the default lane)
    assert route(narrow, [small, big], {"default": 3, "big": 0}) == ["big", "big", "default", "default"]
    assert route(narrow[:1], [small, big], {}) == ["default"]  # a tie: the default lane
    huge = Candidate("huge", "a", cpu=12.0)  # only `bigger` fits: no lane fits whole
    assert route([huge], [small, big, bigger], {}) == ["big"]  # 1 of 2 readers fit, against 1 of 3
    assert route([wide], [], {}) == ["default"]
    assert route([], [small, big], {}) == []


def test_a_task_needing_worker_labels_fits_only_workers_advertising_each_of_them() -> None:
    eu = Offer("eu", 2, 1, 4.0, 8192, 0, labels=(("disk", "ssd"), ("zone", "eu")))
    us = Offer("us", 2, 1, 4.0, 8192, 0, ("default", "us"), labels=(("zone", "us"),))
    needs_eu = Candidate("a", "t", labels=(("zone", "eu"),))
    needs_ssd_us = Candidate("b", "t", labels=(("disk", "ssd"), ("zone", "us")))
    chosen, too_big = plan([needs_eu, needs_ssd_us], 5, {}, {}, [eu, us])
    assert chosen == [needs_eu] and too_big == [needs_ssd_us]
    assert route([needs_eu, Candidate("c", "t", labels=(("zone", "us"),))], [eu, us], {}) == ["default", "us"]


@st.composite
def rounds(draw: st.DrawFn) -> tuple[list[Candidate], int, dict[str, int | None], dict[str, float]]:
    tenants = draw(st.lists(st.sampled_from("abcde"), min_size=1, max_size=5, unique=True))
    n = draw(st.integers(0, 60))
    ranked = [
        Candidate(f"t{i}", draw(st.sampled_from(tenants)), gpu=draw(st.sampled_from([0, 0, 0, 1, 3]))) for i in range(n)
    ]
    caps = {t: draw(st.none() | st.integers(0, 20)) for t in tenants}
    weights = {t: draw(st.floats(0.1, 10)) for t in tenants}
    return ranked, draw(st.integers(0, 80)), caps, weights


@given(rounds())
def test_a_round_keeps_every_bound_and_leaves_no_room_unused_that_a_candidate_could_take(
    case: tuple[list[Candidate], int, dict[str, int | None], dict[str, float]],
) -> None:
    ranked, k, caps, weights = case
    chosen, too_big = plan(ranked, k, caps, weights, [SMALL, GPU])
    assert len(chosen) <= k
    assert all(c.gpu <= 2 for c in chosen) and all(c.gpu > 2 for c in too_big)
    rank = {c.task_id: i for i, c in enumerate(ranked)}
    assert [rank[c.task_id] for c in chosen] == sorted(rank[c.task_id] for c in chosen)  # rank order
    for tenant, cap in caps.items():
        fitting = [c for c in ranked if c.tenant == tenant and c.gpu <= 2]
        mine = [c for c in chosen if c.tenant == tenant]
        assert mine == fitting[: len(mine)]  # a tenant's best first
        assert cap is None or len(mine) <= cap
        if len(chosen) < k:  # room left over: this tenant had nothing more it was allowed
            assert len(mine) == len(fitting) or (cap is not None and len(mine) == cap)


# ---- on a real stack ---------------------------------------------------------------------------------
# One worker with 2 slots, claim_ahead 1, 2 cpus, and a batcher keeping 2 more queued (never widened): K = 5. Tenants
# closed: only tenants set by command are admitted (`dispatch`, which test_dispatch.submit uses, is set).
SLOTS, AHEAD, BATCH_AHEAD, CPUS = 2, 1, 2, 2.0
K = SLOTS + AHEAD + BATCH_AHEAD


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, stack_kind: str) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp(f"batcher-{stack_kind}") / "state", stack_kind)
    s.env.update(
        TASKSTREAM_WORKER_SLOTS=str(SLOTS),
        TASKSTREAM_CLAIM_AHEAD=str(AHEAD),
        TASKSTREAM_BATCH_AHEAD=str(BATCH_AHEAD),
        TASKSTREAM_BATCH_AHEAD_MAX=str(BATCH_AHEAD),  # a fixed margin: K stays 5 however fast tasks go
        TASKSTREAM_WORKER_CPUS=str(CPUS),
        TASKSTREAM_TENANTS="closed",
        TASKSTREAM_WORKER_LABELS="zone=[red]lab",  # markup in a label is printed as it is
        # every promoted task goes through the queue, whose bounds these tests check (a worker alone
        # claims promoted tasks for itself by default: LocalClaims, tested in test_e2e and test_dispatch)
        TASKSTREAM_LOCAL_CLAIMS="0",
    )
    with running(s):
        s.cli("tenants", "set", "dispatch", "--tier", "standard")
        yield s


def statuses(stack: Stack, ids: Iterable[str]) -> dict[str, str]:
    with psycopg.connect(stack.settings.dsn, autocommit=True) as conn:
        got = conn.execute("SELECT task_id::text, status FROM tasks WHERE task_id = ANY(%s::uuid[])", (list(ids),))
        return dict(got.fetchall())  # type: ignore[arg-type]


def working(stack: Stack) -> dict[str, list[str]]:
    """The tasks not ended, by status, as the read model has them: what a wait that timed out saw."""
    with psycopg.connect(stack.settings.dsn, autocommit=True) as conn:
        got = conn.execute(
            "SELECT status, array_agg(name || '@' || attempt ORDER BY name) FROM tasks"
            " WHERE status IN ('READY', 'QUEUED', 'CLAIMED', 'RUNNING', 'RETRY_WAIT') GROUP BY status"
        )
        return dict(got.fetchall())  # type: ignore[arg-type]


def priority(stack: Stack, task_id: str) -> int | None:
    with psycopg.connect(stack.settings.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT priority FROM tasks WHERE task_id = %s::uuid", (task_id,)).fetchone()
        return None if row is None else row[0]


def busy(stack: Stack, gate: Path) -> dict[str, str]:
    """K tasks running until `gate` exists (cpu 0.5 each), once the read model shows none of them waiting."""
    _, ids = submit(stack, [{"name": f"busy{i}", "argv": gated(gate), "resources": {"cpu": 0.5}} for i in range(K)])
    wait_until(lambda: "READY" not in statuses(stack, ids.values()).values(), 30, "the busy tasks promoted")
    return ids


def first(evs: list[r.EventRecord], kind: type) -> r.EventRecord | None:
    return next((ev for ev in evs if isinstance(ev.payload, kind)), None)


ENDS = (e.TaskSucceeded, e.TaskFailed, e.TaskCancelled, e.TaskDeadLettered, e.TaskLeaseExpired, e.TaskReleased)


def most_at_once(spans: Iterable[tuple[int, int, float]]) -> float:
    """The largest sum of weights of the [start, end] spans open at one instant (an end at the same
    millisecond as a start is taken first)."""
    points = sorted([(a, 1, w) for a, _, w in spans] + [(b, 0, w) for _, b, w in spans])
    now = top = 0.0
    for _, opening, w in points:
        now += w if opening else -w
        top = max(top, now)
    return top


def test_a_flood_waits_in_the_database_and_the_queue_never_holds_more_than_k(small: Stack, gate: Path) -> None:
    """While the worker is busy, a 40-task submission is still accepted and its tasks wait READY in the
    database; from the log, never more than K tasks were queued, claimed or running at once, and the
    tasks were queued in rank order: deadline (ready time + delay tolerance, to the second), then
    priority, highest first."""
    blockers = busy(small, gate)
    flood = [
        {"name": f"f{i}", "call": "time:sleep", "args": [0.05], "priority": i % 5,
         "delay_tolerance_s": 5 * (i % 2), "resources": {"cpu": 0.5}}
        for i in range(40)
    ]  # fmt: skip
    sid, ids = submit(small, flood)  # accepted while everything is busy
    # they wait in the database while the busy tasks run
    wait_until(lambda: list(statuses(small, ids.values()).values()).count("READY") >= 35, 30, "35 waiting")
    gate.touch()
    wait_until(lambda: all_succeeded(small, sid, 40), 120, "every flood task to succeed")
    # the fifth busy task runs alone in its round, and the flood can be done in the other slot before it
    wait_until(lambda: set(statuses(small, blockers.values()).values()) == {"SUCCEEDED"}, 30, "the busy tasks")
    log = history(small, {*ids.values(), *blockers.values()})
    spans = []
    for tid, evs in log.items():
        queued, ended = first(evs, e.TaskQueued), first(evs, ENDS)
        assert queued is not None and ended is not None, story(small, tid)
        spans.append((queued.event_ms, ended.event_ms, 1.0))
    assert 3 <= most_at_once(spans) <= K  # busy, and never beyond K
    spec = {ids[t["name"]]: t for t in flood}

    def rank(tid: str) -> tuple[int, int]:
        ready = first(log[tid], e.TaskReady)
        assert ready is not None
        return ((ready.event_ms + 1000 * spec[tid]["delay_tolerance_s"]) // 1000, -spec[tid]["priority"])

    by_rank = sorted(spec, key=rank)
    queued_at = [first(log[t], e.TaskQueued).event_ms for t in by_rank]  # type: ignore[union-attr]
    late = [(by_rank[i], by_rank[i + 1]) for i in range(len(by_rank) - 1)
            if rank(by_rank[i]) < rank(by_rank[i + 1]) and queued_at[i] > queued_at[i + 1]]  # fmt: skip
    assert not late, [(spec[a]["name"], rank(a), spec[b]["name"], rank(b)) for a, b in late]


def test_a_waiting_task_reprioritized_goes_first_and_one_cancelled_is_never_queued(small: Stack, gate: Path) -> None:
    """Reprioritizing or cancelling a task still in the database costs one row: the next promotion takes
    the reprioritized one before every other task of its deadline, and the cancelled one never reaches
    the queue (nothing depended on it; dependents of a cancelled task end cancelled, test_dispatch)."""
    blockers = busy(small, gate)
    sid, ids = submit(small, [{"name": f"w{i}", "call": "os:getpid"} for i in range(30)])
    wait_until(lambda: list(statuses(small, ids.values()).values()).count("READY") == 30, 30, "all 30 waiting")
    with Client(small.settings) as client:
        client.reprioritize(ids["w29"], 100)
        client.cancel(ids["w28"], "not needed after all")
    wait_until(lambda: statuses(small, [ids["w28"]])[ids["w28"]] == "CANCELLED", 30, "w28 cancelled")
    wait_until(lambda: priority(small, ids["w29"]) == 100, 30, "w29 reprioritized")
    gate.touch()
    others = [t for n, t in ids.items() if n != "w28"]
    wait_until(lambda: set(statuses(small, others).values()) == {"SUCCEEDED"}, 120, "the other 29 to succeed")
    wait_until(lambda: set(statuses(small, blockers.values()).values()) == {"SUCCEEDED"}, 30, "the busy tasks")
    log = history(small, set(ids.values()))
    assert first(log[ids["w28"]], e.TaskQueued) is None, story(small, ids["w28"])
    top = log[ids["w29"]]
    second = first(top, e.TaskReady).event_ms // 1000  # type: ignore[union-attr]
    peers = [t for n, t in ids.items() if n not in ("w28", "w29")
             and first(log[t], e.TaskReady).event_ms // 1000 == second]  # type: ignore[union-attr]  # fmt: skip
    mine = first(top, e.TaskQueued).event_ms  # type: ignore[union-attr]
    assert peers and all(mine <= first(log[t], e.TaskQueued).event_ms for t in peers)  # type: ignore[union-attr]


def test_a_queued_task_reprioritized_is_taken_back_and_ranked_again(small: Stack, gate: Path) -> None:
    """One submission, so every task has the same deadline: K tasks of priority 10 that wait for a gate
    file (promoted first: two run, one is claimed ahead, the rest queued), then 10 no-ops of priority 0.
    The tasks still queued and unclaimed are reprioritized to -1: each is taken back (TaskUnqueued, READY
    again in the read model), and queued again only after every no-op was (they now rank first); its
    stale queue record, if claimed, is refused; it then runs once, as attempt 1 (the number given back).
    The gate opens only once they are READY again: with a timed sleep, a runner that finished before the
    reprioritize arrived let a queued sleeper be claimed first, and it was never taken back."""
    tasks = [{"name": f"b{i}", "argv": gated(gate), "priority": 10, "resources": {"cpu": 0.5}}
             for i in range(K)] + [{"name": f"n{i}", "call": "os:getpid"} for i in range(10)]  # fmt: skip
    sid, ids = submit(small, tasks)
    busy_ids = [ids[f"b{i}"] for i in range(K)]

    def settled() -> list[str] | None:
        """The sleepers queued and unclaimed, once the claimers (slots + claim_ahead) hold the others."""
        got = statuses(small, busy_ids)
        waiting = [t for t, st in got.items() if st == "QUEUED"]
        return waiting if "READY" not in got.values() and len(waiting) == K - SLOTS - AHEAD else None

    queued = wait_until(settled, 30, "the sleepers promoted, the claimers full", show=lambda: working(small))
    with Client(small.settings) as client:
        for t in queued:
            client.reprioritize(t, -1)
    wait_until(lambda: set(statuses(small, queued).values()) == {"READY"}, 30, "the reprioritized tasks ready again")
    gate.touch()
    wait_until(lambda: all_succeeded(small, sid, len(tasks)), 120, "every task to succeed")
    log = history(small, set(ids.values()))
    noops_queued = [first(log[ids[f"n{i}"]], e.TaskQueued).event_ms for i in range(10)]  # type: ignore[union-attr]
    for t in queued:
        evs = log[t]
        kinds = [type(ev.payload).__name__ for ev in evs]
        assert kinds.count("TaskUnqueued") == 1 and kinds.count("TaskStarted") == 1, story(small, t)
        (back,) = [ev for ev in evs if isinstance(ev.payload, e.TaskUnqueued)]
        assert back.payload.attempt == 1 and "reprioritized from 10 to -1 while queued" in back.payload.reason
        requeued = [ev for ev in evs if isinstance(ev.payload, e.TaskQueued) and ev.version > back.version]
        assert len(requeued) == 1 and requeued[0].payload.attempt == 1, story(small, t)
        assert requeued[0].event_ms >= max(noops_queued), story(small, t)  # ranked after the no-ops now
        (claimed,) = [ev.payload for ev in evs if isinstance(ev.payload, e.TaskClaimed)]
        assert claimed.attempt == 1
        stale = [ev.payload for ev in evs if isinstance(ev.payload, e.ClaimRejected)]
        assert all(x.reason == "task is ready" for x in stale), stale


def test_no_worker_runs_more_than_its_cpus_and_a_task_none_fits_waits(small: Stack) -> None:
    """Tasks of mixed sizes on a worker offering 2 cpus: from the log, the cpus of the tasks running at
    any instant never add up to more than 2. A task needing 3 cpus is never promoted: it waits READY
    and the batcher says why."""
    sizes = [1.5, 1.0, 0.5, 0.5, 1.0, 1.5]
    tasks = [{"name": f"m{i}", "call": "time:sleep", "args": [0.2], "resources": {"cpu": sizes[i % len(sizes)]}}
             for i in range(24)]  # fmt: skip
    sid, ids = submit(small, tasks)
    _, big = submit(small, [{"name": "big", "call": "os:getpid", "resources": {"cpu": 3}}])
    wait_until(lambda: all_succeeded(small, sid, 24), 120, "the mixed tasks to succeed")
    log = history(small, set(ids.values()))
    cpu = {ids[t["name"]]: t["resources"]["cpu"] for t in tasks}
    spans = []
    for tid, evs in log.items():
        started, ended = first(evs, e.TaskStarted), first(evs, e.TaskSucceeded)
        assert started is not None and ended is not None, story(small, tid)
        spans.append((started.event_ms, ended.event_ms, cpu[tid]))
    assert 1.0 < most_at_once(spans) <= CPUS + 1e-9
    assert statuses(small, big.values()) == {big["big"]: "READY"}
    wait_until(lambda: f"task {big['big']} (tenant dispatch) needs 3 cpus" in small.logs(), 30, "the batcher's word")
    with Client(small.settings) as client:
        client.cancel(big["big"], "no worker fits it")
    wait_until(lambda: statuses(small, big.values()) == {big["big"]: "CANCELLED"}, 30, "the big task cancelled")


def test_a_task_runs_only_where_the_worker_labels_it_needs_are_and_waits_where_none_has_them(small: Stack) -> None:
    """The worker advertises zone=[red]lab: a task needing that label runs; one needing zone=eu is never
    promoted, and the batcher says which labels it needs."""
    _, ids = submit(small, [{"name": "lab", "call": "os:getpid", "resources": {"labels": {"zone": "[red]lab"}}},
                            {"name": "eu", "call": "os:getpid", "resources": {"labels": {"zone": "eu"}}}])  # fmt: skip
    wait_until(lambda: statuses(small, [ids["lab"]]) == {ids["lab"]: "SUCCEEDED"}, 60, "the lab task to succeed")
    wait_until(lambda: f"task {ids['eu']} (tenant dispatch) needs 1 cpus, 256 MB, 0 gpus and labels zone=eu"
               in small.logs(), 30, "the batcher's word")  # fmt: skip
    assert statuses(small, [ids["eu"]]) == {ids["eu"]: "READY"}
    with psycopg.connect(small.settings.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT needs_labels FROM tasks WHERE task_id = %s", (ids["eu"],)).fetchone()
    assert row == ({"zone": "eu"},)
    # a task READY makes every notice a round; none READY, a notice makes none (while the gate is open
    # and no promotion is on its way)
    assert not idle(small, gate_open=True)
    with Client(small.settings) as client:
        client.cancel(ids["eu"], "no worker in that zone")
    wait_until(lambda: statuses(small, [ids["eu"]]) == {ids["eu"]: "CANCELLED"}, 30, "the eu task cancelled")
    wait_until(lambda: idle(small, gate_open=True), 30, "no task READY: a notice making no round")
    assert not idle(small, gate_open=False)  # the last round had no room for every candidate: rounds go on
    assert not idle(small, gate_open=True, promoted=["a promotion on its way"])


def idle(stack: Stack, gate_open: bool, promoted: Iterable[str] = ()) -> bool:
    """Whether the batcher (streams/batcher.py) would skip the round a notice asks for, on the stack's
    read model as it is now."""
    import asyncio
    from types import SimpleNamespace

    from taskstream.streams.batcher import Batcher

    from taskstream.core.batcher import Gate

    async def ask() -> bool:
        batcher = Batcher(SimpleNamespace(settings=stack.settings), lambda: True)  # type: ignore[arg-type]
        batcher.gate = Gate(open=gate_open)
        batcher.promoted = {task: ("dispatch", "default", 0.0) for task in promoted}
        async with await psycopg.AsyncConnection.connect(stack.settings.dsn, autocommit=True) as conn:
            return await batcher.idle(conn)

    return asyncio.run(ask())


def test_tasks_the_owners_here_saw_leave_are_not_taken_though_the_read_model_still_says_so(
    small: Stack, gate: Path
) -> None:
    ids = list(busy(small, gate).values())
    working = {"QUEUED", "CLAIMED", "RUNNING"}
    wait_until(lambda: set(statuses(small, ids).values()) <= working and len(statuses(small, ids)) == K, 30, "busy")
    try:
        before = taken(small, [])
        assert before.get("dispatch", 0) >= K  # the busy ones, as the read model says
        ended = [event(tid, e.TaskSucceeded("c", 0, "", 1)) for tid in ids[:2]]
        assert taken(small, ended) == {**before, "dispatch": before["dispatch"] - 2}
        # one of them queued again after (a retry): working again
        assert taken(small, [*ended, event(ids[0], e.TaskQueued(2, "default"))])["dispatch"] == before["dispatch"] - 1
        # a promotion on its way is counted on its own, not twice
        assert taken(small, [], promoted=ids[2:3])["dispatch"] == before["dispatch"] - 1
    finally:
        gate.touch()
    wait_until(lambda: set(statuses(small, ids).values()) == {"SUCCEEDED"}, 60, "the busy tasks done")


def event(task_id: str, payload: Any) -> r.EventRecord:
    return r.EventRecord(f"{task_id}:test", task_id, "test", 9, 0, "test", payload)


def taken(stack: Stack, heard: list[r.EventRecord], promoted: Iterable[str] = ()) -> dict[str, int]:
    """What the batcher (streams/batcher.py) counts as taken per tenant on the stack's read model as it is
    now, having heard `heard` from its owners."""
    import asyncio
    from types import SimpleNamespace

    from taskstream.streams.batcher import Batcher

    async def ask() -> dict[str, int]:
        batcher = Batcher(SimpleNamespace(settings=stack.settings), lambda: True)  # type: ignore[arg-type]
        batcher.promoted = {task: ("dispatch", "default", 0.0) for task in promoted}
        batcher.heard(heard)
        async with await psycopg.AsyncConnection.connect(stack.settings.dsn, autocommit=True) as conn:
            return await batcher.taken(conn)

    return asyncio.run(ask())


def test_workers_lists_what_each_worker_advertises(small: Stack) -> None:
    """`taskstream workers`: the stack's worker, live, with the slots, claim_ahead, cpus and labels it
    was started with (what the batcher counts)."""
    rows = wait_until(lambda: json.loads(small.cli("workers", "--json").stdout), 30, "an advertisement")
    (w,) = rows
    assert w["live"] and not w["stopping"] and w["silent_ms"] < small.settings.lease_ms
    assert (w["slots"], w["claim_ahead"], w["cpus"], w["gpus"]) == (SLOTS, AHEAD, CPUS, 0)
    assert w["labels"] == {"zone": "[red]lab"} and w["memory_mb"] > 0
    table = small.cli("workers").stdout
    assert "zone=[red]lab" in table and "yes" in table


def tenant_rows(stack: Stack) -> dict[str, dict[str, Any]]:
    return {x["tenant"]: x for x in json.loads(stack.cli("tenants", "--json").stdout)}


def test_tenants_are_set_by_command_and_an_unknown_one_is_rejected_at_admission(small: Stack, tmp_path: Path) -> None:
    """Under TASKSTREAM_TENANTS=closed a submission of a tenant never set is rejected with the command
    that creates it; `tenants set` creates and changes one (tier, cap, weight), `tenants` lists it, and a
    wrong tier or weight is refused naming the field."""
    dag = tmp_path / "acme.yaml"
    dag.write_text("tenant: acme\ntasks:\n  - {name: one, call: 'os:getpid'}\n")
    refused = small.cli("submit", str(dag), check=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "tenant 'acme' does not exist here" in refused.stderr and "taskstream tenants set acme" in refused.stderr
    small.cli("tenants", "set", "acme", "--tier", "free")
    wait_until(lambda: "acme" in tenant_rows(small), 30, "acme in the read model")
    acme = tenant_rows(small)["acme"]
    assert (acme["tier"], acme["max_running"], acme["weight"], acme["set"]) == ("free", 10, 1.0, True)
    small.cli("tenants", "set", "acme", "--tier", "premium", "--max-running", "3", "--weight", "2.5")
    wait_until(lambda: tenant_rows(small)["acme"]["tier"] == "premium", 30, "acme changed")
    acme = tenant_rows(small)["acme"]
    assert (acme["max_running"], acme["weight"]) == (3, 2.5)
    bad = small.cli("tenants", "set", "acme", "--tier", "gold", "--weight", "0", check=False)
    assert bad.returncode == 1
    assert "field 'tier'" in bad.stderr and "'gold'" in bad.stderr and "field 'weight'" in bad.stderr
    assert tenant_rows(small)["acme"]["tier"] == "premium"  # a rejected change changes nothing
    out = small.cli("submit", str(dag), "--follow", "--timeout", "60")
    assert "succeeded" in out.stdout.lower()


def test_a_flooding_tenant_leaves_the_others_their_weighted_share(small: Stack) -> None:
    """One tenant floods first (its tasks rank first: earlier deadlines); two more then submit, one of
    weight 2. While all three have tasks waiting, the tasks started are shared by weight, not all the
    flooder's: K = 5 places split 1 : 2 : 1 the nearest way is 1 : 3 : 1 (0.2 : 0.6 : 0.2). Prints the
    measured shares."""
    small.cli("tenants", "set", "flood", "--tier", "standard")
    small.cli("tenants", "set", "gold", "--tier", "standard", "--weight", "2")
    small.cli("tenants", "set", "plain", "--tier", "standard")
    task = {"call": "time:sleep", "args": [0.25], "resources": {"cpu": 0.5}}
    ids: dict[str, str] = {}
    with Client(small.settings) as client:
        for tenant, n in (("flood", 60), ("gold", 24), ("plain", 24)):
            doc = {"tenant": tenant, "tasks": [{"name": f"{tenant}{i}", **task} for i in range(n)]}
            cid, sid = client.submit(parse_document(doc))
            out = client.wait_outcome(sid, 60, command_id=cid)
            assert out.accepted, out
            ids.update({tid: tenant for tid in out.task_ids.values()})
    wait_until(lambda: set(statuses(small, ids).values()) == {"SUCCEEDED"}, 180, "every task to succeed")
    log = history(small, set(ids))
    ready = {tid: first(evs, e.TaskReady).event_ms for tid, evs in log.items()}  # type: ignore[union-attr]
    started = {tid: first(evs, e.TaskStarted).event_ms for tid, evs in log.items()}  # type: ignore[union-attr]
    # the window: from when every tenant's tasks were all ready until one tenant had none left waiting
    since = max(ready.values())
    last_start = {t: max(started[x] for x in ids if ids[x] == t) for t in ("flood", "gold", "plain")}
    until = min(last_start.values())
    counts = {t: sum(1 for x in ids if ids[x] == t and since <= started[x] <= until) for t in last_start}
    total = sum(counts.values())
    shares = {t: round(n / total, 2) for t, n in counts.items()}
    print(f"tasks started while all three waited ({total}): {counts}; shares {shares} (weights 1 : 2 : 1)")
    assert total >= 20, counts
    assert 0.4 <= shares["gold"] <= 0.7, shares
    assert 0.1 <= shares["plain"] <= 0.35 and 0.1 <= shares["flood"] <= 0.35, shares


# Last in the module: the worker it adds changes K for what would follow.
def test_queues_shows_each_lane_s_waiting_tasks_their_age_and_what_it_handed_out(small: Stack, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`taskstream queues`: a lane's waiting tasks, the age of the oldest, and what it handed out. More
    tasks than the worker runs (2 slots) and claims ahead (1): the rest wait in the lane."""
    dag = tmp_path / "many.yaml"
    naps = "".join(f"  - name: n{i}\n    argv: [sleep, '1.5']\n" for i in range(12))
    dag.write_text("tenant: dispatch\ntasks:\n" + naps)
    sid = small.cli("submit", str(dag)).stdout.split("accepted submission ")[1].split(":")[0]

    def default_lane() -> dict[str, Any] | None:
        lanes = json.loads(small.cli("queues", "--json").stdout)
        lane = next(q for q in lanes if q["lane"] == "default")
        return lane if lane["depth"] >= 1 and lane["claimed_or_running"] >= SLOTS + AHEAD else None

    busy = wait_until(default_lane, 60, "tasks waiting in the default lane while others run")
    assert busy["oldest_s"] is not None and busy["oldest_s"] >= 0 and busy["claimed_per_s"] > 0
    table = small.cli("queues").stdout
    assert "default" in table and "waiting" in table
    with psycopg.connect(small.settings.dsn, autocommit=True) as conn:
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM tasks WHERE submission_id = %s AND status = 'SUCCEEDED'", (sid,)
                ).fetchone()
                == (12,)
            ),
            90,
            "every task to succeed",
        )
        lanes = conn.execute(
            "SELECT DISTINCT t.lane, a.lane FROM tasks t JOIN attempts a USING (task_id) WHERE t.submission_id = %s",
            (sid,),
        ).fetchall()
    assert lanes == [("default", "default")]
    idle = json.loads(small.cli("queues", "--json", "--window", "600").stdout)
    after = next(q for q in idle if q["lane"] == "default")
    assert after["oldest_s"] is None or after["depth"] > 0
    assert after["claimed_per_s"] >= 12 / 600


def test_a_big_task_goes_to_the_lane_of_the_workers_that_fit_it_and_no_worker_is_oversubscribed(
    small: Stack, tmp_path: Path
) -> None:
    """A second worker, 8 cpus, also reads the lane `big`. Tasks of 4 cpus fit only it: the batcher
    routes each to `big` (in the default lane one could sit on a partition of the 2-cpu worker, which
    can never run it), and small tasks go to either lane by load. From the log: every big task was
    queued in `big` and claimed by the big worker, both lanes carried work, and at no instant did the
    tasks running on a worker need more cpus than it offers. `taskstream queues` shows both lanes
    with their live readers."""
    extra = Workers(small, tmp_path)
    try:
        argv = [sys.executable, "-m", "taskstream", "worker", "--index", "1", "--lane", "big", "--cpus", "8",
                "--slots", "2"]  # fmt: skip
        extra.start(1, *argv)

        def adverts() -> dict[str, Any] | None:
            rows = [w for w in json.loads(small.cli("workers", "--json").stdout) if w["live"]]
            ready = len(rows) == 2 and any("big" in w["lanes"] for w in rows)  # a lane once its reader has joined
            return {w["worker"]: w for w in rows} if ready else None

        live = wait_until(adverts, 60, "both workers advertising, one the lane big")
        (big_worker,) = [w for w, ad in live.items() if "big" in ad["lanes"]]
        cpus = {w: float(ad["cpus"]) for w, ad in live.items()}
        wide = [{"name": f"wide{i}", "call": "time:sleep", "args": [0.3], "resources": {"cpu": 4}} for i in range(8)]
        narrow = [{"name": f"narrow{i}", "call": "time:sleep", "args": [0.2], "resources": {"cpu": 0.5}}
                  for i in range(24)]  # fmt: skip
        sid, ids = submit(small, wide + narrow)
        wait_until(lambda: all_succeeded(small, sid, 32), 120, "every task to succeed")
        log = history(small, set(ids.values()))
        need = {ids[t["name"]]: float(t["resources"]["cpu"]) for t in wide + narrow}
        lanes: dict[str, set[str]] = {"wide": set(), "narrow": set()}
        by_worker: dict[str, list[tuple[int, int, float]]] = {}
        for name, tid in ids.items():
            evs = log[tid]
            queued, claimed = first(evs, e.TaskQueued), first(evs, e.TaskClaimed)
            started, ended = first(evs, e.TaskStarted), first(evs, e.TaskSucceeded)
            assert queued and claimed and started and ended, story(small, tid)
            lanes[name.rstrip("0123456789")].add(queued.payload.lane)
            if name.startswith("wide"):
                assert claimed.payload.worker == big_worker, story(small, tid)
            by_worker.setdefault(claimed.payload.worker, []).append((started.event_ms, ended.event_ms, need[tid]))
        assert lanes["wide"] == {"big"}
        assert lanes["narrow"] == {"default", "big"}  # routed by load: both lanes took some
        for worker, spans in by_worker.items():
            assert most_at_once(spans) <= cpus[worker] + 1e-9, (worker, spans)
        rows = {q["lane"]: q for q in json.loads(small.cli("queues", "--json").stdout)}
        assert (rows["default"]["workers"], rows["big"]["workers"]) == (2, 1), rows
        assert "big" in small.cli("workers").stdout
    finally:
        extra.stop()


def test_tasks_routed_to_a_lane_whose_only_reader_died_are_moved_to_a_live_lane_and_run_once(
    small: Stack, tmp_path: Path
) -> None:
    """A second worker reads lane `big` and is SIGKILLed; tasks submitted at once are routed by load to
    both lanes while the batcher still counts it live (a lease after its last advertisement). Once it
    does not, the tasks queued in `big`, which nobody reads, are moved to the default lane
    (TaskUnqueued, then TaskQueued there) and run on the stack's worker: every task succeeds once, in
    far less than TASKSTREAM_REQUEUE_MS (10 min), which before this stranded them for good."""
    extra = Workers(small, tmp_path)
    try:
        argv = [sys.executable, "-m", "taskstream", "worker", "--index", "1", "--lane", "big", "--cpus", "8",
                "--slots", "2"]  # fmt: skip
        doomed = extra.start(1, *argv)

        def both() -> bool:
            rows = [w for w in json.loads(small.cli("workers", "--json").stdout) if w["live"]]
            return len(rows) == 2 and any("big" in w["lanes"] for w in rows)

        wait_until(both, 60, "both workers advertising, one the lane big")
        doomed.kill()
        doomed.wait(10)
        tasks = [{"name": f"n{i}", "call": "time:sleep", "args": [0.2], "resources": {"cpu": 0.5}} for i in range(24)]
        sid, ids = submit(small, tasks)
        wait_until(lambda: all_succeeded(small, sid, 24), 120, "every task to succeed")
    finally:
        extra.stop()
    log = history(small, set(ids.values()))
    moved = []
    for tid, evs in log.items():
        kinds = [type(ev.payload).__name__ for ev in evs]
        assert kinds.count("TaskSucceeded") == 1 and kinds.count("TaskStarted") == 1, story(small, tid)
        lanes = [ev.payload.lane for ev in evs if isinstance(ev.payload, e.TaskQueued)]
        if lanes[0] == "big":
            unqueued = first(evs, e.TaskUnqueued)
            assert unqueued is not None and "moved from lane big" in unqueued.payload.reason, story(small, tid)
            assert lanes[-1] == "default", story(small, tid)
            moved.append(tid)
    assert moved, "no task was routed to the dead worker's lane: the case was not exercised"
    print(f"{len(moved)} of 24 tasks moved from the dead lane big")
