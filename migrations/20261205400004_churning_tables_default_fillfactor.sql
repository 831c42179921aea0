-- The tables 20261205400002 gave a lower fillfactor go back to the default
-- (100), their autovacuum settings kept. Their updates change no indexed
-- column, so they are HOT and pruned on their own pages without a vacuum
-- at 100 too: 60 s of pgbench upserting the same 40 usage_hourly rows
-- (~90,000 statements, autovacuum off) kept the table at 2 pages with 100
-- (1.4 MB with 70), at the same rate, flat from start to end. Fewer rows a
-- page only spread them.
ALTER TABLE usage_hourly RESET (fillfactor);
ALTER TABLE usage_key_hourly RESET (fillfactor);
ALTER TABLE dedicated_usage_hourly RESET (fillfactor);
ALTER TABLE fleet_idle_hourly RESET (fillfactor);
ALTER TABLE dedicated_capacity_hourly RESET (fillfactor);
ALTER TABLE consumer_offsets RESET (fillfactor);
