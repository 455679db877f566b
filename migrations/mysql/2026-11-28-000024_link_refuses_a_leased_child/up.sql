-- A link refuses a child leased to a running chunk (lock claims), as it refuses a running
-- one: a parent added to a task whose handler may have run would block it, and it would run
-- again once the parent is done, with nothing to say why.
DROP TRIGGER IF EXISTS async_task_parent_link;

CREATE TRIGGER async_task_parent_link AFTER INSERT ON async_task_parent FOR EACH ROW
BEGIN
    DECLARE parent_state VARCHAR(16) DEFAULT NULL;
    DECLARE child_state VARCHAR(16) DEFAULT NULL;
    DECLARE leases INT DEFAULT 0;
    IF NOT (@outbox_link_recorded <=> NEW.child_id) THEN
        -- Locked in the order producers link (ascending parent ids), so that a parent
        -- completing now waits for this transaction and then sees the link.
        SELECT state INTO parent_state FROM async_task WHERE id = NEW.parent_id FOR UPDATE;
        IF parent_state IS NULL THEN
            SIGNAL SQLSTATE '23000'
                SET MESSAGE_TEXT = 'async_task_parent: the parent task does not exist';
        END IF;
        SELECT state INTO child_state FROM async_task WHERE id = NEW.child_id FOR UPDATE;
        -- Under lock claims a task leased to a chunk is pending and its row unlocked while
        -- its handler runs: it has started all the same. Read after the child's row lock,
        -- which a lease claim's pick holds until its lease commits: at READ COMMITTED this
        -- read sees the lease. Not a locking read: at REPEATABLE READ it would lock the gap
        -- after the key in the lease table (a new child has no lease) until the producer
        -- commits, and hold up every lease claim of a task in it.
        IF child_state = 'pending' THEN
            SELECT COUNT(*) INTO leases FROM async_lease WHERE task_id = NEW.child_id;
            IF leases > 0 THEN
                SET child_state = 'leased';
            END IF;
        END IF;
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
