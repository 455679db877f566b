-- Nothing to do on SQLite, which has no autovacuum to tune: the pages that `outbox prune`
-- frees go to the file's free list and are reused by later inserts, so the file stops
-- growing without help (it does not shrink either; `VACUUM` does that, offline).
-- This migration exists so that both backends have the same migration versions.
SELECT 1;
