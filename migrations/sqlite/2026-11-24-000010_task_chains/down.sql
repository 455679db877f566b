DROP TRIGGER async_task_parent_forget;
DROP TRIGGER async_task_children_cancel;
DROP TRIGGER async_task_children_release;
DROP TRIGGER async_task_parent_insert;
DROP TRIGGER async_task_parent_link;
DROP TABLE async_task_parent;
ALTER TABLE async_task DROP COLUMN has_children;
ALTER TABLE async_task DROP COLUMN blocked_by;
