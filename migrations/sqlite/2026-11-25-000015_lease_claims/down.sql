DROP INDEX async_task_suspect_idx;
ALTER TABLE async_task DROP COLUMN suspect;
