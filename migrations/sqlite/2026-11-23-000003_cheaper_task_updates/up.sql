-- Nothing to do on SQLite. It checks a CHECK constraint on UPDATE only when the update
-- changes a column the constraint names (claims and completions change none of the
-- keyword's), and its indexes end with the rowid, so `async_task_owner_idx (owner)` already
-- answers `owner = ? AND id = ?` with one probe per task.
-- This migration exists so that both backends have the same migration versions.
SELECT 1;
