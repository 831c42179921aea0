-- Price books and invoices. Drafts are never stored: they are recomputed
-- from usage_hourly on request. Finalized invoices are immutable.

CREATE TABLE price_books (
    version         text PRIMARY KEY,
    effective_from  date NOT NULL UNIQUE,
    -- The whole book as loaded and validated (see billing-api rating::price_book).
    body            jsonb NOT NULL,
    loaded_at       timestamptz NOT NULL DEFAULT now()
);

-- Idle GPU-seconds of the fleet per hour, for an overhead pool priced as
-- idle time × a rate. Fed by the engine's idle accounting.
CREATE TABLE fleet_idle_hourly (
    hour        timestamptz PRIMARY KEY CHECK (date_trunc('hour', hour) = hour),
    gpu_seconds numeric(20, 6) NOT NULL CHECK (gpu_seconds >= 0)
);

CREATE TABLE invoices (
    invoice_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id     text NOT NULL REFERENCES tenants (tenant_id),
    period        text NOT NULL CHECK (period ~ '^[0-9]{4}-[0-9]{2}$'),
    status        text NOT NULL CHECK (status IN ('finalized', 'voided')),
    -- Gapless: assigned under a table lock when finalized.
    number        bigint NOT NULL UNIQUE,
    content       jsonb NOT NULL,
    content_hash  bytea NOT NULL,
    finalized_at  timestamptz NOT NULL DEFAULT now(),
    finalized_by  text NOT NULL,
    voided_at     timestamptz,
    voided_by     text,
    void_reason   text,
    CHECK ((status = 'voided') = (voided_at IS NOT NULL AND void_reason IS NOT NULL))
);
-- At most one live (finalized) invoice per tenant and month.
CREATE UNIQUE INDEX invoices_one_finalized ON invoices (tenant_id, period) WHERE status = 'finalized';
