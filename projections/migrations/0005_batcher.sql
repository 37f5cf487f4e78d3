-- Version 5: what the batcher reads. A task's deadline (ready time + delay tolerance), set with its
-- ready time, and each tenant's share weight and when its terms were last set (`taskstream tenants
-- set`; NULL: never, it has the standard tier's). What workers offer it reads from the workers topic.

ALTER TABLE tasks ADD COLUMN promote_by timestamptz;
-- The batcher's question: each tenant's top ready tasks by deadline, then priority (highest first).
CREATE INDEX tasks_ready_by_deadline ON tasks (tenant, promote_by, priority DESC) WHERE status = 'READY';
-- And what is taken: queued, claimed or running, per tenant.
CREATE INDEX tasks_taken ON tasks (tenant) WHERE status IN ('QUEUED', 'CLAIMED', 'RUNNING');

ALTER TABLE tenants
    ADD COLUMN weight double precision NOT NULL DEFAULT 1,
    ADD COLUMN set_at timestamptz;
