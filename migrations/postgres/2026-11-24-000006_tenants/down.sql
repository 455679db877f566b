DROP TRIGGER async_task_tenant_quota ON async_task;
DROP FUNCTION async_task_tenant_quota();
DROP INDEX async_task_tenant_idx;
DROP TABLE async_audit;
DROP TABLE async_tenant;
