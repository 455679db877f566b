DROP TABLE IF EXISTS async_task_parent;
DROP TABLE IF EXISTS async_task;
DROP TABLE IF EXISTS async_node;
DROP TABLE IF EXISTS async_tenant;
DROP TABLE IF EXISTS async_audit;
DROP TABLE IF EXISTS async_domain;
DROP TABLE IF EXISTS async_pause;
DROP TABLE IF EXISTS async_schedule;
