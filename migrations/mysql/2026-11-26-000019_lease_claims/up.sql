-- Lock claims on MySQL (docs/guide/src/claims.md): a row per task in `async_lease`, committed
-- by the claim before the chunk's handlers run and deleted by the chunk's own completion, in
-- the handlers' transaction; the task row is written once, by that completion. A lease left
-- behind names a chunk that never finished (its node died, froze or was cut off, or it ran
-- past its deadline): rescue charges its task a failure, as it charges a stamped claim's.
--
-- InnoDB, not MEMORY: the lease must come back when the chunk's transaction rolls back (the
-- chunk's tasks are then claimed again one by one), and a MEMORY table is not transactional.
-- It has no secondary index: a lease is found by its task; rescue reads the whole table (it
-- holds the chunks in flight only).
CREATE TABLE IF NOT EXISTS async_lease (
    -- The task leased (at most one lease per task).
    task_id     BIGINT      NOT NULL PRIMARY KEY,
    -- The node that took it.
    node_id     BIGINT      NOT NULL,
    -- The task's claim_token when leased: the completion requires it.
    token       BIGINT      NOT NULL,
    -- The run of the chunk's transaction (PostgreSQL finds the chunk's session by it; kept
    -- here so that a lease reads the same on both).
    chunk       INT         NOT NULL,
    deadline_at DATETIME(3) NOT NULL
) ENGINE = InnoDB;
