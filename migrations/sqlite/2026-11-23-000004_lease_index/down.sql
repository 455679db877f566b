-- The deadlines cleared by up.sql are not restored: a finished task's deadline has no use.
DROP INDEX async_task_lease_idx;
CREATE INDEX async_task_owner_idx ON async_task (owner) WHERE state = 'running';
