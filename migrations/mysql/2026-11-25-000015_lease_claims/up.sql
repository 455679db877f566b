-- How many processes died while they held the task (each death charged by rescue): it may be
-- what kills them. From the second, claims of pages leave it to a claim of its own, one such
-- suspect at a time per worker, so that the next death is charged to it alone (README,
-- "Failure behaviour"). One ALTER: it applies whole or not at all, so a failed attempt can
-- run again (MySQL's DDL is not transactional).
ALTER TABLE async_task
    ADD COLUMN suspect INT NOT NULL DEFAULT 0,
    ADD INDEX async_task_suspect_idx (state, suspect, priority, run_at, id);
