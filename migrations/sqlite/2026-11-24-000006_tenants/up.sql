-- Tenant quotas (README, "Tenants"). A tenant without a row is unlimited and weighs 1; its
-- tasks pay one index entry per queued or running row version (the index below) and, at
-- enqueue, the trigger's look-up of its (missing) row. Tasks without a tenant pay nothing.
CREATE TABLE async_tenant (
    tenant      TEXT    PRIMARY KEY NOT NULL CONSTRAINT async_tenant_tenant_check CHECK (
        typeof(tenant) = 'text' AND length(CAST(tenant AS BLOB)) BETWEEN 1 AND 128
        AND instr(CAST(tenant AS BLOB), x'00') = 0),
    -- Pending and blocked tasks at most (NULL: unlimited). Checked at enqueue.
    max_queued  INTEGER CONSTRAINT async_tenant_max_queued_check CHECK (max_queued IS NULL OR (
        typeof(max_queued) = 'integer' AND max_queued BETWEEN 0 AND 2147483647)),
    -- Running tasks at most, across every process on the file (NULL: unlimited).
    max_running INTEGER CONSTRAINT async_tenant_max_running_check CHECK (max_running IS NULL OR (
        typeof(max_running) = 'integer' AND max_running BETWEEN 0 AND 2147483647)),
    weight      INTEGER NOT NULL DEFAULT 1 CONSTRAINT async_tenant_weight_check CHECK (
        typeof(weight) = 'integer' AND weight BETWEEN 1 AND 2147483647),
    updated_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    updated_by  TEXT    NOT NULL DEFAULT ''
);

-- What operators changed, in the transaction of the change.
CREATE TABLE async_audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    actor    TEXT    NOT NULL,
    action   TEXT    NOT NULL,
    target   TEXT    NOT NULL,
    detail   TEXT    NOT NULL DEFAULT '{}',
    affected INTEGER NOT NULL DEFAULT 0
);

-- A tenant's queued and running tasks, in claim order: counted by the quota checks (up to
-- the limit), and scanned by the claim of a tenant with max_running.
CREATE INDEX async_task_tenant_idx ON async_task (tenant, state, priority, run_at, id)
    WHERE tenant IS NOT NULL AND state IN ('pending', 'blocked', 'running');

-- max_queued. (The count repeats the index's `state IN (…)`: SQLite uses a partial index only
-- when the query has its predicate's terms.) An INSERT holds SQLite's write lock, so producers are serialised and the count
-- is exact. The count stops at the limit. A row that repeats an existing (keyword, biz_id) is
-- let through, to be skipped by the insert's ON CONFLICT. The message is a constant (an
-- expression there needs SQLite 3.48, and other languages' producers may link an older one
-- that would then refuse to open the file); the API names the tenant and its limit.
CREATE TRIGGER async_task_tenant_quota BEFORE INSERT ON async_task
WHEN NEW.tenant IS NOT NULL AND NEW.state IN ('pending', 'blocked')
BEGIN
    SELECT RAISE(ABORT, 'async_task: tenant over its max_queued')
     WHERE (SELECT count(*) FROM (
               SELECT 1 FROM async_task q
                WHERE q.tenant = NEW.tenant AND q.state IN ('pending', 'blocked')
                  AND q.state IN ('pending', 'blocked', 'running')
                LIMIT coalesce((SELECT max_queued FROM async_tenant
                                 WHERE tenant = NEW.tenant), 0)))
           >= (SELECT max_queued FROM async_tenant WHERE tenant = NEW.tenant)
       AND NOT EXISTS (SELECT 1 FROM async_task d
                        WHERE d.keyword = NEW.keyword AND d.biz_id = NEW.biz_id);
END;
