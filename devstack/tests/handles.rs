#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
//! The dev stack's handles against the real shared Postgres and broker
//! (`scripts/stack.sh up` first): what a run creates is gone when its
//! handle is dropped, and a private Postgres survives a SIGKILL of its
//! whole process group with its committed data.

use devstack::{Database, PrivatePostgres, Topic};
use sqlx::ConnectOptions;

async fn database_exists(name: &str) -> bool {
    let options: sqlx::postgres::PgConnectOptions =
        devstack::postgres::shared_url().parse().unwrap();
    let mut admin = options.database("postgres").connect().await.unwrap();
    sqlx::query_as::<_, (i32,)>("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(name)
        .fetch_optional(&mut admin)
        .await
        .unwrap()
        .is_some()
}

#[tokio::test]
async fn a_fresh_database_is_migrated_and_dropped_with_its_handle_even_while_in_use() {
    let db = Database::fresh("handles").await.unwrap();
    let name = db.name().to_owned();
    assert!(name.starts_with("mt_handles_"), "{name}");
    let (tenants,): (i64,) = sqlx::query_as("SELECT count(*) FROM tenants")
        .fetch_one(&db.pool)
        .await
        .expect("the migrations are applied");
    assert_eq!(tenants, 0);
    // A connection a service would still hold does not keep it alive.
    let held = db.pool.acquire().await.unwrap();
    assert!(database_exists(&name).await);
    drop(db);
    assert!(!database_exists(&name).await, "{name} outlived its handle");
    drop(held);
}

#[tokio::test]
async fn a_fresh_topic_is_deleted_with_its_handle() {
    let brokers = devstack::topic::shared_brokers();
    let topic = Topic::fresh(&brokers, "handles", 2).await.unwrap();
    let name = topic.name.clone();
    assert_eq!(devstack::topic::partitions(&brokers, &name).await, Some(2));
    drop(topic);
    assert_eq!(
        devstack::topic::partitions(&brokers, &name).await,
        None,
        "{name} outlived its handle"
    );
}

#[tokio::test]
async fn a_private_postgres_comes_back_after_a_sigkill_with_what_it_committed() {
    let mut pg = PrivatePostgres::start(&[]).await.unwrap();
    let db = pg.migrated_database("crash").await.unwrap();
    sqlx::query(
        "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode)
         VALUES ('acme-corp', 'Acme', 'enterprise', 5, 'per_token')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    pg.kill_all().await;
    let direct: sqlx::postgres::PgConnectOptions = pg.url("postgres").parse().unwrap();
    assert!(direct.connect().await.is_err(), "the server is gone");
    pg.restart().await.unwrap();
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM tenants")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(n, 1, "the committed row survived the crash");
}
