"""Parsing and checking submissions: every problem names the task, the field and the reason."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taskstream.core.model import TaskSpec
from taskstream.core.submission import (
    MAX_TASKS,
    Submission,
    SubmissionError,
    check_submission,
    find_cycle,
    parse_document,
    reference_id,
    resolve_dependencies,
    submission_id_for,
    task_ids,
)
from tests.strategies import dags


def doc(*tasks: dict, **top: object) -> dict:
    return {"tenant": "acme", "tasks": list(tasks), **top}


def errors_of(document: object) -> list[str]:
    with pytest.raises(SubmissionError) as info:
        parse_document(document)
    return [str(e) for e in info.value.errors]


def test_a_good_document_parses_into_specs_in_milliseconds() -> None:
    sub = parse_document(
        doc(
            {
                "name": "a",
                "argv": ["echo", "hi"],
                "execution_cap_s": 1.5,
                "not_before": "2026-01-01T00:00:00Z",
                "backoff": {"initial_s": 0.25},
            },
            {"name": "b", "argv": ["true"], "dependencies": ["a"], "tenant": "other"},
            defaults={"retry_limit": 2},
            idempotency_key="k1",
        )
    )
    a, b = sub.tasks
    assert a.execution_cap_ms == 1500 and a.backoff.initial_ms == 250 and a.retry_limit == 2
    assert a.not_before_ms == 1767225600000
    assert b.tenant == "other" and b.dependencies == ("a",)
    assert sub.idempotency_key == "k1"


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ({"name": "a", "argv": "echo hi"}, "task 'a', field 'argv': must be a list of strings (no shell string)"),
        ({"name": "a", "argv": [True]}, "task 'a', field 'argv[0]': must be a string, got bool True"),
        ({"name": "a", "argv": ["sleep", 5]}, "task 'a', field 'argv[1]': must be a string, got int 5 (quote it"),
        ({"name": "a", "argv": ["echo", None]}, "task 'a', field 'argv[1]': must be a string, got NoneType None"),
        (
            {"name": "a", "argv": ["x"], "retry_limit": -1},
            "task 'a', field 'retry_limit': must be between 0 and 100, got -1",
        ),
        (
            {"name": "a", "argv": ["x"], "retry_limit": "3"},
            "task 'a', field 'retry_limit': must be an integer, got '3'",
        ),
        ({"name": "a", "argv": ["x"], "resources": {"cpu": 0}}, "task 'a', field 'resources.cpu': must be > 0"),
        ({"name": "a", "argv": ["x"], "resources": {"disk": 1}}, "task 'a', field 'resources.disk': unknown field"),
        (
            {"name": "a", "argv": ["x"], "resources": {"labels": {"zone": ["eu"]}}},
            "task 'a', field 'resources.labels.zone': must map a string to a string",
        ),
        (
            {"name": "a", "argv": ["x"], "resources": {"labels": {"zone": "eu,us"}}},
            "task 'a', field 'resources.labels.zone': must be a worker label as workers advertise them",
        ),
        (
            {"name": "a", "argv": ["x"], "resources": {"labels": "zone=eu"}},
            "task 'a', field 'resources.labels': must be a mapping of strings",
        ),
        ({"name": "a", "argv": ["x"], "colour": "red"}, "task 'a', field 'colour': unknown field"),
        (
            {"name": "a", "argv": ["x"], "not_before": "2026-01-01T00:00:00"},
            "task 'a', field 'not_before': must include a time zone",
        ),
        ({"name": "a", "argv": ["x"], "execution_cap_s": 0}, "task 'a', field 'execution_cap_s': must be > 0"),
        (
            {"name": "a", "argv": ["x"], "env": {"1BAD": "v"}},
            "task 'a', field 'env.1BAD': is not a valid environment variable name",
        ),
        ({"name": "a b", "argv": ["x"]}, "task 'a b', field 'name': must be 1-128 characters"),
        ({"argv": ["x"]}, "task '#0', field 'name': is required"),
        (
            {"name": "a", "argv": ["x"], "dependencies": ["nope"]},
            "task 'a', field 'dependencies': names 'nope', which is not a task of this submission",
        ),
        (
            {"name": "a", "argv": ["x"], "dependencies": ["a"]},
            "task 'a', field 'dependencies': a task cannot depend on itself",
        ),
    ],
)
def test_each_bad_field_is_named(task: dict, expected: str) -> None:
    assert any(e.startswith(expected) for e in errors_of(doc(task))), errors_of(doc(task))


def test_document_level_problems() -> None:
    assert errors_of([]) == ["submission, field '(document)': must be a mapping with 'tenant' and 'tasks'"]
    errs = errors_of({"tasks": []})
    assert "submission, field 'tenant': is required and must be a non-empty string" in errs
    assert "submission, field 'tasks': is required and must be a non-empty list" in errs


def test_duplicate_names_are_refused() -> None:
    errs = errors_of(doc({"name": "a", "argv": ["x"]}, {"name": "a", "argv": ["y"]}))
    assert "task 'a', field 'name': is used by more than one task in this submission" in errs


def test_a_cycle_is_rejected_and_named() -> None:
    errs = errors_of(
        doc(
            {"name": "a", "argv": ["x"], "dependencies": ["c"]},
            {"name": "b", "argv": ["x"], "dependencies": ["a"]},
            {"name": "c", "argv": ["x"], "dependencies": ["b"]},
        )
    )
    assert len(errs) == 1
    assert "closes a cycle: a -> c -> b -> a" in errs[0]


def test_too_many_tasks() -> None:
    from taskstream.core.model import TaskSpec

    tasks = tuple(TaskSpec(name=f"t{i}", tenant="acme", argv=("x",)) for i in range(MAX_TASKS + 1))
    errs = check_submission(Submission("acme", tasks))
    assert [str(e) for e in errs] == [f"submission, field 'tasks': has {MAX_TASKS + 1} tasks, the limit is {MAX_TASKS}"]


@given(dags())
def test_acyclic_dags_have_no_cycle_and_adding_a_back_edge_makes_one(specs: list) -> None:
    graph = {s.name: list(s.dependencies) for s in specs}
    assert find_cycle(graph) is None
    deps_of_last = graph[specs[-1].name]
    if deps_of_last:
        first = deps_of_last[0]
        graph[first] = [*graph[first], specs[-1].name]  # first now depends on last, which depends on first
        cycle = find_cycle(graph)
        assert cycle is not None and cycle[0] == cycle[-1]
        for a, b in zip(cycle, cycle[1:], strict=False):
            assert b in graph[a]


@given(dags())
def test_ids_are_a_function_of_the_submission_and_name(specs: list) -> None:
    sub = Submission("acme", tuple(specs), idempotency_key="k")
    sid = submission_id_for("acme", "k", command_id="c1")
    assert sid == submission_id_for("acme", "k", command_id="c2")  # same key, any command: same submission
    ids1, ids2 = task_ids(sub, sid), task_ids(sub, sid)
    out1 = resolve_dependencies(sub, ids1)
    assert ids1 == ids2 and len(set(ids1.values())) == len(specs)
    for spec, original in zip(out1, specs, strict=True):
        assert spec.dependencies == tuple(ids1[d] for d in original.dependencies)
        assert replace(spec, dependencies=original.dependencies) == original  # nothing else changed


@given(st.text(min_size=1, max_size=5), st.text(min_size=1, max_size=5))
def test_without_a_key_each_command_is_its_own_submission(c1: str, c2: str) -> None:
    assert (submission_id_for("t", None, c1) == submission_id_for("t", None, c2)) == (c1 == c2)


def test_fast_ids_equal_rfc_4122_uuid5() -> None:
    import uuid

    from taskstream.core.submission import ID_NAMESPACE, submission_id_for, task_id_for

    for tenant, key, cmd in [("acme", "k1", "c"), ("t", None, "cmd-1"), ("ü", "a/b", "x")]:
        want = uuid.uuid5(ID_NAMESPACE, f"key/{tenant}/{key}" if key else f"command/{cmd}")
        assert submission_id_for(tenant, key, cmd) == str(want)
        assert task_id_for(str(want), "n.1") == str(uuid.uuid5(ID_NAMESPACE, f"task/{want}/n.1"))


def test_assigning_ids_rewrites_only_the_dependencies() -> None:
    import dataclasses

    sub = parse_document(
        {
            "tenant": "acme",
            "idempotency_key": "k",
            "tasks": [
                {"name": "a", "argv": ["x"], "env": {"A": "1"}, "labels": {"l": "v"}, "priority": 3},
                {"name": "b", "argv": ["y"], "dependencies": ["a", "other/c"], "not_before": 5, "retry_limit": 2},
            ],
        }
    )
    ids = task_ids(sub, "sid")
    specs = resolve_dependencies(sub, ids)
    for before, after in zip(sub.tasks, specs, strict=True):
        assert dataclasses.replace(before, dependencies=after.dependencies) == after
    assert specs[1].dependencies == (ids["a"], reference_id("acme", "other", "c"))


def test_references_to_other_submissions_are_checked_for_shape() -> None:
    def problems(deps: list[str], key: str | None = "mine") -> list[str]:
        sub = Submission("acme", (TaskSpec("a", "acme", ("x",), dependencies=tuple(deps)),), key)
        return [e.reason for e in check_submission(sub)]

    assert problems(["other/x", "a/b/c.d"]) == []  # the last '/' separates key and name
    assert "is not a reference" in problems(["/x"])[0]
    assert "is not a reference" in problems(["k/bad name"])[0]
    assert "refers to this submission" in problems(["mine/a"])[0]
    assert "not a task of this submission" in problems(["nope"])[0]


def test_find_cycle_from_roots_only_walks_what_they_reach() -> None:
    graph = {"n1": ["n2"], "n2": ["old"], "old": ["n1"], "x": ["y"], "y": ["x"]}
    assert find_cycle(graph, roots=["n1"]) == ["n1", "n2", "old", "n1"]
    assert find_cycle({"n1": ["old"], "old": ["gone"], "x": ["y"], "y": ["x"]}, roots=["n1"]) is None
