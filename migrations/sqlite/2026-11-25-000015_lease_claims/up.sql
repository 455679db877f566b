-- A task whose process died under it is a suspect: it may have killed the process. The
-- rescue that charges it marks it; claims leave it to a claim of its own, one suspect at a
-- time per process, so that the next death is charged to it alone (README, "Failure
-- behaviour"). Any claim of it clears the mark. (Leases are PostgreSQL's: lock claims need
-- row locks.)
ALTER TABLE async_task ADD COLUMN suspect INTEGER NOT NULL DEFAULT 0
    CONSTRAINT async_task_suspect_check CHECK (suspect IN (0, 1));
CREATE INDEX async_task_suspect_idx ON async_task (priority, run_at, id)
    WHERE state = 'pending' AND suspect = 1;
