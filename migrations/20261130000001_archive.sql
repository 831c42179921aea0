-- The Parquet archive of the usage topic (ingest's archiver) and the
-- retention barrier that keeps rollup from dropping a request_log day the
-- archive has not covered yet.

-- Where each archiver group is in each partition: the next offset it will
-- archive. A separate table from ingest's consumer_offsets (the archiver
-- is its own consumer group and moves at its own pace). Moved only by
-- compare-and-set, in the transaction that commits the manifest rows.
CREATE TABLE archive_offsets (
    consumer_group  text NOT NULL,
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    next_offset     bigint NOT NULL CHECK (next_offset >= 0),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, topic, kafka_partition)
);

-- Every committed file of the archive. A batch covers, per partition, one
-- offset range [first_offset, last_offset]; its valid events are written one
-- file per UTC hour they started in, all named by that range
-- (`date=YYYY-MM-DD/hour=HH/<topic>-p<partition>-o<first>-<last>.parquet`,
-- relative to the archive's root). Per (group, topic, partition) the
-- distinct ranges follow each other with no gap and no overlap, up to
-- next_offset - 1 in archive_offsets. A range of only undecodable or
-- invalid messages gets one row without a file (path, day, hour NULL);
-- `skipped` is counted on one row of its range. A file is part of the
-- archive only once its row is here: files in the store without a row are
-- orphans of an interrupted batch.
CREATE TABLE archive_manifest (
    manifest_id     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group  text NOT NULL,
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    first_offset    bigint NOT NULL CHECK (first_offset >= 0),
    last_offset     bigint NOT NULL,
    path            text UNIQUE,
    -- The UTC date and hour every row of the file started in.
    day             date,
    hour            smallint CHECK (hour BETWEEN 0 AND 23),
    -- Valid events in the file, and messages in the range that were skipped.
    rows            bigint NOT NULL CHECK (rows >= 0),
    skipped         bigint NOT NULL CHECK (skipped >= 0),
    bytes           bigint NOT NULL CHECK (bytes >= 0),
    sha256          bytea CHECK (length(sha256) = 32),
    committed_at    timestamptz NOT NULL DEFAULT now(),
    CHECK (last_offset >= first_offset),
    CHECK ((path IS NULL) = (rows = 0)),
    CHECK ((path IS NULL) = (day IS NULL) AND (path IS NULL) = (hour IS NULL)
           AND (path IS NULL) = (sha256 IS NULL))
);
CREATE INDEX archive_manifest_range ON archive_manifest (consumer_group, topic, kafka_partition, first_offset);
CREATE INDEX archive_manifest_day ON archive_manifest (day, hour) WHERE path IS NOT NULL;

-- Retention's two-phase barrier. When a request_log day first becomes due
-- for dropping, rollup records ingest's stored offsets (per topic and
-- partition, the highest over ingest's groups) as that day's barrier: every
-- request_log row of the day that existed then was ingested from an offset
-- below it. The day is dropped only once the archive's offset of every
-- partition has reached its barrier.
CREATE TABLE retention_barrier_days (
    day          date PRIMARY KEY,
    recorded_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE retention_barriers (
    day             date NOT NULL REFERENCES retention_barrier_days (day) ON DELETE CASCADE,
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    next_offset     bigint NOT NULL CHECK (next_offset >= 0),
    PRIMARY KEY (day, topic, kafka_partition)
);
