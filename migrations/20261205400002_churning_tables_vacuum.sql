-- Autovacuum settings for the tables every batch churns, for servers where
-- autovacuum runs (the archiver vacuums the archive queue itself, so it
-- does not rely on them; see archive::reclaim).
--
-- archive_queue_batches: every batch's row is inserted once and deleted
-- once, so the table is mostly dead rows unless vacuumed. The default
-- threshold (20% of the table) waits for a backlog's worth of them; vacuum
-- at 1,000 whatever the size (its ids live in the TOAST table, which
-- follows these settings), and never wait for an insert threshold (the
-- rows leave anyway).
ALTER TABLE archive_queue_batches SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0,
    autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 1000,
    toast.autovacuum_vacuum_scale_factor = 0,
    toast.autovacuum_vacuum_threshold = 10000
);

-- The hourly rollups: every batch adds to the current hours' rows (an
-- upsert updates a few rows many times an hour), and the tables grow by
-- months of hours, so 20% of the table is far more dead versions than live
-- rows being updated. Vacuum at 1% (plus 1,000). A fillfactor of 70 leaves
-- room on each page for the next version of its rows: updates change no
-- indexed column, so they stay on the page (HOT) and the page prunes the
-- old versions itself, without a vacuum and without new index entries.
-- It applies to pages written from now on.
ALTER TABLE usage_hourly SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02
);
ALTER TABLE usage_key_hourly SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02
);
ALTER TABLE dedicated_usage_hourly SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02
);
-- Replica reports add to these the same way, once per report.
ALTER TABLE fleet_idle_hourly SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000
);
ALTER TABLE dedicated_capacity_hourly SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000
);
-- consumer_offsets: a few rows, each updated by every batch.
ALTER TABLE consumer_offsets SET (
    fillfactor = 50,
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000
);
