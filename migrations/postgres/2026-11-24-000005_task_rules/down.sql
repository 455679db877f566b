DROP TRIGGER async_task_run_at_ahead ON async_task;
DROP TRIGGER async_task_biz_data_size ON async_task;
DROP FUNCTION async_task_refuse();
ALTER TABLE async_task DROP CONSTRAINT async_task_tenant_check;
