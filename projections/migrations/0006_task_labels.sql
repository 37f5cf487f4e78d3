-- Version 6: the worker labels a task needs (its resources' `labels`), which the batcher matches
-- against what the live workers advertise: {} for a task that needs none.

ALTER TABLE tasks ADD COLUMN needs_labels jsonb NOT NULL DEFAULT '{}'::jsonb;
