-- Parent → child chains (README, "Chains"). A task may wait for one or more parents: it is
-- `blocked` until every parent is `done`, and is cancelled, with its own descendants, when a
-- parent ends `dead` or `cancelled`. Everything happens in triggers, in the transaction of
-- the change that causes it, so a producer's plain SQL (from any language) gets the same
-- behaviour as the Rust API:
--
--   a link row (child_id, parent_id)  the child is blocked (one more parent to wait for), or
--                                     cancelled at once if the parent is dead or cancelled,
--                                     or left as it is if the parent is done already;
--   a parent becomes done             each blocked child waits for one parent fewer, and is
--                                     pending once it waits for none;
--   a parent becomes dead/cancelled   its blocked and pending descendants are cancelled.
--
-- A child's parents must exist when it is linked to them, and have smaller ids
-- (`parent_id < child_id`): a parent is enqueued before its child, so no chain can ever
-- loop back on itself.
--
-- Tasks without parents or children pay nothing at claim and completion but the WHEN
-- clause of one row trigger (`has_children` is false). The new columns have constant
-- defaults: adding them rewrites nothing.
ALTER TABLE async_task
    -- How many of the task's parents are not done yet (blocked while above 0).
    ADD COLUMN blocked_by   INTEGER NOT NULL DEFAULT 0,
    -- Whether a child was ever linked to the task.
    ADD COLUMN has_children BOOLEAN NOT NULL DEFAULT false;

CREATE TABLE async_task_parent (
    child_id  BIGINT NOT NULL,
    parent_id BIGINT NOT NULL,
    PRIMARY KEY (child_id, parent_id),
    CONSTRAINT async_task_parent_order_check CHECK (parent_id < child_id)
);
-- A parent's children, looked up when the parent finishes.
CREATE INDEX async_task_parent_parent_idx ON async_task_parent (parent_id);

-- Cancels the blocked and pending descendants of task `root` (not `root` itself), saying
-- why, in one statement however deep the tree, locking them in id order (as the release
-- does). The descendants' own state changes fire `async_task_children_settle` again, one
-- level deeper: the transaction-local setting `outbox.cascading` tells it that the whole
-- tree is being done here.
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

-- A link: lock the parent, then settle the child by the parent's state. The parent is
-- locked (a completion of it waits for this transaction, and so sees the link) and written
-- (`has_children`, which prune and the triggers below look at): a completion in a
-- REPEATABLE READ transaction whose snapshot predates the link then fails to serialise
-- instead of missing the child. Links
-- are inserted in parent id order by the API (README: so should a producer's SQL), so two
-- producers linking to the same parents wait for each other instead of deadlocking.
-- A child already cancelled (by an earlier parent of the same enqueue that is dead) keeps
-- the link and stays cancelled; a child that has started cannot be given a parent.
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

CREATE TRIGGER async_task_parent_link AFTER INSERT ON async_task_parent
    FOR EACH ROW EXECUTE FUNCTION async_task_parent_link();

-- A producer's shorthand for one parent: `INSERT INTO async_task (…, parent_id)` links it.
CREATE OR REPLACE FUNCTION async_task_parent_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO async_task_parent (child_id, parent_id) VALUES (NEW.id, NEW.parent_id)
        ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER async_task_parent_insert AFTER INSERT ON async_task
    FOR EACH ROW WHEN (NEW.parent_id IS NOT NULL) EXECUTE FUNCTION async_task_parent_insert();

-- A parent finished: release its children (those it was the last unfinished parent of
-- become pending, and idle workers are notified at commit), or cancel its descendants.
CREATE OR REPLACE FUNCTION async_task_children_settle() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    IF NEW.state = 'done' THEN
        -- Children in id order first: two parents completing at once that share children
        -- (fan-in) then lock them in one order, instead of deadlocking.
        PERFORM 1 FROM async_task c
          WHERE c.id IN (SELECT child_id FROM async_task_parent WHERE parent_id = NEW.id)
            AND c.state = 'blocked'
          ORDER BY c.id FOR NO KEY UPDATE;
        WITH released AS (
            UPDATE async_task c SET blocked_by = c.blocked_by - 1,
                   state = CASE WHEN c.blocked_by <= 1 THEN 'pending' ELSE 'blocked' END,
                   updated_at = now()
              FROM async_task_parent l
             WHERE l.parent_id = NEW.id AND c.id = l.child_id AND c.state = 'blocked'
            RETURNING c.keyword, c.state, c.run_at)
        SELECT count(pg_notify('outbox_task', k)) INTO n FROM (
            SELECT DISTINCT keyword AS k FROM released
             WHERE state = 'pending' AND run_at <= now()) due;
    ELSIF current_setting('outbox.cascading', true) IS DISTINCT FROM 'on' THEN
        PERFORM async_task_cancel_descendants(NEW.id,
            format('parent task %s is %s', NEW.id, NEW.state));
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER async_task_children_settle AFTER UPDATE OF state ON async_task
    FOR EACH ROW WHEN (NEW.has_children AND NEW.state IN ('done', 'dead', 'cancelled')
                       AND OLD.state <> NEW.state)
    EXECUTE FUNCTION async_task_children_settle();

-- A task's links go with it (prune): every child has `parent_id` set to its first parent.
-- A done parent's links go with it too (its children need nothing more of it). A dead or
-- cancelled parent's stay: prune keeps a parent while a child of it is unfinished, and a
-- child whose dead or cancelled parent was pruned cannot be retried (the outcome it waited
-- for is gone).
CREATE OR REPLACE FUNCTION async_task_parent_forget() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM async_task_parent WHERE child_id = OLD.id;
    IF OLD.has_children AND OLD.state = 'done' THEN
        DELETE FROM async_task_parent WHERE parent_id = OLD.id;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER async_task_parent_forget AFTER DELETE ON async_task
    FOR EACH ROW WHEN (OLD.parent_id IS NOT NULL OR OLD.has_children)
    EXECUTE FUNCTION async_task_parent_forget();
