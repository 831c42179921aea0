-- A conflict's stored_version is the version already in request_log as the
-- contract's canonical JSON: usage_contract's serializer, the one the gateway
-- publishes with (its key order, GPU-seconds as decimal strings such as
-- "0.508740", never JSON numbers), rebuilt from the row by the contract's one
-- conversion (StoredRequest::to_event). It is kept as text: jsonb would
-- reorder the keys, and a JSON reader would take the decimals for floats.
--
-- Rows written before this migration held jsonb in one of two shapes (the
-- event's fields in jsonb's key order, or the request_log row itself with
-- GPU-seconds as JSON numbers); they are kept as they were, renamed
-- stored_version_jsonb, and stored_version is NULL for them.
ALTER TABLE dead_letters RENAME COLUMN stored_version TO stored_version_jsonb;
ALTER TABLE dead_letters ADD COLUMN stored_version text;
COMMENT ON COLUMN dead_letters.stored_version IS
    'conflicts: the stored version as the contract''s canonical JSON text';
COMMENT ON COLUMN dead_letters.stored_version_jsonb IS
    'conflicts dead-lettered before 2026-12-01: the stored version as jsonb (not canonical; GPU-seconds may be JSON numbers)';
