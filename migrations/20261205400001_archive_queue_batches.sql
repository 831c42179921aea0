-- The archive queue holds one row per statement that inserted into
-- request_log (an ingest batch, a re-drive), with that statement's ids,
-- instead of one row per request.
--
-- One row per request cost ingest a heap row and an index entry per request
-- (a fifth of its batch transaction) and left as many dead rows behind
-- when the archiver took them off: with autovacuum off, 2 million dead rows
-- on the demo, which every poll of the queue walked. One row per statement
-- costs one row (its ids kept out of line) and leaves one dead row per
-- batch. The rule is unchanged: every row inserted into request_log enters
-- the queue in the same statement, through the trigger, so no writer can
-- forget it; the archiver takes whole queue rows off in the transaction
-- that lists their files.
CREATE TABLE archive_queue_batches (
    batch_id    bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The statement's smallest and largest request id, and how many.
    first_id    uuid NOT NULL,
    last_id     uuid NOT NULL,
    ids         integer NOT NULL CHECK (ids > 0),
    -- Ascending and distinct (request_log's primary key).
    request_ids uuid[] NOT NULL CHECK (cardinality(request_ids) = ids),
    CHECK (first_id <= last_id)
);
-- Stored out of line uncompressed: ids after their time prefix do not
-- compress, and the archiver reads them whole.
ALTER TABLE archive_queue_batches ALTER COLUMN request_ids SET STORAGE EXTERNAL;

CREATE OR REPLACE FUNCTION archive_queue_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO archive_queue_batches (first_id, last_id, ids, request_ids)
    SELECT a[1], a[cardinality(a)], cardinality(a), a
    FROM (SELECT array_agg(request_id ORDER BY request_id) AS a FROM inserted_rows) s
    WHERE a IS NOT NULL;
    RETURN NULL;
END
$$;

-- What is queued now moves over, 10,000 ids a row, in id order.
INSERT INTO archive_queue_batches (first_id, last_id, ids, request_ids)
SELECT a[1], a[cardinality(a)], cardinality(a), a
FROM (
    SELECT array_agg(request_id ORDER BY request_id) AS a
    FROM (SELECT request_id, (row_number() OVER (ORDER BY request_id) - 1) / 10000 AS chunk
          FROM archive_queue) q
    GROUP BY chunk
    ORDER BY chunk
) s;
DROP TABLE archive_queue;

-- Every queued request id, one row each: what readers ask (retention,
-- reconcile, the archive's verify, the audit).
CREATE VIEW archive_queue AS
    SELECT unnest(request_ids) AS request_id FROM archive_queue_batches;

-- Takes one request_log day's ids off the queue (retention in a deployment
-- without an archiver, as it drops the day).
CREATE FUNCTION archive_queue_forget_day(day date) RETURNS void
LANGUAGE sql AS $$
    WITH touched AS (
        SELECT b.batch_id,
               (SELECT array_agg(x ORDER BY x) FROM unnest(b.request_ids) x
                WHERE x < request_log_bound(day) OR x >= request_log_bound(day + 1)) AS kept
        FROM archive_queue_batches b
        WHERE b.last_id >= request_log_bound(day) AND b.first_id < request_log_bound(day + 1)
    ), emptied AS (
        DELETE FROM archive_queue_batches b USING touched t
        WHERE b.batch_id = t.batch_id AND t.kept IS NULL
    )
    UPDATE archive_queue_batches b
    SET request_ids = t.kept, first_id = t.kept[1], last_id = t.kept[cardinality(t.kept)],
        ids = cardinality(t.kept)
    FROM touched t
    WHERE b.batch_id = t.batch_id AND t.kept IS NOT NULL;
$$;
