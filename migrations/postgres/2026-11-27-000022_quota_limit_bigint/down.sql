CREATE OR REPLACE FUNCTION async_task_tenant_quota() RETURNS trigger LANGUAGE plpgsql AS $$
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
