-- Usage per API key: the rollup behind "cost per API key". Maintained by
-- ingest in the same transaction as usage_hourly (whose key is unchanged),
-- from the same inserted rows. The priority is part of the key because a
-- GPU-second's price depends on it. Backfilled here from request_log for the
-- days it still holds; older months have no per-key split.
CREATE TABLE usage_key_hourly (
    tenant_id         text NOT NULL,
    api_key_id        text NOT NULL,
    model             text NOT NULL,
    priority          smallint NOT NULL,
    hour              timestamptz NOT NULL CHECK (date_trunc('hour', hour) = hour),
    requests          bigint NOT NULL,
    prompt_tokens     bigint NOT NULL,
    cached_tokens     bigint NOT NULL,
    completion_tokens bigint NOT NULL,
    gpu_seconds       numeric(20, 6) NOT NULL,
    PRIMARY KEY (tenant_id, api_key_id, model, priority, hour)
);
CREATE INDEX usage_key_hourly_tenant_hour ON usage_key_hourly (tenant_id, hour);

INSERT INTO usage_key_hourly (tenant_id, api_key_id, model, priority, hour, requests,
    prompt_tokens, cached_tokens, completion_tokens, gpu_seconds)
SELECT tenant_id, api_key_id, model, priority, date_trunc('hour', started_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',
       count(*), sum(prompt_tokens), sum(cached_tokens), sum(completion_tokens), sum(gpu_seconds)
FROM request_log
GROUP BY 1, 2, 3, 4, 5;
