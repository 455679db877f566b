-- Cron schedules (README, "Cron schedules"): one row per scheduled keyword, written by the
-- nodes that run the schedule. A node enqueues each tick as the task
-- (keyword, 'cron:<tick in UTC>') and records it here in the same transaction. Times are
-- UTC text of the shape 'YYYY-MM-DD HH:MM:SS.SSS', as in async_task.
CREATE TABLE async_schedule (
    keyword    TEXT PRIMARY KEY NOT NULL CONSTRAINT async_schedule_keyword_check CHECK (
        typeof(keyword) = 'text' AND length(keyword) BETWEEN 1 AND 64
        AND keyword NOT GLOB '*[^a-z0-9._:-]*'),
    -- The expression of the node that last wrote the row (with its time zone prefix, if any).
    expression TEXT NOT NULL CONSTRAINT async_schedule_expression_check CHECK (
        typeof(expression) = 'text' AND length(CAST(expression AS BLOB)) BETWEEN 1 AND 256),
    -- When a node first saw the schedule: no tick before it runs.
    since      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
        CONSTRAINT async_schedule_since_check CHECK (since GLOB '????-??-?? ??:??:??.???'),
    -- The latest tick enqueued (NULL: none yet). It never moves back.
    last_tick  TEXT CONSTRAINT async_schedule_last_tick_check CHECK (
        last_tick IS NULL OR last_tick GLOB '????-??-?? ??:??:??.???'),
    updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    -- The node (host:pid) that last wrote the row.
    updated_by TEXT NOT NULL DEFAULT ''
);
