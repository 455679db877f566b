-- The schema refuses what the Rust API refuses, so that a producer's plain INSERT, from any
-- language, is held to the same rules (README, "Enqueue from another language"). PostgreSQL's
-- types already hold most of them: text and jsonb cannot contain NUL (nor jsonb a \u0000
-- escape), `priority` is a smallint, `max_attempts` an integer, and the keyword and biz_id
-- checks are the first migration's. Added here:
--
--   tenant     NULL, or 1-128 bytes
--   biz_data   at most 65536 bytes of jsonb's text form (`biz_data::text`, with a space after
--              each ':' and ','), the form the API measures on PostgreSQL
--   run_at     at most 87600 hours (3650 days) after the insert, by the database clock
--
-- The last two are triggers whose WHEN condition does the check, so that the function runs
-- only to refuse a row: a CHECK constraint is evaluated at every UPDATE of the row whatever
-- it sets (three times per task), and may not read the clock. The payload trigger fires on
-- INSERT and on an UPDATE that sets biz_data; the run_at one on INSERT only (a retry's or a
-- rescue's backoff may not be refused). 87600 hours, not 3650 days: a day is 23 or 25 hours
-- across a daylight saving change in the session's time zone, the API's delay never is.
--
-- ADD CONSTRAINT reads every row under an exclusive lock on async_task (writers and readers
-- wait). A row that breaks the new check fails the migration, which then changes nothing:
-- such a row can only come from a plain INSERT, never from the API; the error names the
-- constraint; correct or delete the row and migrate again.
ALTER TABLE async_task ADD CONSTRAINT async_task_tenant_check
    CHECK (tenant IS NULL OR octet_length(tenant) BETWEEN 1 AND 128);

CREATE OR REPLACE FUNCTION async_task_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'async_task: %', TG_ARGV[0]
        USING ERRCODE = 'check_violation', TABLE = TG_TABLE_NAME;
END
$$;

CREATE TRIGGER async_task_biz_data_size BEFORE INSERT OR UPDATE OF biz_data ON async_task
    FOR EACH ROW WHEN (octet_length(NEW.biz_data::text) > 65536)
    EXECUTE FUNCTION async_task_refuse('biz_data is over 65536 bytes');

CREATE TRIGGER async_task_run_at_ahead BEFORE INSERT ON async_task
    FOR EACH ROW WHEN (NEW.run_at > now() + interval '87600 hours')
    EXECUTE FUNCTION async_task_refuse('run_at is more than 3650 days ahead');
