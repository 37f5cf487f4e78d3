"""Admission's decisions, pure (streams/admission.py): no broker, the link index given by hand."""

from __future__ import annotations

import json

from taskstream.schemas import records as r
from taskstream.streams.admission import CHUNK_TASKS, LinkIndex, Placement, carry_out, decide_command

from taskstream.core import events as e
from taskstream.core.submission import parse_document, reference_id


def command(key: str, tasks: list[dict[str, object]], tenant: str = "acme") -> r.CommandRecord:
    sub = parse_document({"tenant": tenant, "idempotency_key": key, "tasks": tasks})
    return r.CommandRecord(f"cmd-{key}", 1, r.SubmitDag(tenant, sub.tasks, key, {}), "test")


def decide(cmd: r.CommandRecord, index: LinkIndex, partition: int = 0, home: int = 0):  # type: ignore[no-untyped-def]
    return decide_command("node", cmd, 1000, where=Placement(partition, lambda _t: home, by_id), index=index)


def by_id(task_id: str) -> int:
    """A stand-in for the events topic's partitioner: any pure function of the id will do."""
    return int(task_id[:2], 16) % 3


def written(d):  # type: ignore[no-untyped-def]
    """Every record a decision has written: its own, then its tasks'."""
    return d.sends + (d.admitted.records(by_id) if d.admitted else [])


def task_events_of(d):  # type: ignore[no-untyped-def]
    return [x for _, _, rec in written(d) for x in r.task_events(rec)]


def admit(cmd: r.CommandRecord, index: LinkIndex):  # type: ignore[no-untyped-def]
    d = decide(cmd, index)
    assert d.accepted, d.sends
    if d.link_entry:
        index.add(d.link_entry)
    return d


def test_a_submission_closing_a_cycle_through_earlier_ones_is_rejected_with_the_cycle_named() -> None:
    index = LinkIndex()
    # k1: a waits for k2/b (not admitted yet); a2 waits for a.  k3: c waits for k1/a2.
    admit(
        command(
            "k1",
            [
                {"name": "a", "argv": ["x"], "dependencies": ["k2/b"]},
                {"name": "a2", "argv": ["x"], "dependencies": ["a"]},
            ],
        ),
        index,
    )
    admit(command("k3", [{"name": "c", "argv": ["x"], "dependencies": ["k1/a2"]}]), index)
    # k2: b waits for k3/c: b -> k3/c -> k1/a2 -> k1/a -> b
    d = decide(command("k2", [{"name": "b", "argv": ["x"], "dependencies": ["k3/c"]}]), index)
    assert not d.accepted and len(d.sends) == 1
    rejected = d.sends[0][2].payload
    assert isinstance(rejected, r.SubmissionRejected)
    (problem,) = rejected.errors
    assert (problem.task, problem.field) == ("b", "dependencies")
    assert problem.reason == "closes a cycle through other submissions: b -> k3/c -> k1/a2 -> k1/a -> b"


def test_the_same_references_without_a_cycle_are_admitted_with_ids_from_the_keys() -> None:
    index = LinkIndex()
    admit(command("k1", [{"name": "a", "argv": ["x"], "dependencies": ["k2/b"]}]), index)
    d = admit(command("k2", [{"name": "b", "argv": ["x"]}]), index)
    submitted = [rec.payload for rec in task_events_of(d) if isinstance(rec.payload, e.TaskSubmitted)]
    assert [rec.task_id for rec in task_events_of(d) if isinstance(rec.payload, e.TaskSubmitted)] == [
        reference_id("acme", "k2", "b")
    ]
    assert submitted[0].spec.dependencies == ()


def test_a_linked_submission_is_forwarded_to_its_tenants_partition_and_writes_nothing_else() -> None:
    d = decide(command("k1", [{"name": "a", "argv": ["x"], "dependencies": ["k2/b"]}]), LinkIndex(), 3, home=1)
    assert (d.forward_to, d.sends, d.accepted) == (1, [], False)
    unlinked = decide(command("k9", [{"name": "a", "argv": ["x"]}]), LinkIndex(), 3, home=1)
    assert unlinked.accepted and unlinked.forward_to is None and unlinked.link_entry is None


def test_the_index_keeps_only_tasks_from_which_another_submission_is_reached() -> None:
    index = LinkIndex()
    admit(
        command(
            "k1",
            [
                {"name": "root", "argv": ["x"]},
                {"name": "mid", "argv": ["x"], "dependencies": ["root", "k0/z"]},
                {"name": "top", "argv": ["x"], "dependencies": ["mid"]},
                {"name": "side", "argv": ["x"], "dependencies": ["root"]},
            ],
        ),
        index,
    )
    kept = {index.labels[t] for t in index.edges}
    assert kept == {"k1/mid", "k1/top"}  # root and side cannot be on a cycle through other submissions


