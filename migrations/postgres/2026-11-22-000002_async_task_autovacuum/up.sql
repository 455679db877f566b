-- async_task is a queue: every task is inserted, updated at least twice (claimed, finished:
-- never a HOT update, because `state` is in the partial indexes' predicates) and finally
-- deleted by `outbox prune`, so it produces three or more dead row versions per task while
-- its live size stays put. PostgreSQL's defaults vacuum a table once 20% of it is dead
-- (autovacuum_vacuum_scale_factor = 0.2): with a week of finished tasks kept, millions of dead
-- versions would pile up first, bloating the table and, worse, the small partial claim index
-- that every claim scans. Vacuum after 1% (plus 1,000 rows, so a nearly empty table is not
-- vacuumed for every few rows), so the space freed by claims, completions and prune is
-- reused by the next inserts instead of growing the file.
--
-- A small table gains nothing: the default threshold is crossed within one
-- autovacuum_naptime (1 min) anyway, and the naptime sets the pace (scripts/prune-growth.sh).
-- It matters when the finished tasks kept outnumber a few minutes of churn: at 100 tasks/s
-- with 7 days kept (60 million rows), the default waits for 12 million dead versions (about
-- 11 hours of churn), this for 600,000 (about half an hour).
--
-- Statistics follow the same churn: the share of pending, running and done rows changes by
-- the minute, and the planner's choice between the partial indexes relies on them.
--
-- Settings of this table only (ALTER TABLE … SET takes a SHARE UPDATE EXCLUSIVE lock, which
-- does not block reads or writes). Server-wide settings (autovacuum_naptime, the number of
-- workers, cost limits) are the DBA's; `outbox prune` does not depend on any of them.
ALTER TABLE async_task SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);
