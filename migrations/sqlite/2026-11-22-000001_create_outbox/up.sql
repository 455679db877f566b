-- Times are TEXT 'YYYY-MM-DD HH:MM:SS.SSS' in UTC, always written by SQLite's own clock
-- (strftime('%Y-%m-%d %H:%M:%f', 'now')), so they compare correctly as text.
CREATE TABLE async_node (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    name         TEXT NOT NULL,                       -- host:pid
    started_at   TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    heartbeat_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    state        TEXT NOT NULL DEFAULT 'alive' CHECK (state IN ('alive', 'gone'))
);

CREATE TABLE async_task (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    keyword      TEXT    NOT NULL CHECK (
        length(keyword) BETWEEN 1 AND 64 AND keyword NOT GLOB '*[^a-z0-9._:-]*'),
    biz_id       TEXT    NOT NULL CHECK (length(CAST(biz_id AS BLOB)) BETWEEN 1 AND 128),
    biz_data     TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(biz_data)),
    tenant       TEXT,
    state        TEXT    NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'running', 'done', 'dead', 'cancelled', 'blocked')),
    failures     INTEGER NOT NULL DEFAULT 0 CHECK (failures >= 0),
    max_attempts INTEGER CHECK (max_attempts IS NULL OR max_attempts >= 1),
    priority     INTEGER NOT NULL DEFAULT 0,
    run_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    owner        INTEGER,
    claim_token  INTEGER NOT NULL DEFAULT 0,
    parent_id    INTEGER,
    last_error   TEXT,
    created_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    updated_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    claimed_at   TEXT,
    deadline_at  TEXT,
    finished_at  TEXT,
    UNIQUE (keyword, biz_id)
);

CREATE INDEX async_task_claim_idx ON async_task (priority, run_at, id) WHERE state = 'pending';
CREATE INDEX async_task_owner_idx ON async_task (owner) WHERE state = 'running';
-- No index on finished_at (PostgreSQL has one): on SQLite every completion would write it
-- (its cost is in docs/performance.md). `outbox prune` walks the rowid instead, oldest tasks
-- first, which finds old finished tasks at the start of the table.
