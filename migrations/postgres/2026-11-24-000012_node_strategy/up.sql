-- Claim strategies (README, "Claim strategies"): what each node publishes at each heartbeat
-- and the others read then. `running` is how many tasks the node holds (claimed, not
-- finished) at that beat.
ALTER TABLE async_node
    ADD COLUMN strategy TEXT NOT NULL DEFAULT 'default'
        CONSTRAINT async_node_strategy_check
        CHECK (strategy IN ('default', 'id_hash', 'least_count', 'weight')),
    ADD COLUMN weight INTEGER NOT NULL DEFAULT 1
        CONSTRAINT async_node_weight_check CHECK (weight BETWEEN 1 AND 1000),
    ADD COLUMN running BIGINT NOT NULL DEFAULT 0
        CONSTRAINT async_node_running_check CHECK (running >= 0);
