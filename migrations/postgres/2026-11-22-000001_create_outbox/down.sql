DROP TABLE async_task;
DROP TABLE async_node;