def test_a_rejected_submission_adds_nothing_to_the_index() -> None:
    index = LinkIndex()
    admit(command("k1", [{"name": "a", "argv": ["x"], "dependencies": ["k2/b"]}]), index)
    before = dict(index.edges)
    decide(command("k2", [{"name": "b", "argv": ["x"], "dependencies": ["k1/a"]}]), index)
    assert index.edges == before


def test_tasks_are_admitted_packed_per_partition_with_their_dependents_and_references() -> None:
    n = CHUNK_TASKS * 2 + 7
    tasks: list[dict[str, object]] = [{"name": "t0", "argv": ["x"], "dependencies": ["k0/outside"]}]
    tasks += [{"name": f"t{i}", "argv": ["x"], "dependencies": sorted({f"t{i - 1}", "t0"})} for i in range(1, n)]
    d = admit(command("big", tasks), LinkIndex())
    (decision,) = d.sends
    assert isinstance(decision[2].payload, r.SubmissionAccepted), "the decision is a record of its own"
    packed = [(key, rec) for topic, key, rec in written(d) if isinstance(rec.payload, r.TasksAdmitted)]
    assert all(topic == "events" for topic, _, _ in written(d))
    assert len(packed) == len(written(d)) - 1
    ids = decision[2].payload.task_ids
    seen: list[str] = []
    for key, rec in packed:
        items = rec.payload.tasks
        assert 0 < len(items) <= CHUNK_TASKS
        assert key == items[0].task_id and rec.task_id is None and rec.version == 0
        assert {by_id(t.task_id) for t in items} == {by_id(key)}, "a packed record holds one partition's tasks"
        seen += [t.task_id for t in items]
    assert sorted(seen) == sorted(ids.values()), "every task exactly once"
    assert len({rec.event_id for _, rec in packed}) == len(packed)
    by_task = {t.task_id: t for _, rec in packed for t in rec.payload.tasks}
    first = by_task[ids["t0"]]
    assert set(first.dependents) == {ids[f"t{i}"] for i in range(1, n)}
    assert first.references == (reference_id("acme", "k0", "outside"),)
    last = by_task[ids[f"t{n - 1}"]]
    assert last.dependents == () and last.references == ()
    assert set(last.spec.dependencies) == {ids[f"t{n - 2}"], ids["t0"]}
    # unpacked, each task has its TaskSubmitted (version 1) and TaskAdmitted (version 2)
    events = task_events_of(d)
    assert {(x.event_id, x.version, x.kind) for x in events if x.task_id == ids["t5"]} == {
        (f"{ids['t5']}:1", 1, "TaskSubmitted"),
        (f"{ids['t5']}:2", 2, "TaskAdmitted"),
    }
    assert len(events) == 2 * n + 1


def test_deciding_the_same_command_again_writes_the_same_records() -> None:
    cmd = command("again", [{"name": f"t{i}", "argv": ["x"], "dependencies": ["t0"] if i else []} for i in range(50)])
    assert written(decide(cmd, LinkIndex())) == written(decide(cmd, LinkIndex()))


def test_the_tasks_carried_out_from_the_command_alone_are_the_decisions_tasks() -> None:
    """After a crash between a decision and its tasks, the next owner writes them from the command."""
    index = LinkIndex()
    cmds = [
        command("plain", [{"name": f"t{i}", "argv": ["x"], "dependencies": ["t0"] if i else []} for i in range(30)]),
        command("linked", [{"name": "a", "argv": ["x"], "dependencies": ["plain/t3"]}, {"name": "b", "argv": ["x"]}]),
    ]
    for cmd in cmds:
        d = admit(cmd, index)
        assert d.admitted is not None
        assert carry_out("node", cmd, 1000).records(by_id) == d.admitted.records(by_id)


