-- The archive follows what ingest committed: one row per billed request.
--
-- Every row inserted into request_log (by ingest, by a re-drive, by anything
-- else) enters archive_queue in the same statement, through a trigger, so no
-- writer can forget it. The archiver writes queued rows to Parquet files,
-- then in one transaction deletes exactly those ids from the queue and adds
-- the files to archive_manifest: a row is in the queue or in exactly one
-- live file, never both, never neither. Re-sends, conflicts, unknown tenants
-- and beyond-retention events never reach request_log, so never the archive.

CREATE TABLE archive_queue (
    request_id uuid PRIMARY KEY
);

CREATE FUNCTION archive_queue_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO archive_queue (request_id) SELECT request_id FROM inserted_rows;
    RETURN NULL;
END
$$;

CREATE TRIGGER request_log_archive_queue AFTER INSERT ON request_log
    REFERENCING NEW TABLE AS inserted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION archive_queue_inserted();

-- What request_log holds now is archived from it.
INSERT INTO archive_queue (request_id) SELECT request_id FROM request_log;

-- The archive of before (one row per topic message, re-sends and conflicts
-- included) is kept under its own names and read by nothing.
ALTER TABLE archive_manifest RENAME TO archive_log_manifest;
ALTER INDEX archive_manifest_pkey RENAME TO archive_log_manifest_pkey;
ALTER INDEX archive_manifest_path_key RENAME TO archive_log_manifest_path_key;
ALTER INDEX archive_manifest_range RENAME TO archive_log_manifest_range;
ALTER INDEX archive_manifest_day RENAME TO archive_log_manifest_day;
ALTER TABLE archive_offsets RENAME TO archive_log_offsets;
ALTER INDEX archive_offsets_pkey RENAME TO archive_log_offsets_pkey;
-- Retention's barrier is the queue now (a day is dropped once none of its
-- ids is queued); the offset barriers are gone.
DROP TABLE retention_barriers;
DROP TABLE retention_barrier_days;

-- Every file of the archive, live or retired. A file holds requests of one
-- UTC hour of their request id's time (`day`, `hour`): request_log's
-- partitioning, so lookup, retention and the archive agree on where a
-- request lives. Batch files (level 0) hold one batch's rows of the hour;
-- compaction merges an hour's files into one or a few (level 1). Readers
-- list the live files (retired_at IS NULL) in one statement: compaction
-- retires the files it merged and adds the merged ones in one transaction,
-- so a listing sees every row once. Retired files are deleted by gc only
-- after a grace period.
CREATE TABLE archive_manifest (
    file_id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    path            text NOT NULL UNIQUE,
    day             date NOT NULL,
    hour            smallint NOT NULL CHECK (hour BETWEEN 0 AND 23),
    -- 0: written by the archiver from the queue; 1: written by compaction.
    level           smallint NOT NULL CHECK (level IN (0, 1)),
    min_request_id  uuid NOT NULL,
    max_request_id  uuid NOT NULL,
    rows            bigint NOT NULL CHECK (rows > 0),
    bytes           bigint NOT NULL CHECK (bytes > 0),
    sha256          bytea NOT NULL CHECK (length(sha256) = 32),
    committed_at    timestamptz NOT NULL DEFAULT now(),
    retired_at      timestamptz,
    -- The compaction that retired it (the first file_id that compaction added).
    replaced_by     bigint,
    CHECK (min_request_id <= max_request_id),
    CHECK ((retired_at IS NULL) = (replaced_by IS NULL))
);
CREATE INDEX archive_manifest_live ON archive_manifest (day, hour, min_request_id)
    WHERE retired_at IS NULL;
CREATE INDEX archive_manifest_retired ON archive_manifest (retired_at)
    WHERE retired_at IS NOT NULL;
