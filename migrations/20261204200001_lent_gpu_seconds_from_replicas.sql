-- Replica reports v2 say, of a dedicated replica's busy time, what ran for
-- tenants other than its owner (lent), as the replica counted it. A usage
-- event names only the replica its request ended on, so a request
-- preempted on a lent replica and finished elsewhere cannot place the GPU
-- time it lost there: the owner's credit for lending is measured by the
-- replica instead. v1 reports (NULL here) keep the old rule for their
-- hours: lent time from the events (dedicated_usage_hourly).
ALTER TABLE replica_reports
    ADD COLUMN lent_gpu_seconds numeric(20, 6)
        CHECK (lent_gpu_seconds >= 0 AND lent_gpu_seconds <= busy_gpu_seconds);

-- Per owner, model and hour: the lent time of the v2 reports, and how many
-- v1 reports (without it) the hour holds. An hour with any v1 report takes
-- its lent time from the events.
ALTER TABLE dedicated_capacity_hourly
    ADD COLUMN lent_gpu_seconds numeric(20, 6) NOT NULL DEFAULT 0,
    ADD COLUMN reports_without_lent integer NOT NULL DEFAULT 0;

UPDATE dedicated_capacity_hourly d SET reports_without_lent = r.n
FROM (SELECT dedicated_to, model, hour, count(*)::integer AS n FROM replica_reports
      WHERE dedicated_to IS NOT NULL GROUP BY 1, 2, 3) r
WHERE r.dedicated_to = d.owner_id AND r.model = d.model AND r.hour = d.hour;
