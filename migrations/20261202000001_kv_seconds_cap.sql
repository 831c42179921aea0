-- A tenant's cap on concurrent KV·seconds (GiB·s) across every gateway:
-- the sum, over its requests in flight, of each one's estimated KV cache
-- held × decode time (gateway-lite's limits module has the estimate).
ALTER TABLE tenants ADD COLUMN max_kv_gib_seconds bigint CHECK (max_kv_gib_seconds > 0);
