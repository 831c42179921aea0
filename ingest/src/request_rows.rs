//! request_log rows: the one multi-row insert per batch and the stored
//! rows of ids that were already there.
//!
//! The rows go in as one array of the composite type `ingest_request_row`
//! (`SELECT r.* FROM unnest($1::ingest_request_row[]) r`): one parameter,
//! taken apart row by row. Postgres takes 27 separate column arrays
//! (`UNNEST($1, …, $27)`, the earlier path in [`crate::unnest_path`])
//! apart by materializing each array on its own first: taking 5,000 rows
//! apart cost 14–25 ms that way against 1–5 ms as one composite array on
//! the dev stack's Postgres (a loaded 2-core machine).
//!
//! Re-sends are rare, so a batch is first inserted with a plain INSERT under
//! a savepoint: in Postgres that costs a third of `ON CONFLICT DO NOTHING
//! RETURNING` (no speculative insertion, no returned rows; measured on
//! 10,000-row batches). If any id is already stored the unique index
//! refuses the whole statement, the savepoint is rolled back, and the batch
//! goes in the careful way, which says which ids were inserted. Either way
//! the same rows end up stored, so correctness never depends on the guess;
//! after a batch that met a re-send, the next one goes the careful way at
//! once rather than paying for a refused attempt again.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::PgRecordEncoder;
use sqlx::postgres::{PgArgumentBuffer, PgArguments, PgHasArrayType, PgTypeInfo};
use sqlx::query::Query;
use sqlx::{Encode, PgConnection, Postgres, Row, Type};
use usage_contract::StoredRequest;
use uuid::Uuid;

use crate::batch::Candidate;
use crate::unnest_path::{RequestColumns, INSERT_ROWS};
use crate::write_path::WritePath;

/// Which of a batch's ids were inserted.
#[derive(Debug)]
pub(crate) enum Inserted {
    /// Every row given.
    All,
    /// These ids; the others were stored already.
    Only(HashSet<Uuid>),
}

impl Inserted {
    pub(crate) fn contains(&self, id: &Uuid) -> bool {
        match self {
            Self::All => true,
            Self::Only(ids) => ids.contains(id),
        }
    }
}

/// Whether the last batch met an id that was stored already (a hint for
/// the next batch's first attempt; any value is correct).
static MET_RESEND: AtomicBool = AtomicBool::new(false);

/// Postgres' unique_violation.
const UNIQUE_VIOLATION: &str = "23505";

/// The request_log columns ingest writes, in `ingest_request_row`'s order.
const COLUMNS: &str = "request_id, tenant_id, api_key_id, model, model_version, priority,
     started_at, first_token_at, finished_at, prompt_tokens, cached_tokens, completion_tokens,
     gpu_seconds, preempted_gpu_seconds, finish_reason, ttft_ms, tpot_ms, replica_id,
     gateway_id, stream, content_hash, kafka_partition, kafka_offset, pool, dedicated_to,
     queue_wait_ms, preemptions";

/// Appended to an insert to say which ids went in.
const CAREFUL: &str = " ON CONFLICT (request_id) DO NOTHING RETURNING request_id";

/// Inserts the batch's rows (ids unique within `rows`) and says which went in.
pub(crate) async fn insert_request_rows(
    conn: &mut PgConnection,
    rows: &[Candidate],
    path: WritePath,
) -> Result<Inserted, sqlx::Error> {
    if rows.is_empty() {
        return Ok(Inserted::All);
    }
    let bound = match path {
        WritePath::Rows => Bound::Rows(rows.iter().map(RequestRow).collect()),
        WritePath::Unnest => Bound::Columns(Box::new(RequestColumns::of(rows))),
    };
    let statement = bound.statement();
    if !MET_RESEND.load(Ordering::Relaxed) {
        sqlx::query("SAVEPOINT plain_insert")
            .execute(&mut *conn)
            .await?;
        match bound.query(&statement).execute(&mut *conn).await {
            Ok(_) => {
                // The savepoint may stay open until the commit, which
                // commits it too: releasing it now would cost a round trip.
                if path == WritePath::Unnest {
                    sqlx::query("RELEASE SAVEPOINT plain_insert")
                        .execute(&mut *conn)
                        .await?;
                }
                return Ok(Inserted::All);
            }
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(UNIQUE_VIOLATION) => {
                sqlx::query("ROLLBACK TO SAVEPOINT plain_insert")
                    .execute(&mut *conn)
                    .await?;
            }
            Err(e) => return Err(e),
        }
    }
    let careful = format!("{statement}{CAREFUL}");
    let ids = bound
        .query(&careful)
        .fetch_all(conn)
        .await?
        .iter()
        .map(|row| row.try_get::<Uuid, _>(0))
        .collect::<Result<HashSet<_>, _>>()?;
    MET_RESEND.store(ids.len() < rows.len(), Ordering::Relaxed);
    Ok(Inserted::Only(ids))
}

