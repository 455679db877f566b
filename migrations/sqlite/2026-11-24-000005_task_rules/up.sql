-- The schema refuses what the Rust API refuses, so that a producer's plain INSERT, from any
-- language, is held to the same rules (README, "Enqueue from another language"):
--
--   keyword    1-64 characters of [a-z0-9._:-]
--   biz_id     1-128 bytes, no NUL
--   biz_data   valid JSON, at most 65536 bytes, no NUL byte and no \u0000 escape
--              (PostgreSQL's jsonb refuses it; the same payload must work on both backends)
--   tenant     NULL, or 1-128 bytes without NUL
--   priority   an integer from -32768 to 32767 (the API's i16)
--   max_attempts  NULL, or an integer from 1 to 2147483647
--   run_at, created_at  text of the shape 'YYYY-MM-DD HH:MM:SS.SSS' (UTC), the one that
--              compares correctly as text with the engine's times: an ISO 'T' time or one
--              without milliseconds would sort wrongly and is refused (the shape is checked,
--              its digits are not)
--   run_at     at most 3650 days after created_at (the insert's time, by default) when no
--              failure has been counted: what a producer may delay a task by
--
-- SQLite's columns take any type whatever their declaration, so each integer rule also names
-- the type (`typeof`): after the column's affinity, '12' is the integer 12, but 'abc' and 2.5
-- stay text and real and are refused. (A STRICT table would do the same, but a file with one
-- can no longer be opened by SQLite before 3.37, which other languages' producers may still
-- link.) The payload must be text (a BLOB could pass for JSONB); the other text columns'
-- rules are checked on the value's text.
--
-- SQLite cannot add a constraint to a table, so the table is rebuilt: created under a new
-- name, the rows copied, the old table dropped and the new one renamed, inside the
-- migration's transaction (it holds the write lock while it copies every row). A row that
-- breaks a rule fails the migration, which then changes nothing: such a row can only come
-- from a plain INSERT, never from the API. The error names the constraint; correct or delete
-- the row and migrate again.
--
-- SQLite checks a CHECK constraint on UPDATE only when the update sets a column it names:
-- claims and completions set none of these but `state`, so they pay nothing new.
CREATE TABLE async_task_new (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    keyword      TEXT    NOT NULL CONSTRAINT async_task_keyword_check CHECK (
        length(keyword) BETWEEN 1 AND 64
        AND keyword NOT GLOB '*[^a-z0-9._:-]*' AND instr(CAST(keyword AS BLOB), x'00') = 0),
    biz_id       TEXT    NOT NULL CONSTRAINT async_task_biz_id_check CHECK (
        length(CAST(biz_id AS BLOB)) BETWEEN 1 AND 128
        AND instr(CAST(biz_id AS BLOB), x'00') = 0),
    biz_data     TEXT    NOT NULL DEFAULT '{}' CONSTRAINT async_task_biz_data_check CHECK (
        typeof(biz_data) = 'text' AND length(CAST(biz_data AS BLOB)) <= 65536
        AND instr(CAST(biz_data AS BLOB), x'00') = 0 AND json_valid(biz_data)
        -- \u0000 as an escape: preceded by an odd run of backslashes, so one is left once
        -- every escaped backslash pair is removed (looked for only in a payload whose text
        -- has \u0000 at all).
        AND (instr(biz_data, '\u0000') = 0 OR instr(replace(biz_data, '\\', ''), '\u0000') = 0)),
    tenant       TEXT    CONSTRAINT async_task_tenant_check CHECK (tenant IS NULL OR (
        length(CAST(tenant AS BLOB)) BETWEEN 1 AND 128
        AND instr(CAST(tenant AS BLOB), x'00') = 0)),
    state        TEXT    NOT NULL DEFAULT 'pending' CONSTRAINT async_task_state_check
        CHECK (state IN ('pending', 'running', 'done', 'dead', 'cancelled', 'blocked')),
    failures     INTEGER NOT NULL DEFAULT 0 CONSTRAINT async_task_failures_check
        CHECK (typeof(failures) = 'integer' AND failures >= 0),
    max_attempts INTEGER CONSTRAINT async_task_max_attempts_check CHECK (max_attempts IS NULL OR (
        typeof(max_attempts) = 'integer' AND max_attempts BETWEEN 1 AND 2147483647)),
    priority     INTEGER NOT NULL DEFAULT 0 CONSTRAINT async_task_priority_check
        CHECK (typeof(priority) = 'integer' AND priority BETWEEN -32768 AND 32767),
    run_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
        CONSTRAINT async_task_run_at_check CHECK (run_at GLOB '????-??-?? ??:??:??.???'),
    owner        INTEGER,
    claim_token  INTEGER NOT NULL DEFAULT 0,
    parent_id    INTEGER,
    last_error   TEXT,
    created_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
        CONSTRAINT async_task_created_at_check CHECK (created_at GLOB '????-??-?? ??:??:??.???'),
    updated_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    claimed_at   TEXT,
    deadline_at  TEXT,
    finished_at  TEXT,
    -- What a producer may delay a task by. Retries and rescues (which count a failure) set
    -- their own run_at; the cheap comparisons come first, so that a task due at once pays
    -- no date arithmetic.
    CONSTRAINT async_task_run_at_ahead_check CHECK (
        run_at <= created_at OR failures > 0
        OR run_at <= strftime('%Y-%m-%d %H:%M:%f', created_at, '+3650 days')),
    UNIQUE (keyword, biz_id)
);

INSERT INTO async_task_new
    (id, keyword, biz_id, biz_data, tenant, state, failures, max_attempts, priority, run_at,
     owner, claim_token, parent_id, last_error, created_at, updated_at, claimed_at,
     deadline_at, finished_at)
SELECT id, keyword, biz_id, biz_data, tenant, state, failures, max_attempts, priority, run_at,
       owner, claim_token, parent_id, last_error, created_at, updated_at, claimed_at,
       deadline_at, finished_at
FROM async_task;

-- AUTOINCREMENT never hands out an id twice, even one of a pruned task: the new table takes
-- over the old one's counter (which is at least its largest id).
DELETE FROM sqlite_sequence WHERE name = 'async_task_new';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'async_task_new', seq FROM sqlite_sequence WHERE name = 'async_task';

DROP TABLE async_task;
ALTER TABLE async_task_new RENAME TO async_task;

CREATE INDEX async_task_claim_idx ON async_task (priority, run_at, id) WHERE state = 'pending';
CREATE INDEX async_task_lease_idx ON async_task (owner) WHERE deadline_at IS NOT NULL;

