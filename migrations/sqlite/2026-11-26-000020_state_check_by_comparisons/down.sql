-- The state rule spelled as the `IN` list again (see up.sql).
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql,
       'CHECK (state = ''pending'' OR state = ''running'' OR state = ''done'' OR state = ''dead''
               OR state = ''cancelled'' OR state = ''blocked'')',
       'CHECK (state IN (''pending'', ''running'', ''done'', ''dead'', ''cancelled'', ''blocked''))')
 WHERE type = 'table' AND name = 'async_task';
PRAGMA writable_schema = RESET;
CREATE TABLE async_schema_version_bump (x);
DROP TABLE async_schema_version_bump;
