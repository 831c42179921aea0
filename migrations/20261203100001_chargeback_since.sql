-- The day a tenant's real chargeback began (a local date in its time zone),
-- after at least one shadow month. Its first 30 days are the grace period:
-- charges above the month's budget that accrue in them are shown and not
-- invoiced (billing-api's `grace` module). Written by billing-api's tenant
-- administration, which refuses it on a tenant still in shadow mode.
ALTER TABLE tenants ADD COLUMN chargeback_since date
    CHECK (chargeback_since IS NULL OR NOT shadow);
