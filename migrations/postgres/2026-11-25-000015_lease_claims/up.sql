-- Lock claims take a lease (README, "Claim styles"): a row per task in `async_lease`,
-- committed before the chunk's handlers run and deleted by the chunk's own completion, in
-- the handlers' transaction. The task row itself is not locked while the handlers run. A
-- lease left behind names a chunk that never finished: its node died, froze or was cut off,
-- or it ran past its deadline; rescue charges its tasks a failure (as it charges a stamped
-- claim's), and a cancel never waits for a chunk.
--
-- UNLOGGED: a lease is worth nothing after a server crash or a failover (every chunk's
-- transaction rolled back with it, and the tasks are pending), so it writes no WAL and its
-- commit waits for no flush.
CREATE UNLOGGED TABLE async_lease (
    -- The task leased (at most one lease per task: the claim's ON CONFLICT).
    task_id bigint PRIMARY KEY,
    -- The node that took it.
    node_id bigint NOT NULL,
    -- The task's claim_token when leased: every write under the lease requires it.
    token bigint NOT NULL,
    -- The run of the chunk's transaction, which holds the node's and the run's advisory
    -- locks (class 'obn'1 and 'obr'1) while it lasts: how rescue finds its session.
    chunk integer NOT NULL,
    deadline_at timestamptz NOT NULL
);
CREATE INDEX async_lease_node_idx ON async_lease (node_id);
ALTER TABLE async_lease SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- How many processes died while they held the task (each death charged by rescue): it may be
-- what kills them. From the second, claims of pages and chunks leave it to a claim of its own,
-- one such suspect at a time per worker, so that the next death is charged to it alone
-- (README, "Failure behaviour").
ALTER TABLE async_task ADD COLUMN suspect integer NOT NULL DEFAULT 0;
CREATE INDEX async_task_suspect_idx ON async_task (priority, run_at, id)
    WHERE state = 'pending' AND suspect >= 2;
