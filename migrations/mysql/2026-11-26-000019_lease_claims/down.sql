DROP TABLE IF EXISTS async_lease;
