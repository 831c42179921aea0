-- The hour lifecycle and request_log retention, owned by rollup.

-- An hour is open until rollup closes it (the watermark, less the allowed
-- lateness, has passed its end). Usage that ingest inserts into a closed
-- hour is still counted, and marks the hour as adjusted so billing can tell.
CREATE TABLE usage_hours (
    hour           timestamptz PRIMARY KEY CHECK (date_trunc('hour', hour) = hour),
    closed_at      timestamptz NOT NULL DEFAULT now(),
    -- The watermark that closed it.
    watermark      timestamptz NOT NULL,
    adjusted       boolean NOT NULL DEFAULT false,
    late_requests  bigint NOT NULL DEFAULT 0,
    last_adjusted_at timestamptz
);

-- request_log day partitions dropped so far. A re-send of a request from a
-- dropped day can no longer be recognised as a duplicate, so ingest
-- dead-letters events from those days instead of counting them again.
CREATE TABLE request_log_retention (
    singleton        boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    dropped_through  date NOT NULL
);
