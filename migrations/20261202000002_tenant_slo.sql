-- A tenant's service-level objectives, typed (the seed file's `slo:`):
-- TTFT and end-to-end p95 targets in ms, availability in basis points
-- (99.9% = 9990), or best effort (no targets).
ALTER TABLE tenants
    ADD COLUMN slo_ttft_p95_ms integer CHECK (slo_ttft_p95_ms > 0),
    ADD COLUMN slo_e2e_p95_ms integer CHECK (slo_e2e_p95_ms > 0),
    ADD COLUMN slo_availability_bp integer CHECK (slo_availability_bp BETWEEN 1 AND 10000),
    ADD COLUMN slo_best_effort boolean NOT NULL DEFAULT false;
