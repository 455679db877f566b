-- The key rules without their type test again (see up.sql).
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(replace(replace(sql,
       'typeof(keyword) = ''text'' AND length(keyword) BETWEEN 1 AND 64',
       'length(keyword) BETWEEN 1 AND 64'),
       'typeof(biz_id) = ''text'' AND length(CAST(biz_id AS BLOB)) BETWEEN 1 AND 128',
       'length(CAST(biz_id AS BLOB)) BETWEEN 1 AND 128'),
       'typeof(tenant) = ''text'' AND length(CAST(tenant AS BLOB)) BETWEEN 1 AND 128',
       'length(CAST(tenant AS BLOB)) BETWEEN 1 AND 128')
 WHERE type = 'table' AND name = 'async_task';
PRAGMA writable_schema = RESET;
CREATE TABLE async_schema_version_bump (x);
DROP TABLE async_schema_version_bump;
