-- Parent → child chains (README, "Chains"): as on PostgreSQL (its migration of this version
-- explains the design), in triggers, so that a producer's plain SQL behaves as the Rust API.
-- SQLite's write lock serialises every change, so no row locks are needed; its triggers have
-- no IF, so each case is a statement of its own guarded by a condition, and RAISE takes a
-- fixed message only. Triggers do not fire themselves again (`recursive_triggers` is off),
-- so a cancellation walks the whole tree with a recursive query.
ALTER TABLE async_task ADD COLUMN blocked_by INTEGER NOT NULL DEFAULT 0;
ALTER TABLE async_task ADD COLUMN has_children INTEGER NOT NULL DEFAULT 0;

CREATE TABLE async_task_parent (
    child_id  INTEGER NOT NULL,
    parent_id INTEGER NOT NULL,
    PRIMARY KEY (child_id, parent_id),
    CONSTRAINT async_task_parent_order_check CHECK (parent_id < child_id)
) WITHOUT ROWID;
CREATE INDEX async_task_parent_parent_idx ON async_task_parent (parent_id);

CREATE TRIGGER async_task_parent_link AFTER INSERT ON async_task_parent
BEGIN
    SELECT RAISE(ABORT, 'async_task_parent: the parent task does not exist')
     WHERE NOT EXISTS (SELECT 1 FROM async_task WHERE id = NEW.parent_id);
    -- A child already cancelled (by an earlier parent of the same enqueue that is dead)
    -- keeps the link and stays cancelled.
    SELECT RAISE(ABORT, 'async_task_parent: the child task does not exist or has started (a parent is added before its child starts)')
     WHERE NOT EXISTS (SELECT 1 FROM async_task
                        WHERE id = NEW.child_id AND state IN ('pending', 'blocked', 'cancelled'));
    -- The parent is dead or cancelled: so is the child, with its descendants.
    UPDATE async_task SET state = 'cancelled',
           finished_at = strftime('%Y-%m-%d %H:%M:%f', 'now'),
           updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now'),
           parent_id = COALESCE(parent_id, NEW.parent_id),
           last_error = 'parent task ' || NEW.parent_id || ' is '
               || (SELECT state FROM async_task WHERE id = NEW.parent_id)
     WHERE (SELECT state FROM async_task WHERE id = NEW.parent_id) IN ('dead', 'cancelled')
       AND state IN ('pending', 'blocked') AND id IN (
        WITH RECURSIVE d(id) AS (
            SELECT NEW.child_id
            UNION
            SELECT l.child_id FROM async_task_parent l JOIN d ON l.parent_id = d.id)
        SELECT id FROM d);
    -- The parent is not finished: the child waits for it.
    UPDATE async_task SET state = 'blocked', blocked_by = blocked_by + 1,
           parent_id = COALESCE(parent_id, NEW.parent_id)
     WHERE id = NEW.child_id AND state IN ('pending', 'blocked')
       AND (SELECT state FROM async_task WHERE id = NEW.parent_id)
           NOT IN ('done', 'dead', 'cancelled');
    UPDATE async_task SET has_children = 1 WHERE id = NEW.parent_id AND has_children = 0;
    -- The parent is done, or the child was cancelled already: nothing to wait for.
    UPDATE async_task SET parent_id = NEW.parent_id
     WHERE id = NEW.child_id AND parent_id IS NULL;
END;

-- A producer's shorthand for one parent: `INSERT INTO async_task (…, parent_id)` links it.
-- A plain INSERT, not INSERT OR IGNORE: IGNORE would also skip a failed CHECK silently.
CREATE TRIGGER async_task_parent_insert AFTER INSERT ON async_task
WHEN NEW.parent_id IS NOT NULL
BEGIN
    INSERT INTO async_task_parent (child_id, parent_id) VALUES (NEW.id, NEW.parent_id);
END;

CREATE TRIGGER async_task_children_release AFTER UPDATE OF state ON async_task
WHEN NEW.has_children AND NEW.state = 'done' AND OLD.state <> 'done'
BEGIN
    UPDATE async_task SET blocked_by = blocked_by - 1,
           state = CASE WHEN blocked_by <= 1 THEN 'pending' ELSE 'blocked' END,
           updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
     WHERE state = 'blocked'
       AND id IN (SELECT child_id FROM async_task_parent WHERE parent_id = NEW.id);
END;

CREATE TRIGGER async_task_children_cancel AFTER UPDATE OF state ON async_task
WHEN NEW.has_children AND NEW.state IN ('dead', 'cancelled') AND OLD.state <> NEW.state
BEGIN
    UPDATE async_task SET state = 'cancelled',
           finished_at = strftime('%Y-%m-%d %H:%M:%f', 'now'),
           updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now'),
           last_error = 'parent task ' || NEW.id || ' is ' || NEW.state
     WHERE state IN ('blocked', 'pending') AND id IN (
        WITH RECURSIVE d(id) AS (
            SELECT child_id FROM async_task_parent WHERE parent_id = NEW.id
            UNION
            SELECT l.child_id FROM async_task_parent l JOIN d ON l.parent_id = d.id)
        SELECT id FROM d);
END;

-- A task's links go with it (prune): every child has `parent_id` set to its first parent.
-- A done parent's links go with it too; a dead or cancelled parent's stay (as on
-- PostgreSQL: prune keeps a parent while a child of it is unfinished, and a child whose
-- dead or cancelled parent was pruned cannot be retried).
CREATE TRIGGER async_task_parent_forget AFTER DELETE ON async_task
WHEN OLD.parent_id IS NOT NULL OR OLD.has_children
BEGIN
    DELETE FROM async_task_parent WHERE child_id = OLD.id;
    DELETE FROM async_task_parent WHERE parent_id = OLD.id AND OLD.state = 'done';
END;
