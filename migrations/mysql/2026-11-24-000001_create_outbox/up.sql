-- The whole schema on MySQL 8 / MariaDB 10.6+, equal in what it stores and refuses to the
-- PostgreSQL and SQLite trees' twelve migrations (this tree starts where they end).
--
-- Statements run in the session the engine sets up (`outbox migrate`): standard SQL strings
-- (NO_BACKSLASH_ESCAPES: '\u0000' below is six characters), `||` concatenation.
--
-- Times are DATETIME(3) in UTC: every column default and every statement of the engine uses
-- UTC_TIMESTAMP(3), the server's clock, whatever a session's time_zone. Text is utf8mb4 with
-- the binary collation, so that keys compare byte for byte as on the other backends. Lengths
-- in bytes are checked with OCTET_LENGTH (a VARCHAR's length counts characters; the columns
-- are wider than the rule, so that a value too long is refused by the rule's constraint,
-- named, rather than by the column).
--
-- MySQL has no partial indexes: the claim index covers every state, with the tenant and state
-- first, so that `tenant IS NULL AND state = 'pending'` (and one tenant's tasks) is one range
-- read in claim order.
CREATE TABLE IF NOT EXISTS async_node (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name         VARCHAR(255) NOT NULL,                   -- host:pid
    started_at   DATETIME(3)  NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
    heartbeat_at DATETIME(3)  NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
    state        VARCHAR(8)   NOT NULL DEFAULT 'alive',
    -- What the node publishes at each heartbeat: its threads, and its domains'
    -- configuration and slot use (JSON).
    domains      LONGTEXT,
    -- Claim strategies: the node's strategy, weight, and tasks held at its last beat.
    strategy     VARCHAR(16)  NOT NULL DEFAULT 'default',
    weight       INT          NOT NULL DEFAULT 1,
    running      BIGINT       NOT NULL DEFAULT 0,
    CONSTRAINT async_node_state_check CHECK (state IN ('alive', 'gone')),
    CONSTRAINT async_node_strategy_check
        CHECK (strategy IN ('default', 'id_hash', 'least_count', 'weight')),
    CONSTRAINT async_node_weight_check CHECK (weight BETWEEN 1 AND 1000),
    CONSTRAINT async_node_running_check CHECK (running >= 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS async_task (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    keyword      VARCHAR(64)  NOT NULL,
    biz_id       VARCHAR(255) NOT NULL,                   -- 1-128 bytes (the CHECK)
    biz_data     LONGTEXT     NOT NULL DEFAULT '{}',
    tenant       VARCHAR(255),                            -- 1-128 bytes (the CHECK)
    state        VARCHAR(16)  NOT NULL DEFAULT 'pending',
    failures     INT          NOT NULL DEFAULT 0,
    max_attempts INT,
    priority     INT          NOT NULL DEFAULT 0,
    run_at       DATETIME(3)  NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
    owner        BIGINT,
    claim_token  BIGINT       NOT NULL DEFAULT 0,
    -- The first parent (a producer's shorthand for one: the trigger below links it).
    parent_id    BIGINT,
    last_error   LONGTEXT,
    created_at   DATETIME(3)  NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
    updated_at   DATETIME(3)  NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
    claimed_at   DATETIME(3),
    deadline_at  DATETIME(3),
    finished_at  DATETIME(3),
    -- Parents not yet done (README, "Chains"), and whether the task is anyone's parent.
    blocked_by   INT          NOT NULL DEFAULT 0,
    has_children BOOLEAN      NOT NULL DEFAULT FALSE,
    UNIQUE KEY async_task_key (keyword, biz_id),
    -- The claim, per tenant (tenant IS NULL for tasks without one) and state, in claim order;
    -- also what the tenant quotas count.
    KEY async_task_claim_idx (tenant, state, priority, run_at, id),
    -- The tenants with pending tasks, in tenant order: the fair claim's ring walks them
    -- (one index read per step, done tasks never read).
    KEY async_task_pending_tenant_idx (state, tenant),
    -- The page of a claim read back by owner and token; rescue's running tasks per owner.
    KEY async_task_owner_idx (owner, claim_token),
    -- Rescue of expired leases, and prune of finished tasks by age.
    KEY async_task_deadline_idx (state, deadline_at),
    KEY async_task_finished_idx (finished_at),
    -- The rules of the Rust API, so that a producer's plain INSERT is held to them (README,
    -- "Enqueue from another language").
    CONSTRAINT async_task_keyword_check CHECK (
        keyword REGEXP BINARY '^[a-z0-9._:-]{1,64}\z'),
    CONSTRAINT async_task_biz_id_check CHECK (
        OCTET_LENGTH(biz_id) BETWEEN 1 AND 128 AND LOCATE(CHAR(0), biz_id) = 0),
    CONSTRAINT async_task_biz_data_check CHECK (
        OCTET_LENGTH(biz_data) <= 65536 AND JSON_VALID(biz_data)
        AND LOCATE(CHAR(0), biz_data) = 0
        -- \u0000 as an escape: preceded by an odd run of backslashes, so one is left once
        -- every escaped backslash pair is removed (PostgreSQL's jsonb refuses it; the same
        -- payload must work on every backend).
        AND (LOCATE('\u0000', biz_data) = 0
             OR LOCATE('\u0000', REPLACE(biz_data, '\\', '')) = 0)),
    CONSTRAINT async_task_tenant_check CHECK (tenant IS NULL OR (
        OCTET_LENGTH(tenant) BETWEEN 1 AND 128 AND LOCATE(CHAR(0), tenant) = 0)),
    CONSTRAINT async_task_state_check
        CHECK (state IN ('pending', 'running', 'done', 'dead', 'cancelled', 'blocked')),
    CONSTRAINT async_task_failures_check CHECK (failures >= 0),
    CONSTRAINT async_task_max_attempts_check CHECK (max_attempts IS NULL OR max_attempts >= 1),
    CONSTRAINT async_task_priority_check CHECK (priority BETWEEN -32768 AND 32767),
    -- What a producer may delay a task by; retries and rescues (which count a failure) set
    -- their own run_at.
    CONSTRAINT async_task_run_at_ahead_check CHECK (
        run_at <= created_at OR failures > 0
        OR run_at <= created_at + INTERVAL 3650 DAY)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Parent → child links (README, "Chains"). A parent is older than its child, so no chain
-- loops back.
CREATE TABLE IF NOT EXISTS async_task_parent (
    child_id  BIGINT NOT NULL,
    parent_id BIGINT NOT NULL,
    PRIMARY KEY (child_id, parent_id),
    KEY async_task_parent_parent_idx (parent_id),
    CONSTRAINT async_task_parent_order_check CHECK (parent_id < child_id)
) ENGINE = InnoDB;

-- Tenant quotas (README, "Tenants"). A tenant without a row is unlimited and weighs 1.
CREATE TABLE IF NOT EXISTS async_tenant (
    tenant      VARCHAR(255) NOT NULL PRIMARY KEY,
    max_queued  INT,
    max_running INT,
    weight      INT          NOT NULL DEFAULT 1,
    updated_at  DATETIME(3)  NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
    updated_by  VARCHAR(255) NOT NULL DEFAULT '',
    -- Bumped by each enqueue checked against max_queued from a current snapshot (the
    -- trigger async_task_before_insert below).
    enqueue_seq BIGINT       NOT NULL DEFAULT 0,
    CONSTRAINT async_tenant_tenant_check CHECK (
        OCTET_LENGTH(tenant) BETWEEN 1 AND 128 AND LOCATE(CHAR(0), tenant) = 0),
    CONSTRAINT async_tenant_max_queued_check CHECK (max_queued IS NULL OR max_queued >= 0),
    CONSTRAINT async_tenant_max_running_check CHECK (max_running IS NULL OR max_running >= 0),
    CONSTRAINT async_tenant_weight_check CHECK (weight >= 1)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Bumped by each enqueue checked against a tenant's max_queued by a transaction whose
-- snapshot was not current (async_task_before_insert below). A row apart from the tenant's:
-- a transaction reads the rows it wrote as it wrote them, so it would no longer see, in a row
-- it had bumped, that its snapshot is old.
CREATE TABLE IF NOT EXISTS async_tenant_late_enqueue (
    tenant      VARCHAR(255) NOT NULL PRIMARY KEY,
    enqueue_seq BIGINT       NOT NULL DEFAULT 0
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- What operators changed, in the transaction of the change.
CREATE TABLE IF NOT EXISTS async_audit (
    id       BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at       DATETIME(3)  NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
    actor    VARCHAR(255) NOT NULL,
    action   VARCHAR(64)  NOT NULL,
    target   LONGTEXT     NOT NULL,
    detail   LONGTEXT     NOT NULL DEFAULT '{}',
    affected BIGINT       NOT NULL DEFAULT 0,
    CONSTRAINT async_audit_detail_check CHECK (JSON_VALID(detail))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Task domains' run-time control (README, "Domains").
CREATE TABLE IF NOT EXISTS async_domain (
    name       VARCHAR(64)  NOT NULL PRIMARY KEY,
    keywords   LONGTEXT,                               -- a JSON array of keywords
    mode       VARCHAR(8),
    threads    INT,
    queue      INT,
    timeout_ms BIGINT,
    paused     BOOLEAN      NOT NULL DEFAULT FALSE,
    released   BOOLEAN      NOT NULL DEFAULT FALSE,
    version    BIGINT       NOT NULL DEFAULT 1,
    updated_at DATETIME(3)  NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
    updated_by VARCHAR(255) NOT NULL DEFAULT '',
    CONSTRAINT async_domain_name_check CHECK (name REGEXP BINARY '^[a-z0-9._:-]{1,64}\z'),
    CONSTRAINT async_domain_mode_check CHECK (mode IS NULL OR mode IN ('max', 'reserved')),
    CONSTRAINT async_domain_threads_check CHECK (threads IS NULL OR threads >= 0),
    CONSTRAINT async_domain_queue_check CHECK (queue IS NULL OR queue >= 0),
    CONSTRAINT async_domain_timeout_check CHECK (timeout_ms IS NULL OR timeout_ms > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Keywords paused on their own (`outbox pause KEYWORD`).
CREATE TABLE IF NOT EXISTS async_pause (
    keyword   VARCHAR(64)  NOT NULL PRIMARY KEY,
    paused_at DATETIME(3)  NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
    paused_by VARCHAR(255) NOT NULL DEFAULT ''
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Cron schedules (README, "Cron schedules"): one row per scheduled keyword.
CREATE TABLE IF NOT EXISTS async_schedule (
    keyword    VARCHAR(64)  NOT NULL PRIMARY KEY,
    expression VARCHAR(256) NOT NULL,
    since      DATETIME(3)  NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
    last_tick  DATETIME(3),
    updated_at DATETIME(3)  NOT NULL DEFAULT (UTC_TIMESTAMP(3)),
    updated_by VARCHAR(255) NOT NULL DEFAULT '',
    CONSTRAINT async_schedule_keyword_check CHECK (keyword REGEXP BINARY '^[a-z0-9._:-]{1,64}\z'),
    CONSTRAINT async_schedule_expression_check CHECK (OCTET_LENGTH(expression) BETWEEN 1 AND 256)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A producer's INSERT, checked as the API checks an enqueue:
--  * max_queued: the tenant's row is locked (FOR UPDATE) until the producer's transaction
--    ends, so producers of one tenant take turns, and the count includes every task of
--    those before. The count stops at the limit. A plain count reads the transaction's
--    snapshot: under READ COMMITTED the statement's, under REPEATABLE READ (MySQL's
--    default) the one its first read took, which may predate another producer's enqueue.
--    So each enqueue bumps a counter, and a transaction whose snapshot shows the counters as
--    the locking reads do (nothing enqueued for the tenant since it) counts plainly; any
--    other counts with a locking read, which sees the newest committed rows (and holds their
--    share locks until it ends), and bumps the counter kept apart for such late enqueues:
--    its own later enqueues still find its snapshot old, and count the same way. A row that
--    repeats an existing (keyword, biz_id) is let through, to be skipped as a duplicate by
--    the insert.
--  * parent_id, a producer's shorthand for one parent: the parent must exist; the child is
--    blocked while it is not finished, cancelled with it when it is dead or cancelled. (The
--    link row is written by the AFTER INSERT trigger. MySQL forbids a trigger to change the
--    table its statement changes, so the parent's `has_children` is not set here: the
--    engine's release on MySQL reads async_task_parent instead.)
CREATE TRIGGER async_task_before_insert BEFORE INSERT ON async_task FOR EACH ROW
BEGIN
    DECLARE lim INT DEFAULT NULL;
    DECLARE queued INT DEFAULT 0;
    -- (Named apart from every column: in a trigger's statements a local variable hides a
    -- column of its name.)
    DECLARE v_seq BIGINT DEFAULT NULL;
    DECLARE v_seq_seen BIGINT DEFAULT NULL;
    DECLARE v_late BIGINT DEFAULT NULL;
    DECLARE v_late_seen BIGINT DEFAULT NULL;
    DECLARE repeated INT DEFAULT 0;
    DECLARE parent_state VARCHAR(16) DEFAULT NULL;
    -- Left set by a shorthand insert that failed on this session (see below).
    SET @outbox_link_recorded = NULL;
    -- Set by async_task_after_insert if this row is created: a producer's upsert tells a
    -- created task from one there already by it (README, "Enqueue from another language").
    SET @outbox_created_id = NULL;
    IF NEW.tenant IS NOT NULL AND NEW.state IN ('pending', 'blocked') THEN
        SELECT max_queued, enqueue_seq INTO lim, v_seq FROM async_tenant
         WHERE tenant = NEW.tenant AND max_queued IS NOT NULL FOR UPDATE;
        IF lim IS NOT NULL THEN
            SELECT enqueue_seq INTO v_late FROM async_tenant_late_enqueue
             WHERE tenant = NEW.tenant FOR UPDATE;
            -- The same rows as this transaction's snapshot has them (plain reads).
            SELECT enqueue_seq INTO v_seq_seen FROM async_tenant WHERE tenant = NEW.tenant;
            SELECT enqueue_seq INTO v_late_seen FROM async_tenant_late_enqueue
             WHERE tenant = NEW.tenant;
            IF v_seq_seen <=> v_seq AND v_late_seen <=> v_late THEN
                SELECT count(*) INTO queued FROM (
                    SELECT 1 FROM async_task
                     WHERE tenant = NEW.tenant AND state IN ('pending', 'blocked') LIMIT lim) q;
                UPDATE async_tenant SET enqueue_seq = v_seq + 1 WHERE tenant = NEW.tenant;
            ELSE
                SELECT count(*) INTO queued FROM (
                    SELECT 1 FROM async_task
                     WHERE tenant = NEW.tenant AND state IN ('pending', 'blocked') LIMIT lim
                     LOCK IN SHARE MODE) q;
                INSERT INTO async_tenant_late_enqueue (tenant, enqueue_seq) VALUES (NEW.tenant, 1)
                    ON DUPLICATE KEY UPDATE enqueue_seq = enqueue_seq + 1;
            END IF;
            IF queued >= lim THEN
                SELECT count(*) INTO repeated FROM async_task
                 WHERE keyword = NEW.keyword AND biz_id = NEW.biz_id LOCK IN SHARE MODE;
                IF repeated = 0 THEN
                    SIGNAL SQLSTATE '23000'
                        SET MESSAGE_TEXT = 'async_task: tenant over its max_queued';
                END IF;
            END IF;
        END IF;
    END IF;
    IF NEW.parent_id IS NOT NULL THEN
        -- Locked until the producer's transaction ends: a completion of the parent waits
        -- for it, and then finds the link (the driver releases children on MySQL).
        SELECT state INTO parent_state FROM async_task WHERE id = NEW.parent_id
            LOCK IN SHARE MODE;
        IF parent_state IS NULL THEN
            SIGNAL SQLSTATE '23000'
                SET MESSAGE_TEXT = 'async_task_parent: the parent task does not exist';
        ELSEIF parent_state IN ('dead', 'cancelled') THEN
            SET NEW.state = 'cancelled', NEW.finished_at = UTC_TIMESTAMP(3),
                NEW.last_error = CONCAT('parent task ', NEW.parent_id, ' is ', parent_state);
        ELSEIF parent_state <> 'done' THEN
            SET NEW.state = 'blocked', NEW.blocked_by = 1;
        END IF;
    END IF;
END;

-- The shorthand's link row. The BEFORE INSERT trigger has done what the link means, so the
-- link trigger below is told (a session variable naming this child) to only record it: it
-- could not change async_task from inside this INSERT anyway. The variable names the child,
-- not just "on", and the link trigger checks it: a link insert that fails leaves it set for
-- the session (a pooled connection), and a later link of another child must not be skipped.
CREATE TRIGGER async_task_after_insert AFTER INSERT ON async_task FOR EACH ROW
BEGIN
    -- The row was inserted, not found as a duplicate (whose ON DUPLICATE KEY UPDATE fires
    -- the update triggers instead): the affected-row count cannot say so under the client
    -- flag CLIENT_FOUND_ROWS, which counts a duplicate left unchanged as one row too.
    SET @outbox_created_id = NEW.id;
    IF NEW.parent_id IS NOT NULL THEN
        SET @outbox_link_recorded = NEW.id;
        INSERT INTO async_task_parent (child_id, parent_id) VALUES (NEW.id, NEW.parent_id);
        SET @outbox_link_recorded = NULL;
    END IF;
END;

-- A link row inserted on its own (a child of several parents; the Rust API links this way
-- too), as the other backends' trigger of the same name: the parent must exist, the child
-- must not have started; the child is blocked while the parent is not done, and cancelled
-- with its descendants when the parent is dead or cancelled; the parent is marked as having
-- children. (A trigger on async_task_parent may change async_task: the statement that fired
-- it changes async_task_parent only.)
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

-- Operators' changes of domains and paused keywords take turns on the row 'domain' (locked
-- FOR UPDATE first in their transaction): MySQL has no lock of a transaction's length on a
-- name, and LOCK TABLES would commit the open transaction.
CREATE TABLE IF NOT EXISTS async_lock (
    name VARCHAR(64) NOT NULL PRIMARY KEY
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT IGNORE INTO async_lock (name) VALUES ('domain');
