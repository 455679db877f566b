-- Fair claiming across tenants (README, "Fair claiming"). A claim serves tasks without a
-- tenant from the claim index and each tenant's from the tenant index, so each task is in
-- one of them: the claim index keeps tasks without a tenant only. Tasks of a tenant now pay
-- one claim-path index entry, not two.
DROP INDEX async_task_claim_idx;
CREATE INDEX async_task_claim_idx ON async_task (priority, run_at, id)
    WHERE state = 'pending' AND tenant IS NULL;

-- Whether a participant other than `t` (a tenant, or NULL: the tasks without one) has pending
-- tasks, the tenants in `apart` (those with a max_running, claimed apart) left out: asked
-- once by each claim that takes one participant's tasks alone, so that the next claim is fair again when another comes. A
-- function, so that the claim statement stays as cheap to plan as a plain one.
CREATE OR REPLACE FUNCTION async_task_others_pending(t text, apart text[]) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF t IS NOT NULL THEN
        PERFORM 1 FROM async_task WHERE tenant IS NULL AND state = 'pending' AND run_at <= now()
          ORDER BY priority, run_at, id LIMIT 1;
        IF FOUND THEN
            RETURN true;
        END IF;
        PERFORM 1 FROM async_task WHERE tenant < t AND tenant IS NOT NULL AND state = 'pending'
           AND tenant <> ALL(apart) ORDER BY tenant DESC LIMIT 1;
        IF FOUND THEN
            RETURN true;
        END IF;
        PERFORM 1 FROM async_task WHERE tenant > t AND tenant IS NOT NULL AND state = 'pending'
           AND tenant <> ALL(apart) ORDER BY tenant LIMIT 1;
        RETURN FOUND;
    END IF;
    PERFORM 1 FROM async_task WHERE tenant IS NOT NULL AND state = 'pending'
       AND tenant <> ALL(apart) ORDER BY tenant LIMIT 1;
    RETURN FOUND;
END
$$;
