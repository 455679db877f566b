-- Nothing to do on SQLite: it has no statement-level triggers, so its max_queued check
-- stays per row (each INSERT holds the database's one write lock; the count stops at the
-- limit). This migration exists so that both backends have the same migration versions.
SELECT 1;
