DROP TRIGGER IF EXISTS async_tenant_removal;
DROP TRIGGER IF EXISTS async_tenant_limit_change;
