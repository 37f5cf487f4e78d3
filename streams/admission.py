"""Admission (the seed's task submitter): one command in, one set of events out.

A SubmitDag is checked whole; if any rule fails nothing is admitted and a SubmissionRejected names every
problem. Otherwise every task gets a system id derived from the submission, so a redelivered or
replayed command reproduces the same ids and events (downstream skips what it has seen), and the
TaskSubmitted/TaskAdmitted events plus SubmissionAccepted are written before the offset is committed.
"""

from __future__ import annotations

import logging
from typing import Any

from taskstream.schemas import records as r
from taskstream.schemas.codec import DecodeError
from taskstream.streams.context import Context

from taskstream.core import events as e
from taskstream.core.submission import Submission, assign_ids, check_submission, submission_id_for

log = logging.getLogger(__name__)


def admission_events(ctx: Context, cmd: r.CommandRecord, body: r.SubmitDag, at_ms: int) -> list[tuple[Any, str, Any]]:
    """Pure apart from ctx's topic handles: the (topic, key, record) sends that admit or reject `body`."""
    sid = submission_id_for(body.tenant, body.idempotency_key, cmd.command_id)
    sub = Submission(tenant=body.tenant, tasks=body.tasks, idempotency_key=body.idempotency_key, labels=body.labels)
    errors = check_submission(sub)
    if errors:
        problems = tuple(r.FieldProblem(x.task, x.field, x.reason) for x in errors)
        rejected = r.SubmissionRejected(tenant=body.tenant, command_id=cmd.command_id, errors=problems)
        return [(ctx.events, sid, ctx.event(None, sid, 0, at_ms, rejected, event_id=f"{sid}:rejected"))]
    ids, specs = assign_ids(sub, sid)
    sends: list[tuple[Any, str, Any]] = []
    for spec in specs:
        tid = ids[spec.name]
        sends.append((ctx.events, tid, ctx.event(tid, sid, 1, at_ms, e.TaskSubmitted(submission_id=sid, spec=spec))))
        sends.append((ctx.events, tid, ctx.event(tid, sid, 2, at_ms, e.TaskAdmitted(node=ctx.node))))
    accepted = r.SubmissionAccepted(
        tenant=body.tenant, idempotency_key=body.idempotency_key, command_id=cmd.command_id, task_ids=ids
    )
    sends.append((ctx.events, sid, ctx.event(None, sid, 0, at_ms, accepted, event_id=f"{sid}:accepted")))
    return sends


async def handle_command(ctx: Context, message: Any) -> None:
    at_ms = int(message.timestamp * 1000)  # log time: the same on every reprocessing
    try:
        cmd = ctx.codec.decode("command", message.value)
    except DecodeError as err:
        log.warning(
            "command at %s[%d]@%d is undecodable: %s", message.topic, message.partition, message.offset, err.reason
        )
        await ctx.dead_letter(message, err.reason, "admission")
        return
    body = cmd.body
    if isinstance(body, r.SubmitDag):
        sends = admission_events(ctx, cmd, body, at_ms)
    elif isinstance(body, r.CancelTaskRequest):
        sends = [
            (
                ctx.inputs,
                body.task_id,
                ctx.input(
                    body.task_id,
                    at_ms,
                    r.CancelRequest(body.reason or f"cancelled by {cmd.issuer or 'a user'}"),
                    f"{cmd.command_id}:cancel",
                ),
            )
        ]
    elif isinstance(body, r.ReprioritizeTaskRequest):
        sends = [
            (
                ctx.inputs,
                body.task_id,
                ctx.input(body.task_id, at_ms, r.ReprioritizeRequest(body.priority), f"{cmd.command_id}:reprioritize"),
            )
        ]
    else:  # pragma: no cover - the codec only yields known bodies
        return
    await ctx.send_all(sends)
