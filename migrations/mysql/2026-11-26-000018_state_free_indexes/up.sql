-- MySQL has no partial indexes. The tenant index (state, tenant) and the suspects' index
-- (state, suspect, priority, run_at, id) held every task, and every change of a task's state
-- moved its entry in both: a claim and a completion each rewrote two index entries that no
-- claim of a task without a tenant, or not a suspect, ever reads. Each is now an index of a
-- stored generated column that is NULL but while the task is pending (and, for the suspects',
-- a suspect): such a task's entries never move (docs/notes/2026-11-26-claim-by-keyword.md has
-- what it saves). The engine's statements read the generated columns (driver/mysql/fair.rs).
-- One ALTER: it applies whole or not at all (MySQL's DDL is not transactional).
ALTER TABLE async_task
    ADD COLUMN pending_tenant VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
        AS (CASE WHEN state = 'pending' THEN tenant END) STORED,
    ADD COLUMN pending_suspect INT
        AS (CASE WHEN state = 'pending' AND suspect >= 2 THEN 1 END) STORED,
    DROP INDEX async_task_pending_tenant_idx,
    ADD INDEX async_task_pending_tenant_idx (pending_tenant),
    DROP INDEX async_task_suspect_idx,
    ADD INDEX async_task_suspect_idx (pending_suspect, priority, run_at, id);
