"""The resource manager's decisions, pure: who watches which worker, and which run is over a limit.
(On the stack, with a watcher SIGKILLed: tests/test_dispatch.py.)"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from taskstream.core.resources import EXECUTION_CAP, MEMORY, Run, over_limits, runs_of, watched_by, watchers

NODES = st.sets(st.text("abcdefgh-0123", min_size=1, max_size=6), min_size=2, max_size=12)


@given(NODES)
def test_every_worker_is_watched_by_one_other_live_node_and_every_node_computes_the_same_map(nodes: set[str]) -> None:
    got = watchers(nodes)
    assert set(got) == nodes
    assert all(n in nodes and n != w for w, n in got.items())  # the watcher is itself watched by another
    assert watchers(sorted(nodes, reverse=True)) == got  # the order the adverts came in does not matter
    assert sorted(w for n in nodes for w in watched_by(n, nodes)) == sorted(nodes)


@given(NODES, st.data())
def test_a_node_going_moves_only_the_workers_it_watched(nodes: set[str], data: st.DataObject) -> None:
    gone = data.draw(st.sampled_from(sorted(nodes)))
    before, after = watchers(nodes), watchers(nodes - {gone})
    for worker, node in after.items():
        if before[worker] != gone:
            assert node == before[worker], (worker, before, after)


def test_a_lone_node_watches_itself_and_a_stopping_worker_is_watched_but_watches_nothing() -> None:
    assert watchers(["only"]) == {"only": "only"} and watchers([]) == {}
    got = watchers(["a", "b"], workers=["a", "b", "draining"])
    assert set(got) == {"a", "b", "draining"} and got["a"] == "b" and got["b"] == "a"
    assert watchers([], workers=["draining"]) == {}


def run(**kw: object) -> Run:
    base = {"task_id": "t", "claim_id": "c", "pid": 7, "ran_ms": 1_000, "cap_ms": 60_000, "memory_mb": 100,
            "rss_mb": 50.0}  # fmt: skip
    return Run(**{**base, **kw})  # type: ignore[arg-type]


def test_a_run_over_its_memory_limit_or_past_its_cap_is_to_be_killed_and_one_within_them_is_not() -> None:
    fat, slow, fine = run(claim_id="fat", rss_mb=201.0), run(claim_id="slow", ran_ms=66_001), run()
    got = {o.run.claim_id: o for o in over_limits([fat, slow, fine], memory_ratio=2.0, cap_slack_ms=6_000)}
    assert set(got) == {"fat", "slow"}
    assert got["fat"].limit == MEMORY and "201 MB resident, the limit is 200 MB" in got["fat"].reason
    assert got["slow"].limit == EXECUTION_CAP and "66.0s into an execution cap of 60s" in got["slow"].reason
    assert over_limits([run(rss_mb=200.0), run(ran_ms=66_000)], 2.0, 6_000) == []  # at the limits: not over
    assert over_limits([fat], memory_ratio=0, cap_slack_ms=6_000) == []  # memory not watched
    assert over_limits([run(memory_mb=0, rss_mb=900.0)], 2.0, 6_000) == []  # asked for none: no limit


def test_the_runs_of_an_advert_skip_malformed_entries_and_keep_the_rest() -> None:
    good = {"task": "t", "claim": "c", "pid": 3, "ran_ms": 5, "cap_ms": 9, "memory_mb": 64, "rss_mb": 12.5}
    ad = {"worker": "w", "running": [good, {"task": "u"}, {**good, "pid": "x"}, None]}
    assert runs_of(ad) == [Run("t", "c", 3, 5, 9, 64, 12.5)]
    assert runs_of({"worker": "w"}) == [] and runs_of({"running": None}) == []


class _Ctx:
    """What ResourceManager.step uses of a Context: settings, a clock, input records, the inputs topic."""

    def __init__(self) -> None:
        from taskstream.settings import Settings

        self.settings = Settings.from_env({}, lease_ms=3_000, heartbeat_ms=1_000, kill_grace_ms=1_000)
        self.inputs = "inputs"

    def now_ms(self) -> int:
        return 1_000

    def input(self, task_id: str, at_ms: int, body: object, input_id: str) -> tuple[str, object, str]:
        return (task_id, body, input_id)


def test_a_node_orders_each_over_limit_run_of_the_workers_it_watches_once_until_it_goes_on() -> None:
    from taskstream.schemas import records as r
    from taskstream.streams.resources import ResourceManager

    fat = {"task": "t1", "claim": "c1", "pid": 5, "ran_ms": 10, "cap_ms": 60_000, "memory_mb": 10, "rss_mb": 99.0}
    slim = {**fat, "task": "t2", "claim": "c2", "rss_mb": 5.0}
    nodes = ["n1", "n2", "n3"]

    def runs(n: str, *items: dict[str, object]) -> list[dict[str, object]]:  # claims are each worker's own
        return [{**x, "task": f"{x['task']}-{n}", "claim": f"{x['claim']}-{n}"} for x in items]

    heard = {n: {"worker": n, "running": runs(n, fat, slim)} for n in nodes}
    rms = {n: ResourceManager(_Ctx(), n) for n in nodes}  # type: ignore[arg-type]
    orders = {n: rm.step(heard, now=0.0) for n, rm in rms.items()}
    assert sorted(w for rm in rms.values() for w in rm.watching) == nodes  # each worker watched once
    for n, rm in rms.items():
        assert n not in rm.watching and len(orders[n]) == len(rm.watching)  # only fat runs, only its own
        for (_, task, (tid, body, _)), worker in zip(orders[n], rm.watching, strict=True):
            assert task == tid == f"t1-{worker}" and isinstance(body, r.LimitExceeded) and body.watcher == n
            assert body.limit == "memory" and body.claim_id == f"c1-{worker}"
    rm = next(rm for rm in rms.values() if rm.watching)
    assert rm.step(heard, now=1.0) == []  # ordered a moment ago: not again within a lease
    assert len(rm.step(heard, now=4.0)) == len(rm.watching)  # still running a lease later: again
    ended = {n: {"worker": n, "running": runs(n, slim)} for n in nodes}
    assert rm.step(ended, now=5.0) == [] and rm.ordered == {}  # ended: forgotten
    stopping = {**heard, rm.node: {**heard[rm.node], "stopping": True}}
    gone = ResourceManager(_Ctx(), rm.node)  # type: ignore[arg-type]
    assert gone.step(stopping, now=0.0) == [] and gone.watching == []  # a stopping node watches nothing
