-- Version 3: tasks that run a Python callable instead of a program (argv is then empty).

ALTER TABLE tasks ADD COLUMN call jsonb;  -- {"target": "package.module:function", "args": [...], "kwargs": {...}}
