CREATE OR REPLACE FUNCTION async_task_cancel_descendants(root bigint, why text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('outbox.cascading', 'on', true);
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
    PERFORM set_config('outbox.cascading', '', true);
END
$$;
