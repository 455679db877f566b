DROP FUNCTION async_task_others_pending(text, text[]);
DROP INDEX async_task_claim_idx;
CREATE INDEX async_task_claim_idx ON async_task (priority, run_at, id) WHERE state = 'pending';
