-- The state rule of async_task spelled as comparisons: the same rule, cheaper to check.
-- SQLite codes an `IN` list of more than two constants as a temporary b-tree, built again by
-- every statement that checks the rule: every enqueue, claim, completion and failure. That
-- cost a strict drain about a tenth of its rate (docs/notes/2026-11-26-sqlite-state-check.md).
--
-- ALTER TABLE cannot change a CHECK. This follows SQLite's procedure for changing one without
-- rebuilding the table (https://sqlite.org/lang_altertable.html, "Making Other Kinds Of
-- Table Schema Changes"): the table's text is edited in sqlite_schema and the schema read
-- again; then a table is created and dropped, which moves the schema's version, so that
-- every other connection, of this process or another, reads the schema again before its
-- next statement. Every row already keeps the rule, since the rule is unchanged. The edit
-- replaces one exact text; a schema edited by hand is left alone.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql,
       'CHECK (state IN (''pending'', ''running'', ''done'', ''dead'', ''cancelled'', ''blocked''))',
       'CHECK (state = ''pending'' OR state = ''running'' OR state = ''done'' OR state = ''dead''
               OR state = ''cancelled'' OR state = ''blocked'')')
 WHERE type = 'table' AND name = 'async_task';
PRAGMA writable_schema = RESET;
CREATE TABLE async_schema_version_bump (x);
DROP TABLE async_schema_version_bump;
