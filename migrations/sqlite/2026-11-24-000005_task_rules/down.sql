-- Back to the table of migration 000004: the same columns, the earlier (looser) checks.
CREATE TABLE async_task_old (
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
INSERT INTO async_task_old SELECT * FROM async_task;
DELETE FROM sqlite_sequence WHERE name = 'async_task_old';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'async_task_old', seq FROM sqlite_sequence WHERE name = 'async_task';
DROP TABLE async_task;
ALTER TABLE async_task_old RENAME TO async_task;
CREATE INDEX async_task_claim_idx ON async_task (priority, run_at, id) WHERE state = 'pending';
CREATE INDEX async_task_lease_idx ON async_task (owner) WHERE deadline_at IS NOT NULL;
