//! A fresh database and topic per test — on the shared Postgres and broker,
//! or on private ones for a test that crashes them — all dropped when the
//! test ends (the dev stack's handles).

use std::collections::HashMap;
use std::time::Duration;

use devstack::{Database, PrivateBroker, PrivatePostgres, Topic};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use sqlx::PgPool;

/// Which dependencies a test gets of its own (to kill or restart them).
#[derive(Debug, Default, Clone, Copy)]
pub struct Private {
    /// A broker of the test's own ([`TestStack::broker`]).
    pub broker: bool,
    /// A Postgres cluster of the test's own ([`TestStack::postgres`]); a
    /// private broker then keeps its log there too.
    pub postgres: bool,
}

pub struct TestStack {
    pub database_url: String,
    pub brokers: String,
    pub topic: String,
    pub group: String,
    pub pool: PgPool,
    pub dir: tempfile::TempDir,
    // Dropped in this order: the topic while its broker runs, the database
    // while its server runs, then the private servers.
    _topic: Option<Topic>,
    _database: Database,
    broker: Option<PrivateBroker>,
    postgres: Option<PrivatePostgres>,
}

/// A new, migrated database `mt_<name>_<random>` on the shared Postgres,
/// dropped with the handle.
pub async fn fresh_database(name: &str) -> Database {
    Database::fresh(name)
        .await
        .unwrap_or_else(|e| panic!("fresh database {name}: {e}"))
}

impl TestStack {
    /// A fresh database and a 4-partition topic on the shared services.
    pub async fn new(name: &str) -> Self {
        Self::with(name, Private::default()).await
    }

    /// A fresh database and a 4-partition topic, on private instances
    /// where `private` says so.
    pub async fn with(name: &str, private: Private) -> Self {
        let postgres = match private.postgres {
            true => Some(
                PrivatePostgres::start(&[])
                    .await
                    .unwrap_or_else(|e| panic!("{e}")),
            ),
            false => None,
        };
        let server = postgres
            .as_ref()
            .map_or_else(devstack::postgres::shared_url, |pg| pg.url("postgres"));
        let database = Database::fresh_on(&server, name)
            .await
            .unwrap_or_else(|e| panic!("fresh database {name}: {e}"));
        let broker = match private.broker {
            true => Some(
                PrivateBroker::start_on(&server)
                    .await
                    .unwrap_or_else(|e| panic!("{e}")),
            ),
            false => None,
        };
        let brokers = broker
            .as_ref()
            .map_or_else(devstack::topic::shared_brokers, PrivateBroker::brokers);
        let prefix = format!("usage.events.v1.{name}");
        let (topic, handle) = if broker.is_some() {
            // Gone with the private broker's storage; no delete needed.
            let name = format!("{prefix}.{}", devstack::database::unique_suffix());
            devstack::topic::create(&brokers, &name, 4)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            (name, None)
        } else {
            let t = Topic::fresh(&brokers, &prefix, 4)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            (t.name.clone(), Some(t))
        };
        Self {
            database_url: database.url.clone(),
            brokers,
            group: format!("ingest-{name}-{}", devstack::database::unique_suffix()),
            topic,
            pool: database.pool.clone(),
            dir: tempfile::tempdir().expect("tempdir"),
            _topic: handle,
            _database: database,
            broker,
            postgres,
        }
    }

    /// The test's private broker (see [`Private`]).
    pub fn broker(&mut self) -> &mut PrivateBroker {
        self.broker
            .as_mut()
            .expect("this TestStack has no private broker: use TestStack::with(.., Private { broker: true, .. })")
    }

    /// The test's private Postgres (see [`Private`]).
    pub fn postgres(&mut self) -> &mut PrivatePostgres {
        self.postgres
            .as_mut()
            .expect("this TestStack has no private Postgres: use TestStack::with(.., Private { postgres: true, .. })")
    }

    /// The one number `sql` selects (a `count(*)`, a `sum(…)::bigint`).
    pub async fn count(&self, sql: &str) -> i64 {
        sqlx::query_as::<_, (i64,)>(sql)
            .fetch_one(&self.pool)
            .await
            .expect("count query")
            .0
    }

    /// The decimal `sql` selects (a sum; none is 0).
    pub async fn decimal(&self, sql: &str) -> rust_decimal::Decimal {
        sqlx::query_as::<_, (Option<rust_decimal::Decimal>,)>(sql)
            .fetch_one(&self.pool)
            .await
            .expect("decimal query")
            .0
            .unwrap_or_default()
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
            // Gateways of one test share their limits, never another test's.
            ("GATEWAY_REDIS_PREFIX".into(), self.redis_prefix()),
        ])
    }

    /// The Redis key prefix of this test's gateways.
    pub fn redis_prefix(&self) -> String {
        format!("{}:", self.topic)
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
