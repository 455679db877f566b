DROP TRIGGER async_task_biz_data_resize ON async_task;
DROP TRIGGER async_task_biz_data_size ON async_task;
CREATE TRIGGER async_task_biz_data_size BEFORE INSERT OR UPDATE OF biz_data ON async_task
    FOR EACH ROW WHEN (octet_length(NEW.biz_data::text) > 65536)
    EXECUTE FUNCTION async_task_refuse('biz_data is over 65536 bytes');