/// A batch's rows as `path` sends them.
enum Bound<'a> {
    Rows(Vec<RequestRow<'a>>),
    Columns(Box<RequestColumns<'a>>),
}

impl Bound<'_> {
    fn statement(&self) -> String {
        match self {
            Self::Rows(_) => format!(
                "INSERT INTO request_log ({COLUMNS})
                 SELECT r.* FROM unnest($1::ingest_request_row[]) r"
            ),
            Self::Columns(_) => INSERT_ROWS.to_owned(),
        }
    }

    fn query<'q>(&'q self, sql: &'q str) -> Query<'q, Postgres, PgArguments> {
        let q = sqlx::query(sql);
        match self {
            Self::Rows(rows) => q.bind(&rows[..]),
            Self::Columns(columns) => columns.bind(q),
        }
    }
}

/// One request_log row as the composite type `ingest_request_row` (see
/// its migration), encoded straight from the candidate.
struct RequestRow<'a>(&'a Candidate);

impl Type<Postgres> for RequestRow<'_> {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_name("ingest_request_row")
    }
}

impl PgHasArrayType for RequestRow<'_> {
    fn array_type_info() -> PgTypeInfo {
        PgTypeInfo::array_of("ingest_request_row")
    }
}

impl Encode<'_, Postgres> for RequestRow<'_> {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        let (c, e) = (self.0, &self.0.event);
        let p = e.placement.as_ref();
        let mut row = PgRecordEncoder::new(buf);
        row.encode(e.request_id.as_uuid())?
            .encode(e.tenant_id.as_str())?
            .encode(e.api_key_id.as_str())?
            .encode(e.model.as_str())?
            .encode(e.model_version.as_str())?
            .encode(e.priority)?
            .encode(e.started_at)?
            .encode(e.first_token_at)?
            .encode(e.finished_at)?
            .encode(e.prompt_tokens)?
            .encode(e.cached_tokens)?
            .encode(e.completion_tokens)?
            .encode(e.gpu_seconds)?
            .encode(e.preempted_gpu_seconds)?
            .encode(e.finish_reason.as_str())?
            .encode(e.ttft_ms)?
            .encode(e.tpot_ms)?
            .encode(e.replica_id.as_str())?
            .encode(e.gateway_id.as_str())?
            .encode(e.stream)?
            .encode(c.hash.as_slice())?
            .encode(c.partition)?
            .encode(c.offset)?
            .encode(p.map(|p| p.pool.as_str()))?
            .encode(p.and_then(|p| p.dedicated_to.as_deref()))?
            .encode(p.map(|p| p.queue_wait_ms))?
            .encode(p.map(|p| p.preemptions))?;
        row.finish();
        Ok(IsNull::No)
    }
}

/// The stored row of each id, content hash included. Turning a row back
/// into its event ([`StoredRequest::to_event`]) is left to the caller, who
/// needs it only for conflicts.
pub(crate) async fn stored_rows(
    conn: &mut PgConnection,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, StoredRequest>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<StoredRequest> = sqlx::query_as(
        "SELECT request_id, tenant_id, api_key_id, model, model_version, priority,
                started_at, first_token_at, finished_at, prompt_tokens, cached_tokens,
                completion_tokens, gpu_seconds, preempted_gpu_seconds, finish_reason,
                ttft_ms, tpot_ms, replica_id, gateway_id, stream, pool, dedicated_to,
                queue_wait_ms, preemptions, content_hash
         FROM request_log WHERE request_id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.request_id, r)).collect())
}
