"""What a task is: its submitted specification, its statuses and its folded state.

Everything here is a frozen value. Times are integers in milliseconds since the epoch and are always
passed in; nothing in the core reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class Status(StrEnum):
    """The statuses a person would say aloud about a task."""

    NEW = "NEW"  # nothing recorded yet
    SUBMITTED = "SUBMITTED"  # recorded, admission not yet decided
    WAITING = "WAITING"  # admitted, waiting for prerequisites
    READY = "READY"  # every prerequisite succeeded
    QUEUED = "QUEUED"  # promoted to a queue, visible to workers
    CLAIMED = "CLAIMED"  # one worker holds the claim for the current attempt
    RUNNING = "RUNNING"  # the claimed worker started the process
    RETRY_WAIT = "RETRY_WAIT"  # an attempt failed; the next one is due after a backoff
    SUCCEEDED = "SUCCEEDED"
    DEAD_LETTERED = "DEAD_LETTERED"  # retries exhausted
    CANCELLED = "CANCELLED"
    REJECTED = "REJECTED"  # admission refused it


TERMINAL: frozenset[Status] = frozenset({Status.SUCCEEDED, Status.DEAD_LETTERED, Status.CANCELLED, Status.REJECTED})


@dataclass(frozen=True, slots=True)
class Call:
    """A Python callable a task runs instead of a program (streams/runner.py)."""

    target: str  # "package.module:function"
    args_json: str = "[]"
    kwargs_json: str = "{}"


@dataclass(frozen=True, slots=True)
class Resources:
    cpu: float = 1.0  # cores
    memory_mb: int = 256
    gpu: int = 0
    # worker labels it needs, (key, value) sorted by key: it runs only on a worker advertising each
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry backoff: delay = min(max_ms, initial_ms * factor ** (failures - 1)), plus jitter."""

    initial_ms: int = 1000
    factor: float = 2.0
    max_ms: int = 60_000
    jitter: float = 0.0  # fraction of the delay, 0..1


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """What a submission says about one task (the seed's 'what a task submission contains')."""

    name: str  # unique within its submission; dependencies refer to names
    tenant: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    resources: Resources = field(default_factory=Resources)
    execution_cap_ms: int = 3_600_000
    retry_limit: int = 0  # retries after a failed run (a run handed back or whose lease expired is not one)
    backoff: Backoff = field(default_factory=Backoff)
    delay_tolerance_ms: int = 0  # how long it may wait once ready; the batcher orders by it
    priority: int = 0  # higher runs first among equal delay tolerance
    dependencies: tuple[str, ...] = ()  # task ids once admitted (names in a raw submission)
    not_before_ms: int | None = None  # optional earliest start time
    labels: dict[str, str] = field(default_factory=dict)
    call: Call | None = None  # a callable to run instead of argv (then empty)

    def __hash__(self) -> int:  # dict fields are not hashable; identity of a spec is its name
        return hash((self.name, self.tenant, self.argv))


@dataclass(frozen=True, slots=True)
class Claim:
    attempt: int
    worker: str
    claim_id: str


@dataclass(frozen=True, slots=True)
class TaskState:
    """A task folded from its events. `version` counts the events applied."""

    task_id: str
    status: Status = Status.NEW
    version: int = 0
    spec: TaskSpec | None = None
    submission_id: str = ""
    priority: int = 0
    attempt: int = 0  # number of the current or last attempt (1-based once queued)
    claim: Claim | None = None
    retry_due_ms: int | None = None
    exit_code: int | None = None
    reason: str = ""  # why it is in its status, for people
    updated_ms: int = 0
    fenced_claims: tuple[str, ...] = ()  # claims whose leases expired (the newest few): reports refused
    lease_expiries: int = 0  # leases that expired while it ran (a claim never started is not counted)
    failures: int = 0  # attempts that ran and failed: what retry_limit counts (a release or an expiry is not one)
    cancelled_claim: str | None = None  # the claim it was running under when cancelled: its kill is recorded
    lane: str = "default"  # the queue lane of its current or last attempt
    limited_claim: str | None = None  # the claim whose run the resource manager ordered killed

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL
