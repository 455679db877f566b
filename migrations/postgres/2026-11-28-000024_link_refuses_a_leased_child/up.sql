-- A link refuses a child leased to a running chunk (lock claims), as it refuses a running
-- one: a parent added to a task whose handler may have run would block it, and it would run
-- again once the parent is done, with nothing to say why.
CREATE OR REPLACE FUNCTION async_task_parent_link() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ps text;
    cs text;
BEGIN
    SELECT state INTO ps FROM async_task WHERE id = NEW.parent_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'async_task_parent: parent task % does not exist', NEW.parent_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'async_task_parent_parent',
                  TABLE = 'async_task_parent';
    END IF;
    SELECT state INTO cs FROM async_task WHERE id = NEW.child_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'async_task_parent: child task % does not exist', NEW.child_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'async_task_parent_child',
                  TABLE = 'async_task_parent';
    END IF;
    -- Under lock claims a task leased to a chunk is pending and its row unlocked while its
    -- handler runs: it has started all the same. The lease is read after the child's row
    -- lock, which a lease claim's pick holds until the lease commits (at READ COMMITTED this
    -- statement's snapshot then holds it).
    IF cs = 'pending' AND EXISTS (SELECT 1 FROM async_lease WHERE task_id = NEW.child_id) THEN
        cs := 'leased to a running chunk';
    END IF;
    IF cs NOT IN ('pending', 'blocked', 'cancelled') THEN
        RAISE EXCEPTION 'async_task_parent: child task % is %: a parent is added before it starts',
            NEW.child_id, cs
            USING ERRCODE = 'check_violation', CONSTRAINT = 'async_task_parent_child',
                  TABLE = 'async_task_parent';
    END IF;
    UPDATE async_task SET has_children = true WHERE id = NEW.parent_id;
    IF cs = 'cancelled' THEN
        UPDATE async_task SET parent_id = NEW.parent_id
         WHERE id = NEW.child_id AND parent_id IS NULL;
    ELSIF ps = 'done' THEN
        UPDATE async_task SET parent_id = NEW.parent_id
         WHERE id = NEW.child_id AND parent_id IS NULL;
    ELSIF ps IN ('dead', 'cancelled') THEN
        UPDATE async_task SET state = 'cancelled', finished_at = now(), updated_at = now(),
               parent_id = COALESCE(parent_id, NEW.parent_id),
               last_error = format('parent task %s is %s', NEW.parent_id, ps)
         WHERE id = NEW.child_id;
        PERFORM async_task_cancel_descendants(NEW.child_id,
            format('parent task %s is %s', NEW.parent_id, ps));
    ELSE
        UPDATE async_task SET state = 'blocked', blocked_by = blocked_by + 1,
               parent_id = COALESCE(parent_id, NEW.parent_id)
         WHERE id = NEW.child_id;
    END IF;
    RETURN NULL;
END
$$;