def test_a_packed_record_too_big_for_a_message_is_split_without_losing_or_moving_a_task() -> None:
    from taskstream.schemas.codec import Codec
    from taskstream.streams.admitter import encode_split

    codec = Codec({"event": 1}, lambda _id: "")
    tasks = [{"name": f"t{i}", "argv": ["x" * 200], "dependencies": [f"t{i - 1}"] if i else []} for i in range(300)]
    d = admit(command("huge", tasks), LinkIndex())
    for _, key, rec in written(d):
        whole = codec.encode(rec)
        parts = encode_split(codec, key, rec, limit=len(whole) // 5)
        decoded = [(k, codec.decode("event", v)) for k, v in parts]
        if not isinstance(rec.payload, r.TasksAdmitted):
            assert decoded == [(key, rec)], "only packed admissions are split"
            continue
        assert len(parts) >= 5 and all(len(v) <= len(whole) // 5 for _, v in parts)
        got = [t for _, x in decoded for t in x.payload.tasks]
        assert got == list(rec.payload.tasks), "every task once, in order, unchanged"
        assert all(k == x.payload.tasks[0].task_id for k, x in decoded), "keyed by its first task"
        assert {by_id(k) for k, _ in decoded} == {by_id(key)}, "every part stays on the record's partition"
        assert len({x.event_id for _, x in decoded}) == len(parts)
    assert encode_split(codec, "k", d.sends[0][2], limit=10**9) == [("k", codec.encode(d.sends[0][2]))]


def test_small_submissions_of_one_transaction_share_records_and_each_task_keeps_its_submission() -> None:
    """A flood of one-task submissions is one TasksAdmitted per partition and transaction, not one per
    task; every reader still sees each task submitted by its own submission, and a submission alone
    gets the records it always had."""
    from taskstream.projections.graph import graph_writes
    from taskstream.projections.pg_rows import fold
    from taskstream.schemas.codec import Codec
    from taskstream.streams.admission import packed_admissions

    codec = Codec({"event": 1}, lambda _id: "")
    big = admit(command("big", [{"name": f"t{i}", "argv": ["x"]} for i in range(2 * CHUNK_TASKS)]), LinkIndex())
    singles = [admit(command(f"one-{n}", [{"name": "only", "argv": ["x"]}]), LinkIndex()) for n in range(40)]
    admissions = [d.admitted for d in [singles[0], big, *singles[1:]]]
    sends = packed_admissions(admissions, by_id)  # type: ignore[arg-type]

    per_partition: dict[int, int] = {}
    for _, key, rec in sends:
        assert {by_id(t.task_id) for t in rec.payload.tasks} == {by_id(key)}, "a record holds one partition"
        assert len(rec.payload.tasks) <= CHUNK_TASKS
        per_partition[by_id(key)] = per_partition.get(by_id(key), 0) + 1
    total = 2 * CHUNK_TASKS + 40
    assert sum(len(rec.payload.tasks) for _, _, rec in sends) == total, "every task once"
    assert all(n <= total // CHUNK_TASKS + 1 for n in per_partition.values()), per_partition
    assert len({rec.event_id for _, _, rec in sends}) == len(sends), "every record its own id"

    decoded = [codec.decode("event", codec.encode(rec)) for _, _, rec in sends]
    assert decoded == [rec for _, _, rec in sends], "the per-task submission survives the codec"
    expected = {tid: d.admitted.submission_id for d in [big, *singles] for tid in d.admitted.ids.values()}
    events = [x for rec in decoded for x in r.task_events(rec)]
    submitted = {x.task_id: x.payload.submission_id for x in events if isinstance(x.payload, e.TaskSubmitted)}
    assert submitted == expected
    assert {x.task_id: x.submission_id for x in events} == expected, "the events' envelopes too"
    assert {row[0]: row[1] for row in fold(decoded).new_tasks.values()} == expected, "the PostgreSQL rows"
    assert {n["id"]: n["submission_id"] for n in graph_writes(decoded).nodes} == expected, "the graph's nodes"

    for d in (big, singles[3]):  # alone, a submission's records are what they were before sharing
        alone = packed_admissions([d.admitted], by_id)
        sizes: dict[int, int] = {}
        for tid in d.admitted.ids.values():
            sizes[by_id(tid)] = sizes.get(by_id(tid), 0) + 1
        assert len(alone) == sum(-(-n // CHUNK_TASKS) for n in sizes.values()), "one per partition and chunk"
        assert all(t.submission_id is None for _, _, rec in alone for t in rec.payload.tasks)
        assert all(rec.event_id.startswith(f"{d.admitted.submission_id}:admitted:") for _, _, rec in alone)
        assert all("+" not in rec.event_id for _, _, rec in alone)


def test_a_decided_record_keeps_what_an_earlier_one_covers_past_the_batch() -> None:
    """A retried batch can end before the batch whose decisions were committed first: the record written
    for it must still say which later commands are decided and which of them wait for their tasks."""
    from taskstream.streams.admitter import Decided, _decided_after, _pending

    assert _decided_after(None, 12, [10, 12]) == Decided(12, (10, 12))
    assert _decided_after(Decided(11, (9, 11)), 12, [9, 11, 12]) == Decided(12, (9, 11, 12))
    assert _decided_after(Decided(20, (9, 15, 20)), 12, [9]) == Decided(20, (9, 15, 20))
    assert Decided.from_entry(json.loads(Decided(20, (9, 15)).to_json())) == Decided(20, (9, 15))
    # it matters only while the partition's committed offset has not passed it
    assert _pending(Decided(20, (15,)), 20) == Decided(20, (15,))
    assert _pending(Decided(20, (15,)), 21) is None
    assert _pending(None, 0) is None


def test_a_schedule_is_accepted_and_sent_to_its_owner_or_rejected_with_each_problem_named() -> None:
    tasks = parse_document({"tenant": "acme", "tasks": [{"name": "tick", "argv": ["true"]}]}).tasks
    good = r.CommandRecord("cmd-s", 1, r.Schedule("acme", "nightly", "0 2 * * *", "Europe/Berlin", True, {}, tasks))
    d = decide(good, LinkIndex())
    assert d.accepted and d.admitted is None  # nothing is admitted until it is due
    (_, sid, decision), (topic, key, forwarded) = d.sends
    assert isinstance(decision.payload, r.SubmissionAccepted) and decision.payload.task_ids == {}
    assert (topic, key) == ("task-inputs", "schedule:acme/nightly") and forwarded.body == good.body

    bad = r.CommandRecord("cmd-b", 1, r.Schedule("acme", "x/y", "* * *", "Nowhere/Atall", True, {}, ()))
    d = decide(bad, LinkIndex())
    ((_, _, rejected),) = d.sends
    assert not d.accepted and isinstance(rejected.payload, r.SubmissionRejected)
    assert [p.field for p in rejected.payload.errors] == ["name", "cron", "timezone", "tasks"]
    # stopping one needs no tasks
    stop = r.CommandRecord("cmd-t", 1, r.Schedule("acme", "nightly", "* * * * *", "UTC", False))
    assert decide(stop, LinkIndex()).accepted


def set_tenant(body: r.SetTenant):  # type: ignore[no-untyped-def]
    return decide(r.CommandRecord("cmd-tenant", 1, body, "test"), LinkIndex())


def test_setting_a_tenant_resolves_its_tier_and_writes_its_terms_under_the_tenants_key() -> None:
    d = set_tenant(r.SetTenant("acme", "free"))
    assert d.accepted and d.tenant is not None
    assert (d.tenant.max_running, d.tenant.weight) == (10, 1.0)  # the free tier's
    kinds = [(key, type(rec.payload).__name__) for _, key, rec in d.sends]
    assert kinds[1] == (r.TENANT_KEY + "acme", "TenantSet")  # one partition per tenant: changes stay in order
    assert d.sends[1][2].payload == r.TenantSet("acme", "free", 10, 1.0)
    own = set_tenant(r.SetTenant("acme", "premium", max_running=3, weight=0.5)).tenant
    assert own is not None and (own.tier, own.max_running, own.weight) == ("premium", 3, 0.5)
    free_no_cap = set_tenant(r.SetTenant("acme", "free", no_cap=True)).tenant
    assert free_no_cap is not None and free_no_cap.max_running is None


def test_a_tenant_set_wrongly_is_rejected_with_every_field_named() -> None:
    d = set_tenant(r.SetTenant("no spaces", "gold", max_running=-1, weight=float("inf")))
    assert not d.accepted and d.tenant is None
    (rejected,) = [rec.payload for _, _, rec in d.sends]
    assert isinstance(rejected, r.SubmissionRejected)
    fields = {p.field: p.reason for p in rejected.errors}
    assert set(fields) == {"tenant", "tier", "max_running", "weight"}
    assert "free, standard, premium" in fields["tier"] and "'gold'" in fields["tier"]
    both = set_tenant(r.SetTenant("acme", "free", max_running=2, no_cap=True))
    assert not both.accepted


def test_under_closed_tenants_a_submission_or_schedule_of_an_unknown_tenant_is_rejected_with_the_fix() -> None:
    known = {"acme"}.__contains__
    where = Placement(0, lambda _t: 0, by_id, tenant_known=known)
    ok = decide_command("node", command("k1", [{"name": "a", "argv": ["x"]}]), 1000, where=where, index=LinkIndex())
    assert ok.accepted
    cmd = command("k2", [{"name": "a", "argv": ["x"]}], tenant="stranger")
    d = decide_command("node", cmd, 1000, where=where, index=LinkIndex())
    assert not d.accepted and d.admitted is None
    (rejected,) = [rec.payload for _, _, rec in d.sends]
    (problem,) = rejected.errors
    assert problem.field == "tenant" and "'stranger' does not exist" in problem.reason
    assert "taskstream tenants set stranger" in problem.reason
    tasks = parse_document({"tenant": "stranger", "tasks": [{"name": "t", "argv": ["x"]}]}).tasks
    sched = r.Schedule("stranger", "nightly", "0 3 * * *", tasks=tasks)
    d = decide_command("node", r.CommandRecord("cmd-s", 1, sched, "t"), 1000, where=where, index=LinkIndex())
    assert not d.accepted and "does not exist" in d.sends[0][2].payload.errors[0].reason
