//! The rollup process: close hours on every tick, drop expired partitions
//! once an hour. Errors are logged and retried on the next tick.

use std::future::Future;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use sqlx::PgPool;

use crate::{hours, retention};

#[derive(Debug, Clone)]
pub struct Schedule {
    pub tick: Duration,
    pub lateness: TimeDelta,
    pub keep_days: u32,
    pub archive: retention::ArchiveRule,
}

pub async fn run(pool: PgPool, schedule: Schedule, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(schedule.tick);
    let mut last_retention: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = &mut shutdown => return,
        }
        match hours::close(&pool, schedule.lateness).await {
            Ok(r) if !r.closed.is_empty() => {
                tracing::info!(closed = r.closed.len(), watermark = ?r.watermark, "closed hours");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "closing hours failed; retrying next tick"),
        }
        if last_retention.is_none_or(|t| t.elapsed() >= Duration::from_secs(3600)) {
            let today = Utc::now().date_naive();
            match retention::drop_expired(&pool, today, schedule.keep_days, &schedule.archive).await
            {
                Ok(days) => {
                    last_retention = Some(tokio::time::Instant::now());
                    if !days.is_empty() {
                        tracing::info!(?days, "dropped expired request_log partitions");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "retention failed; retrying next tick"),
            }
        }
    }
}
