-- One request_log row as ingest sends it: a batch's rows go in as one
-- array of this type (`SELECT r.* FROM unnest($1::ingest_request_row[]) r`),
-- which Postgres takes apart row by row, instead of 27 column arrays that
-- a multi-argument UNNEST materializes one by one. The fields are the
-- request_log columns ingest writes, in the order of its insert's column
-- list (ingested_at is the column's default, the clock at insert).
CREATE TYPE ingest_request_row AS (
    request_id            uuid,
    tenant_id             text,
    api_key_id            text,
    model                 text,
    model_version         text,
    priority              smallint,
    started_at            timestamptz,
    first_token_at        timestamptz,
    finished_at           timestamptz,
    prompt_tokens         bigint,
    cached_tokens         bigint,
    completion_tokens     bigint,
    gpu_seconds           numeric,
    preempted_gpu_seconds numeric,
    finish_reason         text,
    ttft_ms               bigint,
    tpot_ms               bigint,
    replica_id            text,
    gateway_id            text,
    stream                boolean,
    content_hash          bytea,
    kafka_partition       integer,
    kafka_offset          bigint,
    pool                  text,
    dedicated_to          text,
    queue_wait_ms         bigint,
    preemptions           bigint
);
