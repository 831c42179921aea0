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

use anyhow::bail;
use clap::Parser;
use demo::cli::{Cli, Command};

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
