//! The billing benchmark: draft invoices for 1,000 tenants × 3 models ×
//! 720 hours of usage_hourly (2.16M rows), next to the floor of simply
//! scanning those rows in Postgres, in the same run.
//!
//! `scripts/bench-billing.sh` builds it in release (`cargo build --release
//! -p bench --bin billing-bench`) and runs `target/release/billing-bench`
//! against the stack's Postgres (a fresh database `mt_billing_bench_<random>`,
//! dropped afterwards unless `--keep`).

#![allow(clippy::print_stdout, reason = "a benchmark prints its report")]

use std::time::{Duration, Instant};

use bench::percentiles::Percentiles;
use billing_api::drafts;
use billing_api::period::Month;
use billing_api::rating::PriceBook;
use clap::Parser;
use devstack::Database;

#[derive(Parser)]
struct Args {
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/meterline"
    )]
    database_url: String,
    #[arg(long, default_value_t = 1000)]
    tenants: i64,
    #[arg(long, default_value_t = 720)]
    hours: i64,
    #[arg(long, default_value_t = 5)]
    runs: u32,
    /// Keep the benchmark database (to look at query plans).
    #[arg(long)]
    keep: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Dropped when the handle is, however the run ends (unless --keep).
    let mut db = Database::fresh_on(&args.database_url, "billing_bench").await?;
    let result = run(&args, &db).await;
    if args.keep {
        db.keep();
        println!("kept database {}", db.name());
    }
    result
}

async fn run(args: &Args, db: &Database) -> anyhow::Result<()> {
    let pool = db.pool.clone();
    let book = PriceBook::from_yaml(include_str!("../../../config/price-book.yaml"))?;
    billing_api::store::price_books::put(&mut *pool.acquire().await?, &book).await?;
    let started = Instant::now();
    sqlx::query(
        "INSERT INTO tenants (tenant_id, display_name, plan, priority, billing_mode, shadow, time_zone)
         SELECT 't' || lpad(i::text, 5, '0'), 'tenant ' || i, 'standard', 1 + i % 5,
                CASE WHEN i % 2 = 0 THEN 'per_token' ELSE 'per_gpu_second' END, i % 3 = 0,
                (ARRAY['UTC', 'America/New_York', 'Europe/Berlin', 'Asia/Tokyo'])[1 + i % 4]
         FROM generate_series(1, $1) AS i",
    )
    .bind(args.tenants)
    .execute(&pool)
    .await?;
    sqlx::query(
        "INSERT INTO usage_hourly (tenant_id, model, priority, hour, requests, prompt_tokens,
             cached_tokens, completion_tokens, gpu_seconds)
         SELECT 't' || lpad(i::text, 5, '0'), m, 1 + i % 5,
                timestamptz '2026-09-01 00:00:00+00' + make_interval(hours => h::int),
                10 + (i * h) % 50, 8000 + (i * h) % 900, (i * h) % 800, 3000 + h % 700,
                ((i * 7 + h * 13) % 100000) / 1000.0
         FROM generate_series(1, $1) AS i,
              unnest(ARRAY['llama-3.1-8b', 'llama-3.1-70b', 'frontier-405b']) AS m,
              generate_series(0, $2 - 1) AS h",
    )
    .bind(args.tenants)
    .bind(args.hours)
    .execute(&pool)
    .await?;
    sqlx::query("ANALYZE usage_hourly").execute(&pool).await?;
    let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM usage_hourly")
        .fetch_one(&pool)
        .await?;
    println!(
        "loaded {rows} usage_hourly rows for {} tenants in {:.1?}",
        args.tenants,
        started.elapsed()
    );

    let month = Month::parse("2026-09")?;
    let mut scan = Vec::new();
    let mut draft = Vec::new();
    let mut invoices = 0;
    let mut lines = 0;
    for _ in 0..args.runs {
        let t = Instant::now();
        let _: (i64, Option<rust_decimal::Decimal>) =
            sqlx::query_as("SELECT count(*), sum(gpu_seconds) FROM usage_hourly")
                .fetch_one(&pool)
                .await?;
        scan.push(t.elapsed());
        let t = Instant::now();
        let bodies = drafts::drafts(&mut *pool.acquire().await?, month, None).await?;
        draft.push(t.elapsed());
        invoices = bodies.len();
        lines = bodies.iter().map(|b| b.lines.len()).sum();
    }
    let median =
        |v: &[Duration]| Percentiles::new(v.iter().map(Duration::as_secs_f64).collect()).at(0.5);
    let (scan, draft) = (median(&scan), median(&draft));
    println!();
    println!(
        "billing benchmark ({} runs, median), {} cores",
        args.runs,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "  draft invoices, all tenants : {:>8.3} s  ({invoices} invoices, {lines} lines)",
        draft
    );
    println!(
        "  floor: scan usage_hourly    : {:>8.3} s  (count + sum over {rows} rows)",
        scan
    );
    println!("  drafts / floor              : {:>8.2}x", draft / scan);
    Ok(())
}
