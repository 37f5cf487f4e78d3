"""What an agent does when handling one record fails: dead-letter it with the error, keep going."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from taskstream.streams.app import _guarded


class RecordingContext:
    def __init__(self) -> None:
        self.letters: list[tuple[Any, str, str]] = []

    async def dead_letter(self, message: Any, reason: str, detected_by: str) -> None:
        self.letters.append((message, reason, detected_by))


def test_a_failing_handler_dead_letters_the_record_with_the_error() -> None:
    ctx = RecordingContext()
    msg = SimpleNamespace(topic="t", partition=1, offset=7, key=b"k", value=b"v")

    async def broken() -> None:
        raise KeyError("spec")

    asyncio.run(_guarded(ctx, msg, "lifecycle", broken()))  # type: ignore[arg-type]
    assert ctx.letters == [(msg, "lifecycle failed on this record: KeyError: 'spec'", "lifecycle")]


def test_a_handler_that_works_dead_letters_nothing() -> None:
    ctx = RecordingContext()
    done: list[int] = []

    async def fine() -> None:
        done.append(1)

    asyncio.run(_guarded(ctx, SimpleNamespace(topic="t", partition=0, offset=0), "admission", fine()))  # type: ignore[arg-type]
    assert done == [1] and ctx.letters == []
