-- The link as 000010 made it: a leased child is taken as a pending one.
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
