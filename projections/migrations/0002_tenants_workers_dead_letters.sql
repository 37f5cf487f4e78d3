-- Version 2: tenants with their subscription levels, workers seen in claims, dead letters.

CREATE TABLE tenants (
    tenant           text PRIMARY KEY,
    subscription     text NOT NULL DEFAULT 'standard',
    max_running      integer,            -- NULL: no limit yet (the batcher enforces it in a later version)
    first_seen       timestamptz NOT NULL,
    last_submission  timestamptz NOT NULL
);

CREATE TABLE workers (
    worker_id    text PRIMARY KEY,
    first_seen   timestamptz NOT NULL,
    last_seen    timestamptz NOT NULL,
    last_task    uuid
);

-- Records nobody could decode, copied from the dead-letters topic with the reason from their headers.
CREATE TABLE dead_letters (
    topic            text NOT NULL,
    partition        integer NOT NULL,
    "offset"         bigint NOT NULL,
    source_topic     text,
    source_partition integer,
    source_offset    bigint,
    detected_by      text,
    reason           text NOT NULL,
    key              bytea,
    value            bytea,
    logged_at        timestamptz NOT NULL,
    PRIMARY KEY (topic, partition, "offset")
);
