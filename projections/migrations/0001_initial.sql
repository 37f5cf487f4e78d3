-- taskstream PostgreSQL read model, version 1. Rebuilt from the events topic by the pg projection.

CREATE TABLE tasks (
    task_id             uuid PRIMARY KEY,
    submission_id       uuid NOT NULL,
    name                text NOT NULL,
    tenant              text NOT NULL,
    status              text NOT NULL,
    version             bigint NOT NULL,
    argv                text[] NOT NULL,
    env                 jsonb NOT NULL DEFAULT '{}',
    working_dir         text,
    cpu                 double precision NOT NULL,
    memory_mb           bigint NOT NULL,
    gpu                 integer NOT NULL,
    execution_cap_ms    bigint NOT NULL,
    retry_limit         integer NOT NULL,
    backoff             jsonb NOT NULL,
    delay_tolerance_ms  bigint NOT NULL,
    priority            integer NOT NULL,
    dependencies        uuid[] NOT NULL DEFAULT '{}',
    not_before          timestamptz,
    labels              jsonb NOT NULL DEFAULT '{}',
    attempt             integer NOT NULL DEFAULT 0,
    worker              text,
    exit_code           integer,
    reason              text NOT NULL DEFAULT '',
    submitted_at        timestamptz,
    admitted_at         timestamptz,
    ready_at            timestamptz,
    queued_at           timestamptz,
    claimed_at          timestamptz,
    started_at          timestamptz,
    finished_at         timestamptz,
    updated_at          timestamptz NOT NULL
);

-- The batcher's question: top K ready tasks by delay tolerance, then priority (highest first).
CREATE INDEX tasks_ready_by_tolerance ON tasks (delay_tolerance_ms, priority DESC, ready_at) WHERE status = 'READY';
CREATE INDEX tasks_by_submission ON tasks (submission_id);
CREATE INDEX tasks_by_tenant_status ON tasks (tenant, status);

CREATE TABLE attempts (
    task_id      uuid NOT NULL,
    attempt      integer NOT NULL,
    worker       text,
    claim_id     text,
    queued_at    timestamptz,
    claimed_at   timestamptz,
    started_at   timestamptz,
    ended_at     timestamptz,
    pid          integer,
    exit_code    integer,
    duration_ms  bigint,
    output_tail  text,
    outcome      text,          -- SUCCEEDED, FAILED, TIMED_OUT, CANCELLED
    reason       text,
    PRIMARY KEY (task_id, attempt)
);

CREATE TABLE submissions (
    submission_id    uuid PRIMARY KEY,
    tenant           text NOT NULL,
    idempotency_key  text,
    command_id       text NOT NULL,
    outcome          text NOT NULL,  -- ACCEPTED or REJECTED
    task_ids         jsonb NOT NULL DEFAULT '{}',
    errors           jsonb NOT NULL DEFAULT '[]',
    decided_at       timestamptz NOT NULL
);

-- One row per (projection, topic, partition): the next offset to apply. Written in the same
-- transaction as the rows it covers, so a crash never applies an event twice or skips one.
CREATE TABLE projection_checkpoints (
    projection   text NOT NULL,
    topic        text NOT NULL,
    partition    integer NOT NULL,
    next_offset  bigint NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, topic, partition)
);
