-- request_log is written at the full event rate and read rarely (support's
-- lookups go by primary key; reconcile scans a period's day partitions).
-- A secondary index on (tenant_id, started_at) cost a third of ingest's
-- insert time for no reader that needs it.
DROP INDEX IF EXISTS request_log_tenant_started;
