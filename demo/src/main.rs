//! The main job (`scripts/demo.sh`): services up, a finalized backfilled
//! month, live traffic from the five reference tenants, and what each used
//! and was billed. `demo stop` stops the services it left running.
//!
//! Layout: [`services`] starts and stops gateway-lite, ingest, the
//! archiver and billing-api (detached, pid files and logs in
//! `.stack/demo/`); [`backfill`] fills and finalizes the month; [`traffic`]
//! drives the live requests; [`client`] is billing-api as the demo reads
//! it; [`report`] prints the tables; [`pages`] the pages' URLs, with a
//! sign-in token per role; [`services`] also the `/metrics` URLs, with the
//! token billing-api's asks for.

#![allow(clippy::print_stdout, reason = "the demo prints its report")]

mod backfill;
mod client;
mod pages;
mod report;
mod services;
mod traffic;

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::bail;
use clap::{Parser, Subcommand};

/// The demo's settings; every one has a working default.
#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The checkout: `config/` holds the tenants and the price book.
    #[arg(long, env = "METERLINE_ROOT", default_value = ".")]
    root: PathBuf,
    /// The services' pid files, logs and the gateway's outbox (default `<root>/.stack/demo`).
    #[arg(long, env = "DEMO_RUN_DIR")]
    run_dir: Option<PathBuf>,
    /// Where the archiver writes Parquet (default `<root>/.stack/archive`).
    #[arg(long, env = "ARCHIVE_URL")]
    archive_url: Option<String>,
    #[arg(long, env = "GATEWAY_ADDR", default_value = "127.0.0.1:8080")]
    gateway_addr: String,
    #[arg(long, env = "BILLING_ADDR", default_value = "127.0.0.1:8082")]
    billing_addr: String,
    #[arg(long, env = "INGEST_METRICS_ADDR", default_value = "127.0.0.1:9101")]
    ingest_metrics_addr: String,
    #[arg(long, env = "ARCHIVE_METRICS_ADDR", default_value = "127.0.0.1:9102")]
    archive_metrics_addr: String,
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/meterline"
    )]
    database_url: String,
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    kafka_brokers: String,
    /// The topic the gateway publishes to and the backfill produces to.
    #[arg(long, env = "GATEWAY_TOPIC", default_value = "usage.events.v1")]
    topic: String,
    #[arg(
        long,
        env = "BILLING_BOOTSTRAP_FINANCE_TOKEN",
        default_value = "demo-finance-token-0001"
    )]
    finance_token: String,
    /// The bearer token billing-api's `/metrics` asks for (the demo prints it).
    #[arg(
        long,
        env = "BILLING_METRICS_TOKEN",
        default_value = "demo-metrics-token-0001"
    )]
    metrics_token: String,
    /// Events in the backfilled month.
    #[arg(long, env = "DEMO_BACKFILL_EVENTS", default_value_t = 2_000_000)]
    backfill_events: u64,
    /// Requests a replica runs at once in the backfilled month, which sets
    /// each request's share of the replica's GPU time (see `workload::fleet`).
    #[arg(long, env = "DEMO_BACKFILL_CONCURRENCY", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    backfill_concurrency: u32,
    /// The sample's seed (the same seed gives the same month).
    #[arg(long, env = "DEMO_SEED", default_value_t = 1)]
    seed: u64,
    /// Seconds of live traffic.
    #[arg(long, env = "DEMO_SECONDS", default_value_t = 10)]
    seconds: u64,
    /// Live traffic runs at the reference rates divided by this.
    #[arg(long, env = "DEMO_RATE_DIVISOR", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    rate_divisor: u32,
    /// `ENGINE_SPEEDUP` of the gateway's simulated engines.
    #[arg(long, env = "ENGINE_SPEEDUP", default_value = "20")]
    engine_speedup: String,
}

