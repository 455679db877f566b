-- max_queued at REPEATABLE READ (the trigger async_task_before_insert): a producer whose
-- snapshot shows the tenant's counters as its locking reads do counts its tenant's queued
-- tasks in that snapshot. Only enqueues checked against a limit bump the counters, so an
-- enqueue made while the tenant had no limit (no row, or max_queued NULL) moved neither: a
-- snapshot taken before such enqueues, and before the limit came, counted as if they had not
-- happened. A change of a tenant's max_queued now bumps its counter, and the removal of its
-- row bumps its counter of late enqueues (which stays when the row goes): a snapshot from
-- before either counts with the locking read.
DROP TRIGGER IF EXISTS async_tenant_limit_change;
CREATE TRIGGER async_tenant_limit_change BEFORE UPDATE ON async_tenant FOR EACH ROW
BEGIN
    IF NOT (NEW.max_queued <=> OLD.max_queued) THEN
        SET NEW.enqueue_seq = OLD.enqueue_seq + 1;
    END IF;
END;
DROP TRIGGER IF EXISTS async_tenant_removal;
CREATE TRIGGER async_tenant_removal AFTER DELETE ON async_tenant FOR EACH ROW
    INSERT INTO async_tenant_late_enqueue (tenant, enqueue_seq) VALUES (OLD.tenant, 1)
        ON DUPLICATE KEY UPDATE enqueue_seq = enqueue_seq + 1;
