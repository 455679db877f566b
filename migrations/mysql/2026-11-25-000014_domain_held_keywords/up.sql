-- The keywords a paused or released domain holds on every node (a JSON array), recorded by
-- `outbox pause` / `domain release` from the domain's keywords as its row and the live nodes
-- know them: a node that does not run the domain (its configuration has no such domain)
-- claims none of them either. NULL while the domain is not paused.
ALTER TABLE async_domain ADD COLUMN held_keywords LONGTEXT;
