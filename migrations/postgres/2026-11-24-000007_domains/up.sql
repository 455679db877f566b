-- Task domains' run-time control (README, "Domains"). Every node reads these rows at each
-- heartbeat; a row overrides the node's own configuration of the domain it names, field by
-- field (NULL: as the node is configured), or adds a domain the node was not configured with
-- (then keywords, mode and threads are all set).
CREATE TABLE async_domain (
    name       TEXT        PRIMARY KEY
        CONSTRAINT async_domain_name_check CHECK (name ~ '^[a-z0-9._:-]{1,64}$'),
    keywords   TEXT,                                 -- a JSON array of keywords
    mode       TEXT
        CONSTRAINT async_domain_mode_check CHECK (mode IN ('max', 'reserved')),
    threads    INTEGER     CONSTRAINT async_domain_threads_check CHECK (threads >= 0),
    queue      INTEGER     CONSTRAINT async_domain_queue_check CHECK (queue >= 0),
    timeout_ms BIGINT      CONSTRAINT async_domain_timeout_check CHECK (timeout_ms > 0),
    -- Nothing is claimed for a paused domain; its running tasks finish.
    paused     BOOLEAN     NOT NULL DEFAULT false,
    -- Force-released: paused, and its reserved threads given to default until resumed.
    released   BOOLEAN     NOT NULL DEFAULT false,
    version    BIGINT      NOT NULL DEFAULT 1,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_by TEXT        NOT NULL DEFAULT current_user
);

-- Keywords paused on their own (`outbox pause KEYWORD`): nothing is claimed for them.
CREATE TABLE async_pause (
    keyword   TEXT        PRIMARY KEY,
    paused_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    paused_by TEXT        NOT NULL DEFAULT current_user
);

-- What each node publishes at each heartbeat: its threads, and its domains' configuration
-- and slot use (JSON), for `outbox stats` and `outbox domain list`.
ALTER TABLE async_node ADD COLUMN domains TEXT;
