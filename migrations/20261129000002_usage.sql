-- Stored usage: one row per request, hourly rollups, consumer offsets and
-- dead letters. GPU time is numeric (exact to the microsecond), never float.

-- One row per request. Range-partitioned by UTC day on the request id itself:
-- a UUIDv7 starts with its creation time, so every version of a request
-- (re-send or conflicting rewrite) falls in the same partition whatever
-- started_at it claims, and the primary key finds it.
CREATE TABLE request_log (
    request_id            uuid NOT NULL,
    tenant_id             text NOT NULL,
    api_key_id            text NOT NULL,
    model                 text NOT NULL,
    model_version         text NOT NULL,
    priority              smallint NOT NULL,
    started_at            timestamptz NOT NULL,
    first_token_at        timestamptz,
    finished_at           timestamptz NOT NULL,
    prompt_tokens         bigint NOT NULL,
    cached_tokens         bigint NOT NULL,
    completion_tokens     bigint NOT NULL,
    gpu_seconds           numeric(20, 6) NOT NULL,
    preempted_gpu_seconds numeric(20, 6) NOT NULL,
    finish_reason         text NOT NULL,
    ttft_ms               bigint,
    tpot_ms               bigint,
    replica_id            text NOT NULL,
    gateway_id            text NOT NULL,
    stream                boolean NOT NULL,
    -- SHA-256 of the canonical event: equal means duplicate, unequal conflict.
    content_hash          bytea NOT NULL,
    kafka_partition       integer NOT NULL,
    kafka_offset          bigint NOT NULL,
    ingested_at           timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id)
) PARTITION BY RANGE (request_id);

CREATE INDEX request_log_tenant_started ON request_log (tenant_id, started_at);

-- The smallest UUID whose v7 timestamp is the start of `day` (UTC).
CREATE FUNCTION request_log_bound(day date) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    SELECT (lpad(to_hex((extract(epoch FROM day::timestamp) * 1000)::bigint), 12, '0')
            || '00000000000000000000')::uuid
$$;

-- Creates the partition for one UTC day if it is missing. Safe to call from
-- several processes at once.
CREATE FUNCTION ensure_request_log_partition(day date) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    name text := 'request_log_' || to_char(day, 'YYYYMMDD');
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('request_log_partitions'));
    IF to_regclass(name) IS NULL THEN
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF request_log FOR VALUES FROM (%L) TO (%L)',
            name, request_log_bound(day), request_log_bound(day + 1));
    END IF;
END
$$;

CREATE TABLE usage_hourly (
    tenant_id             text NOT NULL,
    model                 text NOT NULL,
    priority              smallint NOT NULL,
    -- Start of the UTC hour that the requests started in.
    hour                  timestamptz NOT NULL CHECK (date_trunc('hour', hour) = hour),
    requests              bigint NOT NULL DEFAULT 0,
    prompt_tokens         bigint NOT NULL DEFAULT 0,
    cached_tokens         bigint NOT NULL DEFAULT 0,
    completion_tokens     bigint NOT NULL DEFAULT 0,
    gpu_seconds           numeric(20, 6) NOT NULL DEFAULT 0,
    preempted_gpu_seconds numeric(20, 6) NOT NULL DEFAULT 0,
    cancelled_requests    bigint NOT NULL DEFAULT 0,
    errored_requests      bigint NOT NULL DEFAULT 0,
    updated_at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, model, priority, hour)
);
CREATE INDEX usage_hourly_hour ON usage_hourly (hour);

-- Where each consumer group is in each partition. Moved only by
-- compare-and-set, in the same transaction as the data it covers.
CREATE TABLE consumer_offsets (
    consumer_group  text NOT NULL,
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    next_offset     bigint NOT NULL CHECK (next_offset >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, kafka_partition)
);

-- Every message that could not be counted, with why. Nothing is dropped.
CREATE TABLE dead_letters (
    dead_letter_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    kafka_offset    bigint NOT NULL,
    raw             bytea NOT NULL,
    reason_code     text NOT NULL,
    reason          text NOT NULL,
    -- Set when the payload decoded far enough to tell.
    request_id      uuid,
    tenant_id       text,
    -- For conflicts: the version already in request_log.
    stored_version  jsonb,
    received_at     timestamptz NOT NULL DEFAULT now(),
    -- Re-driven after a fix: when, and what became of it.
    redriven_at     timestamptz,
    redrive_outcome text,
    UNIQUE (topic, kafka_partition, kafka_offset)
);
CREATE INDEX dead_letters_open ON dead_letters (reason_code) WHERE redriven_at IS NULL;
