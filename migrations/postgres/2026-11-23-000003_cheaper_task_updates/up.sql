-- Two changes that make every claim and completion cheaper for the server (the figures are
-- in docs/performance.md).
--
-- 1. The keyword check, written so that the regular expression is cheap. PostgreSQL checks
--    every CHECK constraint of a row on every UPDATE of it, whichever columns change, so
--    each task pays for it three times (insert, claim, completion). `{1,64}` made the regex
--    engine expand 64 copies of the character class, a visible share of the server's CPU in
--    a batched drain. `+` with a separate length bound accepts exactly the same keywords at
--    a fraction of the cost. (A domain type would not be checked on updates at all, but
--    changing the column's type rewrites the table.)
--
--    The migration runs in one transaction and holds an exclusive lock on async_task while
--    it checks every row against the new constraint and builds the index below (both read
--    the whole table): readers and writers of the table wait meanwhile (time per million
--    rows: docs/performance.md).
ALTER TABLE async_task
    DROP CONSTRAINT async_task_keyword_check,
    ADD CONSTRAINT async_task_keyword_check
        CHECK (keyword ~ '^[a-z0-9._:-]+$' AND octet_length(keyword) <= 64);

-- 2. The running-task index keyed by (owner, id) instead of (owner): a batched completion
--    marks a chunk's tasks done by `owner = $1 AND id = ANY($2)`, which this index answers
--    with one probe per task. With the owner alone the planner read every task the node
--    was running (the whole claim, 9 chunks' worth) to complete one chunk. Rescue and
--    release, which look tasks up by owner, use it as before. The index holds running
--    tasks only, so it stays small, but building it reads the table (above).
DROP INDEX async_task_owner_idx;
CREATE INDEX async_task_owner_idx ON async_task (owner, id) WHERE state = 'running';
