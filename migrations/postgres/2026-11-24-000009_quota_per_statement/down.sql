DROP TRIGGER async_task_tenant_quota ON async_task;
DROP FUNCTION async_task_tenant_quota();

CREATE FUNCTION async_task_tenant_quota() RETURNS trigger LANGUAGE plpgsql AS $$
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
