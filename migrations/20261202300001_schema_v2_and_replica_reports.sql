-- Contract v2: what the fleet layer did with a request, stored with it.
-- NULL on rows from v1 events (which carry no placement).
ALTER TABLE request_log
    ADD COLUMN pool          text,
    ADD COLUMN dedicated_to  text,
    ADD COLUMN queue_wait_ms bigint,
    ADD COLUMN preemptions   bigint;

-- Usage that ran on a dedicated replica, by the replica's owner and the
-- tenant that ran it (the owner itself, or a borrower of a lent replica).
-- Maintained by ingest in the transaction that adds the same requests to
-- usage_hourly, so the two never disagree; billing shows the owner's own
-- usage here as covered by its reserved capacity and credits the owner for
-- what borrowers ran.
CREATE TABLE dedicated_usage_hourly (
    owner_id              text NOT NULL,
    tenant_id             text NOT NULL,
    model                 text NOT NULL,
    priority              smallint NOT NULL,
    hour                  timestamptz NOT NULL CHECK (date_trunc('hour', hour) = hour),
    requests              bigint NOT NULL DEFAULT 0,
    prompt_tokens         bigint NOT NULL DEFAULT 0,
    cached_tokens         bigint NOT NULL DEFAULT 0,
    completion_tokens     bigint NOT NULL DEFAULT 0,
    gpu_seconds           numeric(20, 6) NOT NULL DEFAULT 0,
    PRIMARY KEY (owner_id, tenant_id, model, priority, hour)
);

-- One row per replica report: a replica's busy and idle GPU-seconds over
-- one interval of one UTC hour, as the process hosting the replica measured
-- it. Reports travel on the usage topic beside the usage events and are
-- stored exactly once by their id (a re-send is a duplicate id).
CREATE TABLE replica_reports (
    report_id         text PRIMARY KEY,
    replica_id        text NOT NULL,
    model             text NOT NULL,
    reporter_id       text NOT NULL,
    dedicated_to      text,
    gpus              integer NOT NULL CHECK (gpus > 0),
    hour              timestamptz NOT NULL CHECK (date_trunc('hour', hour) = hour),
    interval_start    timestamptz NOT NULL,
    interval_end      timestamptz NOT NULL CHECK (interval_end >= interval_start),
    busy_gpu_seconds  numeric(20, 6) NOT NULL CHECK (busy_gpu_seconds >= 0),
    idle_gpu_seconds  numeric(20, 6) NOT NULL CHECK (idle_gpu_seconds >= 0),
    kafka_partition   integer NOT NULL,
    kafka_offset      bigint NOT NULL,
    ingested_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX replica_reports_hour ON replica_reports (hour);

-- A dedicated pool's GPU time per owner and hour (busy and idle): the
-- owner's reserved-capacity line, billed whether used or not. Its idle time
-- is the owner's, so it never enters fleet_idle_hourly.
CREATE TABLE dedicated_capacity_hourly (
    owner_id          text NOT NULL,
    model             text NOT NULL,
    hour              timestamptz NOT NULL CHECK (date_trunc('hour', hour) = hour),
    busy_gpu_seconds  numeric(20, 6) NOT NULL DEFAULT 0,
    idle_gpu_seconds  numeric(20, 6) NOT NULL DEFAULT 0,
    PRIMARY KEY (owner_id, model, hour)
);
