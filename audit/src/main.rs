//! `audit`: recomputes a month's invoices from the Parquet archive and
//! compares them with billing's. Exit 0 when every invoice agrees to the
//! cent, 1 listing every difference (one JSON line each on stdout), 2 when
//! it cannot audit (the archive behind, a bad setting, a store unreachable).

use std::process::ExitCode;
use std::time::Duration;

use audit::cli::Cli;
use billing_api::period::Month;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli: Cli = serving::retired::parse()?;
    let month = Month::parse(&cli.month)
        .map_err(|_| anyhow::anyhow!("--month {:?}: expected YYYY-MM, e.g. 2026-11", cli.month))?;
    if cli.archive_url == "off" {
        anyhow::bail!("ARCHIVE_URL is off: the audit needs the archive");
    }
    let store = archive::store::open(&cli.archive_url)
        .map_err(|e| anyhow::anyhow!("ARCHIVE_URL {:?}: {e}", cli.archive_url))?;
    let pool = schema::connect(&cli.database_url, 2, Duration::from_secs(30)).await?;
    let ids = (!cli.tenants.is_empty()).then_some(cli.tenants.as_slice());
    let outcome = audit::run::month(
        &pool,
        &store,
        month,
        ids,
        Duration::from_secs(cli.wait_seconds),
    )
    .await?;
    #[expect(
        clippy::print_stdout,
        reason = "the command's answer, one JSON line per difference"
    )]
    for d in &outcome.differences {
        println!("{}", serde_json::to_string(d)?);
    }
    for c in &outcome.invoices {
        tracing::info!(
            tenant = %c.tenant_id,
            invoice = %c.invoice,
            billed = %c.billed_total,
            archive = %c.archive_total,
            lines = c.lines,
            differences = c.differences,
            "{}",
            if c.differences == 0 { "agrees" } else { "DIFFERS" }
        );
    }
    let s = outcome.scan;
    let secs = s.elapsed.as_secs_f64();
    tracing::info!(
        files = s.files,
        bytes = s.bytes,
        requests = s.requests,
        scan_ms = s.elapsed.as_millis() as u64,
        events_per_second = if secs > 0.0 {
            (s.requests as f64 / secs) as u64
        } else {
            0
        },
        "archive scanned"
    );
    if !outcome.differences.is_empty() {
        tracing::error!(
            count = outcome.differences.len(),
            %month,
            "audit failed: the archive does not bear out the invoices"
        );
        return Ok(ExitCode::FAILURE);
    }
    tracing::info!(%month, invoices = outcome.invoices.len(), "every invoice agrees with the archive to the cent");
    Ok(ExitCode::SUCCESS)
}
