ALTER TABLE async_task
    DROP INDEX async_task_pending_tenant_idx,
    DROP INDEX async_task_suspect_idx,
    DROP COLUMN pending_tenant,
    DROP COLUMN pending_suspect,
    ADD INDEX async_task_pending_tenant_idx (state, tenant),
    ADD INDEX async_task_suspect_idx (state, suspect, priority, run_at, id);
