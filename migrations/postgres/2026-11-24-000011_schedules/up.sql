-- Cron schedules (README, "Cron schedules"): one row per scheduled keyword, written by the
-- nodes that run the schedule. A node enqueues each tick as the task
-- (keyword, 'cron:<tick in UTC>') and records it here in the same transaction.
CREATE TABLE async_schedule (
    keyword    TEXT        PRIMARY KEY
        CONSTRAINT async_schedule_keyword_check
        CHECK (keyword ~ '^[a-z0-9._:-]+$' AND octet_length(keyword) <= 64),
    -- The expression of the node that last wrote the row (with its time zone prefix, if any).
    expression TEXT        NOT NULL
        CONSTRAINT async_schedule_expression_check
        CHECK (octet_length(expression) BETWEEN 1 AND 256),
    -- When a node first saw the schedule: no tick before it runs.
    since      TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The latest tick enqueued (NULL: none yet). It never moves back.
    last_tick  TIMESTAMPTZ,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The node (host:pid) that last wrote the row.
    updated_by TEXT        NOT NULL DEFAULT ''
);
