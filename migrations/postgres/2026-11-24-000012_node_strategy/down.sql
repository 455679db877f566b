ALTER TABLE async_node DROP COLUMN running, DROP COLUMN weight, DROP COLUMN strategy;
