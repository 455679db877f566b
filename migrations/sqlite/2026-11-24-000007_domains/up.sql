-- Task domains' run-time control (README, "Domains"). Every node reads these rows at each
-- heartbeat; a row overrides the node's own configuration of the domain it names, field by
-- field (NULL: as the node is configured), or adds a domain the node was not configured with
-- (then keywords, mode and threads are all set).
CREATE TABLE async_domain (
    name       TEXT    PRIMARY KEY NOT NULL CONSTRAINT async_domain_name_check CHECK (
        typeof(name) = 'text' AND length(name) BETWEEN 1 AND 64
        AND name NOT GLOB '*[^a-z0-9._:-]*'),
    keywords   TEXT,                                 -- a JSON array of keywords
    mode       TEXT    CONSTRAINT async_domain_mode_check CHECK (mode IN ('max', 'reserved')),
    threads    INTEGER CONSTRAINT async_domain_threads_check CHECK (
        threads IS NULL OR (typeof(threads) = 'integer' AND threads BETWEEN 0 AND 2147483647)),
    queue      INTEGER CONSTRAINT async_domain_queue_check CHECK (
        queue IS NULL OR (typeof(queue) = 'integer' AND queue BETWEEN 0 AND 2147483647)),
    timeout_ms INTEGER CONSTRAINT async_domain_timeout_check CHECK (
        timeout_ms IS NULL OR (typeof(timeout_ms) = 'integer' AND timeout_ms > 0)),
    -- Nothing is claimed for a paused domain; its running tasks finish.
    paused     INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    -- Force-released: paused, and its reserved threads given to default until resumed.
    released   INTEGER NOT NULL DEFAULT 0 CHECK (released IN (0, 1)),
    version    INTEGER NOT NULL DEFAULT 1,
    updated_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    updated_by TEXT    NOT NULL DEFAULT ''
);

-- Keywords paused on their own (`outbox pause KEYWORD`): nothing is claimed for them.
CREATE TABLE async_pause (
    keyword   TEXT PRIMARY KEY NOT NULL,
    paused_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    paused_by TEXT NOT NULL DEFAULT ''
);

-- What each node publishes at each heartbeat: its threads, and its domains' configuration
-- and slot use (JSON), for `outbox stats` and `outbox domain list`.
ALTER TABLE async_node ADD COLUMN domains TEXT;
