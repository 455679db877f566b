ALTER TABLE async_node DROP COLUMN running;
ALTER TABLE async_node DROP COLUMN weight;
ALTER TABLE async_node DROP COLUMN strategy;
