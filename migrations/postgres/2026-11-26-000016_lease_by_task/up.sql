-- A lease is found by its task only. The index by node made a chunk's completion, which
-- deletes its leases by `task_id = ANY(…) AND node_id = …`, read every lease of its node
-- and every dead version of them not yet vacuumed (the planner's pick while the table's
-- statistics are young): a third of the server's time in a 50,000-task drain (2.8 s of
-- statement time became 1.6 to 2.2 s, docs/notes/2026-11-26-postgres-speed.md). Rescue
-- reads the whole table by design (it holds the chunks in flight only), and no other
-- statement looks leases up by node.
DROP INDEX async_lease_node_idx;
