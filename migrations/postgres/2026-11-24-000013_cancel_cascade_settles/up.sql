-- The cascade of a dead or cancelled task runs until a pass finds nothing left to cancel.
-- One pass reads the tree with the statement's snapshot: a child linked under a descendant
-- while the pass waited for that descendant's lock committed after the snapshot, and was
-- left blocked under a cancelled parent. The next pass (a new snapshot, READ COMMITTED)
-- sees its link; a link that commits later finds its parent cancelled and is cancelled by
-- its own trigger.
CREATE OR REPLACE FUNCTION async_task_cancel_descendants(root bigint, why text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    PERFORM set_config('outbox.cascading', 'on', true);
    LOOP
        UPDATE async_task SET state = 'cancelled', finished_at = now(), updated_at = now(),
               last_error = why
         WHERE id IN (
            SELECT id FROM async_task WHERE state IN ('blocked', 'pending') AND id IN (
                WITH RECURSIVE d(id) AS (
                    SELECT child_id FROM async_task_parent WHERE parent_id = root
                    UNION
                    SELECT l.child_id FROM async_task_parent l JOIN d ON l.parent_id = d.id)
                SELECT id FROM d)
             ORDER BY id FOR NO KEY UPDATE)
           AND state IN ('blocked', 'pending');
        GET DIAGNOSTICS n = ROW_COUNT;
        EXIT WHEN n = 0;
    END LOOP;
    PERFORM set_config('outbox.cascading', '', true);
END
$$;
