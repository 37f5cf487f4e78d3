"""Hypothesis strategies shared by the tests."""

from __future__ import annotations

from hypothesis import strategies as st

from taskstream.core.model import Backoff, Call, Resources, TaskSpec

names = st.from_regex(r"[a-z][a-z0-9_-]{0,11}", fullmatch=True)
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)


@st.composite
def specs(draw: st.DrawFn, name: str | None = None, deps: tuple[str, ...] = ()) -> TaskSpec:
    return TaskSpec(
        name=name or draw(names),
        tenant=draw(names),
        argv=tuple(draw(st.lists(text.filter(bool), min_size=1, max_size=4))),
        env=draw(st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), text, max_size=3)),
        working_dir=draw(st.none() | st.just("/tmp")),
        resources=Resources(
            cpu=draw(st.floats(0.1, 64)),
            memory_mb=draw(st.integers(1, 65536)),
            gpu=draw(st.integers(0, 8)),
            labels=tuple(sorted(draw(st.dictionaries(names, names, max_size=2)).items())),
        ),
        execution_cap_ms=draw(st.integers(1, 86_400_000)),
        retry_limit=draw(st.integers(0, 5)),
        backoff=Backoff(
            initial_ms=draw(st.integers(0, 1000)),
            factor=draw(st.floats(1, 4)),
            max_ms=draw(st.integers(1000, 60_000)),
            jitter=draw(st.floats(0, 1)),
        ),
        delay_tolerance_ms=draw(st.integers(0, 10**9)),
        priority=draw(st.integers(-1000, 1000)),
        dependencies=deps,
        not_before_ms=draw(st.none() | st.integers(0, 2**41)),
        labels=draw(st.dictionaries(names, text, max_size=3)),
        call=draw(  # cheap to draw: dags() draws a dozen specs per example
            st.none()
            | st.builds(
                Call,
                st.sampled_from(["os:getpid", "pkg.mod:fn", "a.b.c:Klass.method"]),
                st.sampled_from(["[]", '[1, "a"]', "[[null, true]]"]),
                st.sampled_from(["{}", '{"k": 2}']),
            )
        ),
    )


@st.composite
def dags(draw: st.DrawFn, max_tasks: int = 12) -> list[TaskSpec]:
    """Random acyclic DAGs: a task may only depend on tasks listed before it."""
    n = draw(st.integers(1, max_tasks))
    out: list[TaskSpec] = []
    for i in range(n):
        deps = tuple(sorted(draw(st.sets(st.sampled_from([f"t{j}" for j in range(i)]), max_size=3)))) if i else ()
        out.append(draw(specs(name=f"t{i}", deps=deps)))
    return out


# Avro int is 32 bits: unannotated int fields in st.builds draw from this range.
st.register_type_strategy(int, st.integers(-(2**31), 2**31 - 1))
