-- Version 4: the queue lane a task (and each attempt) was queued in, for `taskstream queues`.

ALTER TABLE tasks ADD COLUMN lane text;
ALTER TABLE attempts ADD COLUMN lane text;
-- What each lane holds now, oldest first, and what it handed out lately.
CREATE INDEX tasks_queued_by_lane ON tasks (lane, queued_at) WHERE status = 'QUEUED';
CREATE INDEX attempts_by_claimed_at ON attempts (claimed_at);
