-- How many processes died while they held the task (each death charged by rescue): it may be
-- what kills them. From the second, claims of pages leave it to a claim of its own, one such
-- suspect at a time per worker, so that the next death is charged to it alone (README,
-- "Failure behaviour"). (Leases are PostgreSQL's: lock claims need row locks.)
ALTER TABLE async_task ADD COLUMN suspect INTEGER NOT NULL DEFAULT 0
    CONSTRAINT async_task_suspect_check CHECK (typeof(suspect) = 'integer' AND suspect >= 0);
CREATE INDEX async_task_suspect_idx ON async_task (priority, run_at, id)
    WHERE state = 'pending' AND suspect >= 2;
