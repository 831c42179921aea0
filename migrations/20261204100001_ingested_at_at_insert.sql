-- ingested_at is the clock when the row is inserted, under ingest's lock
-- (schema::USAGE_LOCK, held shared by every batch), not when its
-- transaction began. A finalization takes that lock exclusively and reads
-- the clock as its finalized_at, so a row is on an invoice exactly when it
-- was ingested before the invoice was finalized: what lookup (which
-- invoice billed a request) and the audit (recomputing invoices from the
-- archive by ingested_at) compare. With now(), a batch that began before a
-- finalization and committed after it carried an earlier time than the
-- invoice it was not on.
ALTER TABLE request_log ALTER COLUMN ingested_at SET DEFAULT clock_timestamp();
ALTER TABLE replica_reports ALTER COLUMN ingested_at SET DEFAULT clock_timestamp();
