//! Consumer offsets kept in Postgres, next to the data they cover.
//!
//! The broker's committed offsets are advisory at most: where a consumer
//! starts is what this table says, and the table only moves by
//! compare-and-set inside the batch's own transaction. A consumer whose
//! belief is out of date (a zombie after a rebalance) fails the CAS and its
//! transaction rolls back.

use std::collections::BTreeMap;

use sqlx::{PgConnection, PgPool};

/// Which table holds a group's offsets: ingest's `consumer_offsets`
/// (request_log and usage_hourly). The archiver follows request_log, not
/// the topic, and keeps no offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ledger {
    Ingest,
}

impl Ledger {
    fn table(self) -> &'static str {
        match self {
            Self::Ingest => "consumer_offsets",
        }
    }
}

/// Whose offsets: a consumer group reading a topic.
#[derive(Debug, Clone)]
pub struct ConsumerKey {
    pub group: String,
    pub topic: String,
}

/// What a compare-and-set found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cas {
    Moved,
    /// The stored offset was not the expected one; this is what it was.
    Stale {
        stored: Option<i64>,
    },
}

/// Moves `partition` from `expected` to `next` in `ledger`. `expected ==
/// None` means "no row yet": the row is created, and only one creator can win.
pub async fn compare_and_set(
    conn: &mut PgConnection,
    ledger: Ledger,
    key: &ConsumerKey,
    partition: i32,
    expected: Option<i64>,
    next: i64,
) -> Result<Cas, sqlx::Error> {
    let table = ledger.table();
    let moved = match expected {
        Some(expected) => sqlx::query(&format!(
            "UPDATE {table} SET next_offset = $4, updated_at = now()
             WHERE consumer_group = $1 AND topic = $2 AND kafka_partition = $3
               AND next_offset = $5"
        ))
        .bind(&key.group)
        .bind(&key.topic)
        .bind(partition)
        .bind(next)
        .bind(expected)
        .execute(&mut *conn)
        .await?
        .rows_affected(),
        None => sqlx::query(&format!(
            "INSERT INTO {table} (consumer_group, topic, kafka_partition, next_offset)
             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING"
        ))
        .bind(&key.group)
        .bind(&key.topic)
        .bind(partition)
        .bind(next)
        .execute(&mut *conn)
        .await?
        .rows_affected(),
    };
    if moved == 1 {
        return Ok(Cas::Moved);
    }
    let stored: Option<(i64,)> = sqlx::query_as(&format!(
        "SELECT next_offset FROM {table}
         WHERE consumer_group = $1 AND topic = $2 AND kafka_partition = $3"
    ))
    .bind(&key.group)
    .bind(&key.topic)
    .bind(partition)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(Cas::Stale {
        stored: stored.map(|(o,)| o),
    })
}

/// Partitions a batch could not move: `done` already stood at the batch's
/// end (it was committed before), `fenced` stood elsewhere (another
/// consumer moved it: this one is a zombie for them).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Unmoved {
    pub done: Vec<i32>,
    pub fenced: Vec<i32>,
}

impl Unmoved {
    pub fn is_empty(&self) -> bool {
        self.done.is_empty() && self.fenced.is_empty()
    }
}

/// Moves every partition of a batch from what this consumer believes
/// (`expected`) to `next_offsets`, inside the batch's transaction; the
/// caller rolls back unless all moved.
pub async fn move_all(
    conn: &mut PgConnection,
    ledger: Ledger,
    key: &ConsumerKey,
    expected: &BTreeMap<i32, Option<i64>>,
    next_offsets: &BTreeMap<i32, i64>,
) -> Result<Unmoved, sqlx::Error> {
    let mut unmoved = Unmoved::default();
    for (&partition, &next) in next_offsets {
        let believed = expected.get(&partition).copied().flatten();
        match compare_and_set(conn, ledger, key, partition, believed, next).await? {
            Cas::Moved => {}
            Cas::Stale { stored } if stored == Some(next) => unmoved.done.push(partition),
            Cas::Stale { .. } => unmoved.fenced.push(partition),
        }
    }
    Ok(unmoved)
}

/// What the stored offsets say of the positions a consumer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldCheck {
    /// The stored next offset of every held partition.
    pub stored: BTreeMap<i32, Option<i64>>,
    /// The partitions whose stored offset is not the held one: Postgres
    /// went back (lost commits, a failover, a restore) or another consumer
    /// moved them. Either way the holder must start again from `stored`.
    pub differing: Vec<i32>,
}

/// Reads the stored offsets of the partitions in `held` and compares them
/// with the held positions.
pub async fn check_held(
    pool: &PgPool,
    ledger: Ledger,
    key: &ConsumerKey,
    held: &BTreeMap<i32, Option<i64>>,
) -> Result<HeldCheck, sqlx::Error> {
    let partitions: Vec<i32> = held.keys().copied().collect();
    let stored = load(pool, ledger, key, &partitions).await?;
    let differing = stored
        .iter()
        .filter(|(p, at)| held.get(p) != Some(at))
        .map(|(p, _)| *p)
        .collect();
    Ok(HeldCheck { stored, differing })
}

/// The stored next offset of each partition in `ledger` (`None`: never committed).
pub async fn load(
    pool: &PgPool,
    ledger: Ledger,
    key: &ConsumerKey,
    partitions: &[i32],
) -> Result<BTreeMap<i32, Option<i64>>, sqlx::Error> {
    let rows: Vec<(i32, i64)> = sqlx::query_as(&format!(
        "SELECT kafka_partition, next_offset FROM {}
         WHERE consumer_group = $1 AND topic = $2 AND kafka_partition = ANY($3)",
        ledger.table()
    ))
    .bind(&key.group)
    .bind(&key.topic)
    .bind(partitions)
    .fetch_all(pool)
    .await?;
    let mut out: BTreeMap<i32, Option<i64>> = partitions.iter().map(|&p| (p, None)).collect();
    for (p, o) in rows {
        out.insert(p, Some(o));
    }
    Ok(out)
}
