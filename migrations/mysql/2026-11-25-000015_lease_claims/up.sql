-- A task whose process died under it is a suspect: it may have killed the process. The
-- rescue that charges it marks it; claims leave it to a claim of its own, one suspect at a
-- time per process, so that the next death is charged to it alone (README, "Failure
-- behaviour"). Any claim of it clears the mark. One ALTER: it applies whole or not at all,
-- so a failed attempt can run again (MySQL's DDL is not transactional).
ALTER TABLE async_task
    ADD COLUMN suspect BOOLEAN NOT NULL DEFAULT FALSE,
    ADD INDEX async_task_suspect_idx (suspect, state, priority, run_at, id);
