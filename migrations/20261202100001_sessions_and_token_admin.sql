-- Browser sessions for billing-api's pages, and what token administration
-- records. A session id is stored only as its SHA-256 hash; a session ends
-- at its expiry, at sign-out, or when its token is revoked (the sessions of
-- a revoked token are deleted in the same transaction, and a session is only
-- resolved through a live token).

CREATE TABLE billing_sessions (
    session_hash bytea PRIMARY KEY CHECK (length(session_hash) = 32),
    token_id     text NOT NULL REFERENCES billing_tokens (token_id),
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);
CREATE INDEX billing_sessions_token ON billing_sessions (token_id);

-- Who issued a token, and a label people recognise it by.
ALTER TABLE billing_tokens
    ADD COLUMN issued_by text,
    ADD COLUMN label text NOT NULL DEFAULT '';

-- What an audited action was about beyond its tenant (e.g. the token revoked).
ALTER TABLE audit_log ADD COLUMN detail text;
