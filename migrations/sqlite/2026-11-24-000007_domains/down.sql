ALTER TABLE async_node DROP COLUMN domains;
DROP TABLE async_pause;
DROP TABLE async_domain;
