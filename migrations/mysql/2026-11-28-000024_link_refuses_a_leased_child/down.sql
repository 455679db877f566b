-- The link as 000001 made it: a leased child is taken as a pending one.
DROP TRIGGER IF EXISTS async_task_parent_link;

CREATE TRIGGER async_task_parent_link AFTER INSERT ON async_task_parent FOR EACH ROW
BEGIN
    DECLARE parent_state VARCHAR(16) DEFAULT NULL;
    DECLARE child_state VARCHAR(16) DEFAULT NULL;
    IF NOT (@outbox_link_recorded <=> NEW.child_id) THEN
        -- Locked in the order producers link (ascending parent ids), so that a parent
        -- completing now waits for this transaction and then sees the link.
        SELECT state INTO parent_state FROM async_task WHERE id = NEW.parent_id FOR UPDATE;
        IF parent_state IS NULL THEN
            SIGNAL SQLSTATE '23000'
                SET MESSAGE_TEXT = 'async_task_parent: the parent task does not exist';
        END IF;
        SELECT state INTO child_state FROM async_task WHERE id = NEW.child_id FOR UPDATE;
        IF child_state IS NULL OR child_state NOT IN ('pending', 'blocked', 'cancelled') THEN
            SIGNAL SQLSTATE '23000'
                SET MESSAGE_TEXT = 'async_task_parent: the child task does not exist or has started (a parent is added before its child starts)';
        END IF;
        UPDATE async_task SET has_children = TRUE WHERE id = NEW.parent_id AND NOT has_children;
        IF parent_state IN ('dead', 'cancelled') THEN
            UPDATE async_task SET state = 'cancelled', finished_at = UTC_TIMESTAMP(3),
                   updated_at = UTC_TIMESTAMP(3),
                   parent_id = COALESCE(parent_id, NEW.parent_id),
                   last_error = CONCAT('parent task ', NEW.parent_id, ' is ', parent_state)
             WHERE state IN ('pending', 'blocked') AND id IN (
                WITH RECURSIVE d (id) AS (
                    SELECT NEW.child_id
                    UNION
                    SELECT l.child_id FROM async_task_parent l JOIN d ON l.parent_id = d.id)
                SELECT id FROM d);
        ELSEIF parent_state <> 'done' THEN
            UPDATE async_task SET state = 'blocked', blocked_by = blocked_by + 1,
                   parent_id = COALESCE(parent_id, NEW.parent_id)
             WHERE id = NEW.child_id AND state IN ('pending', 'blocked');
        END IF;
        UPDATE async_task SET parent_id = NEW.parent_id
         WHERE id = NEW.child_id AND parent_id IS NULL;
    END IF;
END;
