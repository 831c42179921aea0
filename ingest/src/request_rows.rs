//! request_log rows: the one multi-row insert per batch (UNNEST over
//! column arrays) and the stored rows of ids that were already there.
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

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgConnection, Postgres, Row};
use usage_contract::StoredRequest;
use uuid::Uuid;

use crate::batch::Candidate;

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

type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

/// Postgres' unique_violation.
const UNIQUE_VIOLATION: &str = "23505";

const INSERT_ROWS: &str = "INSERT INTO request_log (request_id, tenant_id, api_key_id, model,
     model_version, priority, started_at, first_token_at, finished_at, prompt_tokens,
     cached_tokens, completion_tokens, gpu_seconds, preempted_gpu_seconds, finish_reason,
     ttft_ms, tpot_ms, replica_id, gateway_id, stream, content_hash, kafka_partition,
     kafka_offset, pool, dedicated_to, queue_wait_ms, preemptions)
 SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[],
     $6::smallint[], $7::timestamptz[], $8::timestamptz[], $9::timestamptz[],
     $10::bigint[], $11::bigint[], $12::bigint[], $13::numeric[], $14::numeric[],
     $15::text[], $16::bigint[], $17::bigint[], $18::text[], $19::text[],
     $20::boolean[], $21::bytea[], $22::integer[], $23::bigint[], $24::text[],
     $25::text[], $26::bigint[], $27::bigint[])";

/// Inserts the batch's rows (ids unique within `rows`) and says which went in.
pub(crate) async fn insert_request_rows(
    conn: &mut PgConnection,
    rows: &[Candidate],
) -> Result<Inserted, sqlx::Error> {
    if rows.is_empty() {
        return Ok(Inserted::All);
    }
    let cols = RequestColumns::of(rows);
    if !MET_RESEND.load(Ordering::Relaxed) {
        sqlx::query("SAVEPOINT plain_insert")
            .execute(&mut *conn)
            .await?;
        match cols
            .bind(sqlx::query(INSERT_ROWS))
            .execute(&mut *conn)
            .await
        {
            Ok(_) => {
                sqlx::query("RELEASE SAVEPOINT plain_insert")
                    .execute(&mut *conn)
                    .await?;
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
    let careful = format!("{INSERT_ROWS} ON CONFLICT (request_id) DO NOTHING RETURNING request_id");
    let ids = cols
        .bind(sqlx::query(&careful))
        .fetch_all(conn)
        .await?
        .iter()
        .map(|row| row.try_get::<Uuid, _>(0))
        .collect::<Result<HashSet<_>, _>>()?;
    MET_RESEND.store(ids.len() < rows.len(), Ordering::Relaxed);
    Ok(Inserted::Only(ids))
}

/// Column-wise arrays for UNNEST.
#[derive(Default)]
struct RequestColumns<'a> {
    request_id: Vec<Uuid>,
    tenant_id: Vec<&'a str>,
    api_key_id: Vec<&'a str>,
    model: Vec<&'a str>,
    model_version: Vec<&'a str>,
    priority: Vec<i16>,
    started_at: Vec<DateTime<Utc>>,
    first_token_at: Vec<Option<DateTime<Utc>>>,
    finished_at: Vec<DateTime<Utc>>,
    prompt_tokens: Vec<i64>,
    cached_tokens: Vec<i64>,
    completion_tokens: Vec<i64>,
    gpu_seconds: Vec<Decimal>,
    preempted_gpu_seconds: Vec<Decimal>,
    finish_reason: Vec<&'static str>,
    ttft_ms: Vec<Option<i64>>,
    tpot_ms: Vec<Option<i64>>,
    replica_id: Vec<&'a str>,
    gateway_id: Vec<&'a str>,
    stream: Vec<bool>,
    content_hash: Vec<&'a [u8]>,
    kafka_partition: Vec<i32>,
    kafka_offset: Vec<i64>,
    pool: Vec<Option<&'a str>>,
    dedicated_to: Vec<Option<&'a str>>,
    queue_wait_ms: Vec<Option<i64>>,
    preemptions: Vec<Option<i64>>,
}

impl<'a> RequestColumns<'a> {
    fn of(rows: &'a [Candidate]) -> Self {
        let mut cols = Self {
            request_id: Vec::with_capacity(rows.len()),
            started_at: Vec::with_capacity(rows.len()),
            ..Self::default()
        };
        for c in rows {
            cols.push(c);
        }
        cols
    }

    /// Binds the columns as `$1` … `$27`, in [`INSERT_ROWS`]' order.
    fn bind<'q>(&'q self, q: PgQuery<'q>) -> PgQuery<'q> {
        q.bind(&self.request_id[..])
            .bind(&self.tenant_id[..])
            .bind(&self.api_key_id[..])
            .bind(&self.model[..])
            .bind(&self.model_version[..])
            .bind(&self.priority[..])
            .bind(&self.started_at[..])
            .bind(&self.first_token_at[..])
            .bind(&self.finished_at[..])
            .bind(&self.prompt_tokens[..])
            .bind(&self.cached_tokens[..])
            .bind(&self.completion_tokens[..])
            .bind(&self.gpu_seconds[..])
            .bind(&self.preempted_gpu_seconds[..])
            .bind(&self.finish_reason[..])
            .bind(&self.ttft_ms[..])
            .bind(&self.tpot_ms[..])
            .bind(&self.replica_id[..])
            .bind(&self.gateway_id[..])
            .bind(&self.stream[..])
            .bind(&self.content_hash[..])
            .bind(&self.kafka_partition[..])
            .bind(&self.kafka_offset[..])
            .bind(&self.pool[..])
            .bind(&self.dedicated_to[..])
            .bind(&self.queue_wait_ms[..])
            .bind(&self.preemptions[..])
    }

    fn push(&mut self, c: &'a Candidate) {
        let e = &c.event;
        self.request_id.push(e.request_id.as_uuid());
        self.tenant_id.push(&e.tenant_id);
        self.api_key_id.push(&e.api_key_id);
        self.model.push(&e.model);
        self.model_version.push(&e.model_version);
        self.priority.push(e.priority);
        self.started_at.push(e.started_at);
        self.first_token_at.push(e.first_token_at);
        self.finished_at.push(e.finished_at);
        self.prompt_tokens.push(e.prompt_tokens);
        self.cached_tokens.push(e.cached_tokens);
        self.completion_tokens.push(e.completion_tokens);
        self.gpu_seconds.push(e.gpu_seconds);
        self.preempted_gpu_seconds.push(e.preempted_gpu_seconds);
        self.finish_reason.push(e.finish_reason.as_str());
        self.ttft_ms.push(e.ttft_ms);
        self.tpot_ms.push(e.tpot_ms);
        self.replica_id.push(&e.replica_id);
        self.gateway_id.push(&e.gateway_id);
        self.stream.push(e.stream);
        self.content_hash.push(&c.hash);
        self.kafka_partition.push(c.partition);
        self.kafka_offset.push(c.offset);
        let p = e.placement.as_ref();
        self.pool.push(p.map(|p| p.pool.as_str()));
        self.dedicated_to
            .push(p.and_then(|p| p.dedicated_to.as_deref()));
        self.queue_wait_ms.push(p.map(|p| p.queue_wait_ms));
        self.preemptions.push(p.map(|p| p.preemptions));
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
