-- max_queued checked once per statement and tenant, not once per row: the row trigger
-- counted the tenant's queued tasks (up to its limit) for every row, so a bulk enqueue of
-- n rows for a tenant with q queued cost about n × min(q, limit) index entries.
--
-- The check now runs after the INSERT statement, over the rows it inserted (its transition
-- table, which holds no row that ON CONFLICT skipped: an idempotent repeat is a duplicate,
-- not a quota error). For each tenant among them with a max_queued, in a fixed order (no
-- two producers wait for each other's locks in turn), it takes the transaction-level
-- advisory lock on the tenant (class 0x6f71, 'oq', as before), then counts the tenant's
-- queued tasks — the statement's own rows included — stopping at limit + 1. Over the limit,
-- the statement fails and writes nothing. In READ COMMITTED (PostgreSQL's default) the
-- count, a statement begun after the lock, sees every task of the producers that held the
-- lock before; under REPEATABLE READ it may miss them (SERIALIZABLE fails one producer).
DROP TRIGGER async_task_tenant_quota ON async_task;
DROP FUNCTION async_task_tenant_quota();

CREATE FUNCTION async_task_tenant_quota() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    t      record;
    lim    integer;
    queued integer;
BEGIN
    FOR t IN
        SELECT DISTINCT i.tenant, hashtext(i.tenant) AS h
          FROM inserted i
          JOIN async_tenant a ON a.tenant = i.tenant AND a.max_queued IS NOT NULL
         WHERE i.state IN ('pending', 'blocked')
         ORDER BY h, i.tenant
    LOOP
        PERFORM pg_advisory_xact_lock(x'6f71'::int, t.h);
        SELECT max_queued INTO lim FROM async_tenant
         WHERE tenant = t.tenant AND max_queued IS NOT NULL;
        CONTINUE WHEN lim IS NULL;
        SELECT count(*) INTO queued FROM (
            SELECT 1 FROM async_task
             WHERE tenant = t.tenant AND state IN ('pending', 'blocked') LIMIT lim + 1) q;
        IF queued > lim THEN
            RAISE EXCEPTION 'async_task: tenant % has % queued tasks, its max_queued', t.tenant, lim
                USING ERRCODE = 'check_violation', CONSTRAINT = 'async_tenant_max_queued',
                      TABLE = 'async_task',
                      DETAIL = json_build_object('tenant', t.tenant, 'limit', lim)::text;
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER async_task_tenant_quota AFTER INSERT ON async_task
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION async_task_tenant_quota();
