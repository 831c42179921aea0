-- Bearer tokens for billing-api, stored as SHA-256 hashes only.
CREATE TABLE billing_tokens (
    token_id    text PRIMARY KEY,
    token_hash  bytea NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    role        text NOT NULL CHECK (role IN ('finance', 'team_lead', 'support')),
    -- A team lead sees one tenant; finance and support are not bound.
    tenant_id   text REFERENCES tenants (tenant_id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    CHECK ((role = 'team_lead') = (tenant_id IS NOT NULL))
);

-- Who read money, what, and when.
CREATE TABLE audit_log (
    audit_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token_id    text NOT NULL,
    role        text NOT NULL,
    action      text NOT NULL,
    tenant_id   text,
    at          timestamptz NOT NULL DEFAULT now()
);
