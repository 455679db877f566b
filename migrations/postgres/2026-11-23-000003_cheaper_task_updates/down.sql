DROP INDEX async_task_owner_idx;
CREATE INDEX async_task_owner_idx ON async_task (owner) WHERE state = 'running';

ALTER TABLE async_task
    DROP CONSTRAINT async_task_keyword_check,
    ADD CONSTRAINT async_task_keyword_check CHECK (keyword ~ '^[a-z0-9._:-]{1,64}$');
