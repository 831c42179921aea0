-- A tenant's reserved floor: the share of each model pool's KV cache kept
-- free for it until it uses it, in basis points (3000 = 30%). Written by
-- billing-api's tenant administration (enterprise tenants only), read by
-- the gateways' routers (fleet::pool).
ALTER TABLE tenants ADD COLUMN reserved_floor_bp integer
    CHECK (reserved_floor_bp BETWEEN 1 AND 10000);
