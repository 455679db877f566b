-- Worker processes. A node is alive while its heartbeat is fresh (database clock).
CREATE TABLE async_node (
    id           BIGSERIAL PRIMARY KEY,
    name         TEXT        NOT NULL,                -- host:pid
    started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    state        TEXT        NOT NULL DEFAULT 'alive'
        CONSTRAINT async_node_state_check CHECK (state IN ('alive', 'gone'))
);

-- One row per side-effect to run. A producer inserts it in its own business transaction.
CREATE TABLE async_task (
    id           BIGSERIAL PRIMARY KEY,
    keyword      TEXT        NOT NULL
        CONSTRAINT async_task_keyword_check CHECK (keyword ~ '^[a-z0-9._:-]{1,64}$'),
    biz_id       TEXT        NOT NULL
        CONSTRAINT async_task_biz_id_check CHECK (octet_length(biz_id) BETWEEN 1 AND 128),
    biz_data     JSONB       NOT NULL DEFAULT '{}',
    tenant       TEXT,
    state        TEXT        NOT NULL DEFAULT 'pending'
        CONSTRAINT async_task_state_check
        CHECK (state IN ('pending', 'running', 'done', 'dead', 'cancelled', 'blocked')),
    failures     INTEGER     NOT NULL DEFAULT 0 CHECK (failures >= 0),
    -- NULL: the worker's configured default.
    max_attempts INTEGER     CHECK (max_attempts IS NULL OR max_attempts >= 1),
    priority     SMALLINT    NOT NULL DEFAULT 0,      -- lower runs first
    run_at       TIMESTAMPTZ NOT NULL DEFAULT now(),  -- not claimed before this
    owner        BIGINT,                              -- async_node.id of the claiming node
    claim_token  BIGINT      NOT NULL DEFAULT 0,      -- bumped by every claim; fences writes
    parent_id    BIGINT,
    last_error   TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    claimed_at   TIMESTAMPTZ,
    deadline_at  TIMESTAMPTZ,                         -- a running task past it is rescued
    finished_at  TIMESTAMPTZ,
    CONSTRAINT async_task_keyword_biz_id_key UNIQUE (keyword, biz_id)
);

-- The claim: an index range scan over due pending tasks in claim order. Rows leave the
-- index when they are claimed, so its size follows the backlog, not the table.
CREATE INDEX async_task_claim_idx ON async_task (priority, run_at, id) WHERE state = 'pending';
-- Rescue and release look up running tasks by owner.
CREATE INDEX async_task_owner_idx ON async_task (owner) WHERE state = 'running';
-- Pruning finished tasks by age.
CREATE INDEX async_task_finished_idx ON async_task (finished_at)
    WHERE state IN ('done', 'dead', 'cancelled');
