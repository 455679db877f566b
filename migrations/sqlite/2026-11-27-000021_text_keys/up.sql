-- The key columns of async_task hold text only. SQLite keeps a BLOB in a TEXT column as a
-- BLOB, which never equals the text of the same bytes: a plain INSERT of a BLOB key (a
-- Python producer passing bytes) made a second task beside the text one, never claimed (the
-- claim binds text), and a BLOB tenant passed its tenant's limits. The rules were checked on
-- the value's text only. Edited in place as migration 000020 edits the state rule (see its
-- comment): the rules gain a test, and every row the API wrote keeps them.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(replace(replace(sql,
       'length(keyword) BETWEEN 1 AND 64',
       'typeof(keyword) = ''text'' AND length(keyword) BETWEEN 1 AND 64'),
       'length(CAST(biz_id AS BLOB)) BETWEEN 1 AND 128',
       'typeof(biz_id) = ''text'' AND length(CAST(biz_id AS BLOB)) BETWEEN 1 AND 128'),
       'length(CAST(tenant AS BLOB)) BETWEEN 1 AND 128',
       'typeof(tenant) = ''text'' AND length(CAST(tenant AS BLOB)) BETWEEN 1 AND 128')
 WHERE type = 'table' AND name = 'async_task';
PRAGMA writable_schema = RESET;
CREATE TABLE async_schema_version_bump (x);
DROP TABLE async_schema_version_bump;
