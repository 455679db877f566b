-- Tenant quotas (README, "Tenants"). A tenant without a row is unlimited and weighs 1; its
-- tasks pay one index entry per queued or running row version (the index below) and, at
-- enqueue, the trigger's look-up of its (missing) row. Tasks without a tenant pay nothing.
CREATE TABLE async_tenant (
    tenant      TEXT        PRIMARY KEY
        CONSTRAINT async_tenant_tenant_check CHECK (octet_length(tenant) BETWEEN 1 AND 128),
    -- Pending and blocked tasks at most (NULL: unlimited). Checked at enqueue.
    max_queued  INTEGER     CONSTRAINT async_tenant_max_queued_check
        CHECK (max_queued IS NULL OR max_queued >= 0),
    -- Running tasks at most, fleet-wide (NULL: unlimited). Checked at claim.
    max_running INTEGER     CONSTRAINT async_tenant_max_running_check
        CHECK (max_running IS NULL OR max_running >= 0),
    weight      INTEGER     NOT NULL DEFAULT 1
        CONSTRAINT async_tenant_weight_check CHECK (weight >= 1),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_by  TEXT        NOT NULL DEFAULT current_user
);

-- What operators changed, in the transaction of the change.
CREATE TABLE async_audit (
    id       BIGSERIAL   PRIMARY KEY,
    at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    actor    TEXT        NOT NULL,   -- $USER@host, or the library caller's name
    action   TEXT        NOT NULL,   -- tenant.set, task.cancel, task.retry, …
    target   TEXT        NOT NULL,   -- what it applied to: a tenant, a task id, a filter
    detail   JSONB       NOT NULL DEFAULT '{}',
    affected BIGINT      NOT NULL DEFAULT 0
);

-- A tenant's queued and running tasks, in claim order: counted by the quota checks (up to
-- the limit), and scanned by the claim of a tenant with max_running.
CREATE INDEX async_task_tenant_idx ON async_task (tenant, state, priority, run_at, id)
    WHERE tenant IS NOT NULL AND state IN ('pending', 'blocked', 'running');

-- max_queued, race-free across producers. The trigger runs for tasks with a tenant only,
-- and does nothing more than one primary-key probe unless the tenant has a max_queued. Then
-- it takes a transaction-level advisory lock on the tenant (class 0x6f71, 'oq'; the key is
-- the tenant's hash, so two tenants may share one and only wait for each other), held until
-- the producer's transaction ends, and counts the tenant's queued tasks, stopping at the
-- limit. In READ COMMITTED (PostgreSQL's default) each statement of the function sees what
-- committed before it began, so the count, taken after the lock, includes every task of the
-- producers that held it before. (Under REPEATABLE READ the snapshot is older than the lock
-- and the count can miss them; SERIALIZABLE fails one of the producers instead.) A row that
-- repeats an existing (keyword, biz_id) is let through, to be skipped by the insert's
-- ON CONFLICT: an idempotent repeat is a duplicate, not a quota error.
CREATE OR REPLACE FUNCTION async_task_tenant_quota() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    lim    integer;
    queued integer;
BEGIN
    SELECT max_queued INTO lim FROM async_tenant
     WHERE tenant = NEW.tenant AND max_queued IS NOT NULL;
    IF lim IS NULL THEN
        RETURN NEW;
    END IF;
    PERFORM pg_advisory_xact_lock(x'6f71'::int, hashtext(NEW.tenant));
    SELECT max_queued INTO lim FROM async_tenant
     WHERE tenant = NEW.tenant AND max_queued IS NOT NULL;
    IF lim IS NULL THEN
        RETURN NEW;
    END IF;
    SELECT count(*) INTO queued FROM (
        SELECT 1 FROM async_task
         WHERE tenant = NEW.tenant AND state IN ('pending', 'blocked') LIMIT lim) q;
    IF queued >= lim AND NOT EXISTS (
        SELECT 1 FROM async_task WHERE keyword = NEW.keyword AND biz_id = NEW.biz_id) THEN
        RAISE EXCEPTION 'async_task: tenant % has % queued tasks, its max_queued', NEW.tenant, lim
            USING ERRCODE = 'check_violation', CONSTRAINT = 'async_tenant_max_queued',
                  TABLE = 'async_task',
                  DETAIL = json_build_object('tenant', NEW.tenant, 'limit', lim)::text;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER async_task_tenant_quota BEFORE INSERT ON async_task
    FOR EACH ROW WHEN (NEW.tenant IS NOT NULL AND NEW.state IN ('pending', 'blocked'))
    EXECUTE FUNCTION async_task_tenant_quota();
