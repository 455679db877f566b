-- The state rule of async_task spelled as comparisons: the same rule, cheaper to check.
-- SQLite codes an `IN` list of more than two constants as a temporary b-tree, built again by
-- every statement that checks the rule: every enqueue, claim, completion and failure. That
-- cost a strict drain about a sixth of its rate (docs/notes/2026-11-26-sqlite-state-check.md).
--
-- ALTER TABLE cannot change a CHECK. This is SQLite's own procedure for changing one without
-- rebuilding the table (https://sqlite.org/lang_altertable.html, "Making Other Kinds Of
-- Table Schema Changes"): the table's text is edited in sqlite_schema, and the schema read
-- again. Every row already keeps the rule, since the rule is unchanged. A connection that
-- another process holds open keeps the old spelling until it next reads the schema: the same
-- rule. The edit replaces one exact text; a schema edited by hand is left alone.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql,
       'CHECK (state IN (''pending'', ''running'', ''done'', ''dead'', ''cancelled'', ''blocked''))',
       'CHECK (state = ''pending'' OR state = ''running'' OR state = ''done'' OR state = ''dead''
               OR state = ''cancelled'' OR state = ''blocked'')')
 WHERE type = 'table' AND name = 'async_task';
PRAGMA writable_schema = RESET;
