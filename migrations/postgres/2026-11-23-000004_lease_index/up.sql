-- Nothing to do on PostgreSQL. The SQLite migration of this version replaces its
-- running-task index with a lease index that completions leave alone, because an SQLite
-- commit writes every page it changed to the WAL. PostgreSQL writes a new row version, and
-- its index entries, at every update anyway.
-- This migration exists so that both backends have the same migration versions.
SELECT 1;
