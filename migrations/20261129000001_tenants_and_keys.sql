-- Tenants, their API keys (hashes only) and per-model limits.

CREATE TABLE tenants (
    tenant_id        text PRIMARY KEY CHECK (tenant_id ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    display_name     text NOT NULL,
    plan             text NOT NULL CHECK (plan IN ('free', 'standard', 'enterprise')),
    priority         smallint NOT NULL CHECK (priority BETWEEN 1 AND 5),
    wfq_weight       integer NOT NULL DEFAULT 1 CHECK (wfq_weight > 0),
    billing_mode     text NOT NULL CHECK (billing_mode IN ('per_token', 'per_gpu_second')),
    -- Shadow tenants get invoices that are computed and shown, never payable.
    shadow           boolean NOT NULL DEFAULT true,
    -- IANA zone; decides where the tenant's billing month starts.
    time_zone        text NOT NULL DEFAULT 'UTC',
    requests_per_second integer CHECK (requests_per_second > 0),
    burst            integer CHECK (burst > 0),
    max_concurrency  integer CHECK (max_concurrency > 0),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    api_key_id   text PRIMARY KEY,
    tenant_id    text NOT NULL REFERENCES tenants (tenant_id),
    -- SHA-256 of the whole key. Keys are 256-bit random strings, so a fast
    -- hash is enough; the key itself is never stored.
    key_hash     bytea NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    -- The first characters, to tell keys apart in listings.
    key_prefix   text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

-- Per tenant and model; model '*' applies to every model without its own row.
CREATE TABLE limits (
    tenant_id    text NOT NULL REFERENCES tenants (tenant_id),
    model        text NOT NULL,
    rpm          integer CHECK (rpm > 0),
    tpm          bigint CHECK (tpm > 0),
    max_context  integer CHECK (max_context > 0),
    max_output   integer CHECK (max_output > 0),
    PRIMARY KEY (tenant_id, model)
);
