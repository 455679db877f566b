-- The payload's size is checked after an UPDATE of it, no longer before one. A BEFORE UPDATE
-- row trigger makes PostgreSQL lock every row an UPDATE of the table writes before it looks
-- at the trigger's columns and condition: a tuple lock and its WAL record for every claim,
-- completion and failure, though none of them changes the payload (a sixth of the WAL
-- records of a batched drain, docs/notes/2026-11-26-postgres-speed.md). An AFTER trigger
-- refuses the same updates (its error ends the statement) without the lock; inserts keep
-- theirs, which costs no lock.
DROP TRIGGER async_task_biz_data_size ON async_task;
CREATE TRIGGER async_task_biz_data_size BEFORE INSERT ON async_task
    FOR EACH ROW WHEN (octet_length(NEW.biz_data::text) > 65536)
    EXECUTE FUNCTION async_task_refuse('biz_data is over 65536 bytes');
CREATE TRIGGER async_task_biz_data_resize AFTER UPDATE OF biz_data ON async_task
    FOR EACH ROW WHEN (octet_length(NEW.biz_data::text) > 65536)
    EXECUTE FUNCTION async_task_refuse('biz_data is over 65536 bytes');
