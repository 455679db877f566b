ALTER TABLE async_domain DROP COLUMN held_keywords;
