//! A fresh database and topic per test, on the real Postgres and broker.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgPool};

pub struct TestStack {
    pub database_url: String,
    pub brokers: String,
    pub topic: String,
    pub group: String,
    pub pool: PgPool,
    pub dir: tempfile::TempDir,
}

fn base_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/meterline".into())
}

fn unique_suffix() -> String {
    let s = uuid::Uuid::now_v7().simple().to_string();
    s[s.len() - 10..].to_owned()
}

/// A new, migrated database `mt_<name>_<random>`: its URL and a pool.
pub async fn fresh_database(name: &str) -> (String, PgPool) {
    let db = format!("mt_{name}_{}", unique_suffix());
    let base: PgConnectOptions = base_url().parse().expect("DATABASE_URL");
    let mut admin = base.clone().database("postgres").connect().await.expect(
        "cannot reach Postgres: start the stack with scripts/stack.sh up or set DATABASE_URL",
    );
    sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(&mut admin)
        .await
        .expect("create test database");
    let database_url = base.database(&db).to_url_lossy().to_string();
    let pool = schema_pool(&database_url).await;
    (database_url, pool)
}

impl TestStack {
    /// Creates a fresh database (see [`fresh_database`]) and a 4-partition topic.
    pub async fn new(name: &str) -> Self {
        let suffix = unique_suffix();
        let (database_url, pool) = fresh_database(name).await;
        let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
        let topic = format!("usage.events.v1.{name}.{suffix}");
        usage_contract::topic::create(&brokers, &topic, 4)
            .await
            .expect("create the test topic");
        Self {
            database_url,
            brokers,
            group: format!("ingest-{name}-{suffix}"),
            topic,
            pool,
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// The one number `sql` selects (a `count(*)`, a `sum(…)::bigint`).
    pub async fn count(&self, sql: &str) -> i64 {
        sqlx::query_as::<_, (i64,)>(sql)
            .fetch_one(&self.pool)
            .await
            .expect("count query")
            .0
    }

    /// Polls `sql` until it selects `expected`; fails after `within` with
    /// `service`'s log.
    pub async fn wait_count(
        &self,
        sql: &str,
        expected: i64,
        service: &crate::Service,
        within: Duration,
    ) {
        let deadline = tokio::time::Instant::now() + within;
        while self.count(sql).await != expected {
            assert!(
                tokio::time::Instant::now() < deadline,
                "`{sql}` never reached {expected}:\n{}",
                service.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Environment shared by every service of this test.
    pub fn env(&self) -> HashMap<String, String> {
        HashMap::from([
            ("DATABASE_URL".into(), self.database_url.clone()),
            ("KAFKA_BROKERS".into(), self.brokers.clone()),
            ("INGEST_TOPIC".into(), self.topic.clone()),
            ("GATEWAY_TOPIC".into(), self.topic.clone()),
            ("INGEST_GROUP".into(), self.group.clone()),
        ])
    }

    /// A plain producer for tests that write the topic themselves.
    pub fn producer(&self) -> FutureProducer {
        ClientConfig::new()
            .set("bootstrap.servers", &self.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .create()
            .expect("producer")
    }

    /// Produces every payload (keyed) and waits for all acknowledgements.
    pub async fn produce(&self, producer: &FutureProducer, messages: &[(String, Vec<u8>)]) {
        self.produce_tracked(producer, messages).await;
    }

    /// Produces every payload (keyed), waits for all acknowledgements, and
    /// returns where each message landed: its (partition, offset), in order.
    pub async fn produce_tracked(
        &self,
        producer: &FutureProducer,
        messages: &[(String, Vec<u8>)],
    ) -> Vec<(i32, i64)> {
        let mut pending = Vec::with_capacity(messages.len());
        for (key, payload) in messages {
            loop {
                let record = FutureRecord::to(&self.topic).key(key).payload(payload);
                match producer.send_result(record) {
                    Ok(f) => {
                        pending.push(f);
                        break;
                    }
                    Err((e, _)) => {
                        assert!(
                            matches!(
                                e,
                                rdkafka::error::KafkaError::MessageProduction(
                                    rdkafka::types::RDKafkaErrorCode::QueueFull
                                )
                            ),
                            "produce failed: {e}"
                        );
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }
        let mut landed = Vec::with_capacity(pending.len());
        for f in pending {
            let d = f.await.expect("delivery").expect("delivered");
            landed.push((d.partition, d.offset));
        }
        landed
    }
}

async fn schema_pool(url: &str) -> PgPool {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(url)
        .await
        .expect("connect test database");
    // The same migrations every service applies at start-up.
    sqlx::migrate!("../migrations")
        .run(&pool)
        .await
        .expect("migrate");
    pool
}