#[derive(Subcommand)]
enum Command {
    /// Start the services, backfill and finalize the month, drive traffic (the default).
    Run,
    /// Stop the services an earlier run left running.
    Stop,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = std::fs::canonicalize(&cli.root)?;
    let run_dir = services::RunDir::new(
        &cli.run_dir
            .clone()
            .unwrap_or_else(|| root.join(".stack/demo")),
    )?;
    if matches!(cli.command, Some(Command::Stop)) {
        run_dir.stop().await;
        println!("demo: services stopped");
        return Ok(());
    }
    run_dir.stop().await;
    let path = |p: &str| root.join(p).display().to_string();
    let env: HashMap<String, String> = HashMap::from([
        ("DATABASE_URL".into(), cli.database_url.clone()),
        ("KAFKA_BROKERS".into(), cli.kafka_brokers.clone()),
        ("GATEWAY_TOPIC".into(), cli.topic.clone()),
        ("INGEST_TOPIC".into(), cli.topic.clone()),
        ("ARCHIVE_TOPIC".into(), cli.topic.clone()),
        (
            "BILLING_BOOTSTRAP_FINANCE_TOKEN".into(),
            cli.finance_token.clone(),
        ),
        ("BILLING_METRICS_TOKEN".into(), cli.metrics_token.clone()),
        (
            "BILLING_PRICE_BOOK_FILE".into(),
            path("config/price-book.yaml"),
        ),
        ("BILLING_TENANTS_FILE".into(), path("config/tenants.yaml")),
        (
            "GATEWAY_OUTBOX".into(),
            run_dir.0.join("gateway-outbox").display().to_string(),
        ),
        ("ENGINE_SPEEDUP".into(), cli.engine_speedup.clone()),
        (
            "ARCHIVE_URL".into(),
            cli.archive_url
                .clone()
                .unwrap_or_else(|| path(".stack/archive")),
        ),
        ("ARCHIVE_LINGER_MS".into(), "2000".into()),
    ]);
    let addrs = services::Addrs {
        gateway: cli.gateway_addr.clone(),
        billing: cli.billing_addr.clone(),
        ingest_metrics: cli.ingest_metrics_addr.clone(),
        archive_metrics: cli.archive_metrics_addr.clone(),
    };
    // The tenants before the gateway that reads them (billing-api owns
    // them; it applies the same file again when it starts).
    seed_tenants(&cli.database_url, &root.join("config/tenants.yaml")).await?;
    run_dir.start(&env, &addrs).await?;
    println!(
        "demo: gateway {}, billing-api {}, ingest metrics {}, archiver metrics {} (logs in {})",
        addrs.gateway,
        addrs.billing,
        addrs.ingest_metrics,
        addrs.archive_metrics,
        run_dir.0.display()
    );

    let billing = client::Billing::new(&format!("http://{}", addrs.billing), &cli.finance_token)?;
    let done = backfill::Backfill {
        billing: &billing,
        brokers: cli.kafka_brokers.clone(),
        topic: cli.topic.clone(),
        database_url: cli.database_url.clone(),
        events: cli.backfill_events,
        concurrency: cli.backfill_concurrency,
        seed: cli.seed,
    }
    .run()
    .await?;
    report::sample(&done);
    report::invoices(&done);

    let live = traffic::drive(
        &format!("http://{}", addrs.gateway),
        &billing,
        cli.seconds,
        cli.rate_divisor,
    )
    .await?;
    let mut shadow_bills = Vec::new();
    for invoice in &done.invoices {
        shadow_bills.push(billing.shadow_bill(&invoice.body.head.tenant_id).await?);
    }
    report::months(&done, &shadow_bills);
    let all_match = report::matches(&live);
    let roles = pages::roles(&billing, &cli.finance_token, &done.month.period).await?;
    println!();
    print!(
        "{}",
        pages::render(&format!("http://{}", addrs.billing), &roles)
    );
    println!();
    print!("{}", addrs.metrics(&cli.metrics_token));
    println!();
    println!("demo: services are still running; stop them with: scripts/demo.sh stop");
    if !all_match {
        bail!("billed usage differs from what clients were told");
    }
    if !done.exact && done.took.is_some() {
        bail!(
            "billed usage for {} differs from the sample produced",
            done.month.period
        );
    }
    Ok(())
}

/// Upserts `config/tenants.yaml` through billing-api's tenant
/// administration (validated as a whole first), on a migrated database.
async fn seed_tenants(database_url: &str, file: &std::path::Path) -> anyhow::Result<()> {
    let seed = billing_api::tenant_admin::load("config/tenants.yaml", file)?;
    let pool = schema::connect(database_url, 2, std::time::Duration::from_secs(30)).await?;
    billing_api::tenant_admin::apply(&pool, &seed).await?;
    pool.close().await;
    Ok(())
}
