-- A tenant's monthly budget, set by finance: the shadow bill and the API
-- warn at 80% and 100% of it.
CREATE TABLE tenant_budgets (
    tenant_id  text NOT NULL REFERENCES tenants (tenant_id),
    period     text NOT NULL CHECK (period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$'),
    amount     numeric(14, 2) NOT NULL CHECK (amount > 0),
    set_by     text NOT NULL,
    set_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, period)
);
