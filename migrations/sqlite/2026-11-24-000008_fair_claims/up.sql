-- Fair claiming across tenants (README, "Fair claiming"). A claim serves tasks without a
-- tenant from the claim index and each tenant's from the tenant index, so each task is in
-- one of them: the claim index keeps tasks without a tenant only. Tasks of a tenant now pay
-- one claim-path index entry, not two.
DROP INDEX async_task_claim_idx;
CREATE INDEX async_task_claim_idx ON async_task (priority, run_at, id)
    WHERE state = 'pending' AND tenant IS NULL;
