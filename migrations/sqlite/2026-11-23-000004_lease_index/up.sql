-- An index of running tasks that a completion leaves alone.
--
-- An index whose predicate is `state = 'running'` loses an entry at every completion, and on
-- SQLite every commit writes each page it changed to the WAL: a completion would write the
-- index's page as well as the row's (the cost is in docs/performance.md).
--
-- This index holds the tasks that have a lease (a deadline): `deadline_at` is set by the
-- claim, and no longer left in place once a task stops running. Tasks that go back to
-- pending (a retry, a release, a rescue) or die clear it in the same statement. A completion
-- does not: the node's next claim clears the deadlines of its own finished tasks, in the
-- claim's transaction (one statement for the whole page, a few pages written), and each
-- rescue pass clears any that are left (a node that has exited). So every running task is in
-- the index, and so are at most a page or so of finished tasks per node; rescue and prune
-- read running tasks through it with `deadline_at IS NOT NULL AND state = 'running'`.
--
-- First the deadlines of tasks that are not running are cleared, so that the index starts
-- with the running tasks only: this rewrites every finished task's row once, holding the
-- write lock (time per million rows: docs/performance.md).
UPDATE async_task SET deadline_at = NULL WHERE state <> 'running' AND deadline_at IS NOT NULL;
-- A task claimed with a timeout that reached past the year 9999 has a NULL deadline (SQLite's
-- date functions give NULL there; workers refuse such timeouts): it gets the latest
-- deadline instead, so that it is in the index and is rescued if its node dies.
UPDATE async_task SET deadline_at = '9999-12-31 23:59:59.999' WHERE state = 'running' AND deadline_at IS NULL;
DROP INDEX async_task_owner_idx;
CREATE INDEX async_task_lease_idx ON async_task (owner) WHERE deadline_at IS NOT NULL;
