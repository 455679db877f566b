ALTER TABLE async_task DROP INDEX async_task_suspect_idx, DROP COLUMN suspect;
