//! Keeping what this gateway holds in Redis current — giving back unused
//! leases, the heartbeat, renewing capacity units and lease records — and
//! giving everything back at shutdown.

use std::collections::HashMap;
use std::time::Instant;

use super::demand::*;
use super::leases::*;
use super::limiter::*;
use super::shared;
use crate::cluster::{Cluster, Mode};

impl Limiter {
    /// Keeps what this gateway holds in Redis current, forever: every
    /// second it gives back leased units unused for a second; every 5 s
    /// (every second while Redis is unreachable) the heartbeat, the
    /// renewal of its capacity units and its lease records.
    pub fn spawn_renewal(&self) -> tokio::task::JoinHandle<()> {
        let limiter = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(crate::cluster::RETRY_EVERY);
            let per_renewal = (crate::cluster::RENEW_EVERY.as_secs()
                / crate::cluster::RETRY_EVERY.as_secs())
            .max(1);
            let mut n: u64 = 0;
            loop {
                tick.tick().await;
                limiter.renew(n % per_renewal == 0).await;
                n += 1;
            }
        })
    }

    /// One round of [`Limiter::spawn_renewal`]; `full` also renews. A
    /// registration pending (a lease found this gateway's liveness gone)
    /// runs with the heartbeat that makes it count.
    pub async fn renew(&self, full: bool) {
        let cluster = &self.cluster;
        let pending = self.lock().register;
        if cluster.mode() == Mode::Local || full || pending {
            match cluster.heartbeat().await {
                Ok(lost) => {
                    if lost {
                        self.lock().register = true;
                    }
                }
                Err(e) => {
                    cluster.unreachable(&e);
                    return;
                }
            }
        }
        let Some(mut conn) = cluster.conn() else {
            return;
        };
        let now = Instant::now();
        let peers = cluster.peers();
        let (returns, capacities, register, leases) = {
            let mut st = self.lock();
            st.sync(Mode::Shared, now);
            let mut returns = Vec::new();
            let used: HashMap<Resource, u64> = st.in_use.clone();
            for (res, h) in st.holdings.iter_mut() {
                let idle = now.saturating_duration_since(h.touched) >= GIVE_BACK_AFTER;
                // Of a rate, what is unspent after a second; of a capacity,
                // down to one block beyond what its requests use once it
                // holds two blocks more (all of it after a second unused):
                // a busy gateway never sits on the cap, nor calls Redis for
                // every request that ends.
                let keep = match h.shape {
                    Shape::Rate(_) if !idle => continue,
                    Shape::Rate(_) => 0.0,
                    Shape::Capacity(_) => {
                        let in_use = used.get(res).copied().unwrap_or(0);
                        let block = h.shape.block(peers);
                        if idle {
                            in_use as f64
                        } else if h.units > (in_use + 2 * block) as f64 {
                            (in_use + block) as f64
                        } else {
                            continue;
                        }
                    }
                };
                let spare = (h.units - keep).floor();
                if spare >= 1.0 {
                    h.units -= spare;
                    returns.push((
                        cluster.key(&res.redis_name()),
                        h.shape.redis(),
                        spare as u64,
                    ));
                }
            }
            let register = std::mem::take(&mut st.register);
            let capacities: Vec<(String, u64)> = if full || register {
                st.holdings
                    .iter()
                    .filter(|(_, h)| matches!(h.shape, Shape::Capacity(_)))
                    .map(|(r, h)| (cluster.key(&r.redis_name()), h.units.max(0.0) as u64))
                    .collect()
            } else {
                Vec::new()
            };
            let leases = if full || register {
                lease_records(&st, cluster)
            } else {
                Vec::new()
            };
            (returns, capacities, register, leases)
        };
        if !returns.is_empty() {
            crate::telemetry::redis_call("give_back");
            if let Err(e) = self
                .scripts
                .give_back(&mut conn, cluster.holder(), &returns)
                .await
            {
                // Redis may not have taken them back: what this gateway
                // holds is set again at the next renewal.
                self.lock().register = true;
                cluster.failed(&e);
                return;
            }
        }
        if !capacities.is_empty() || !leases.is_empty() {
            crate::telemetry::redis_call("renew");
            let pipe = shared::renewal(cluster.holder(), &capacities, register, &leases);
            if let Err(e) = pipe.query_async::<()>(&mut conn).await {
                if register {
                    self.lock().register = true;
                }
                cluster.failed(&e);
            }
        }
    }
}

impl Limiter {
    /// On shutdown, after the last request: gives back everything this
    /// gateway holds and leaves the cluster, so the others have it at once
    /// rather than after 15 s.
    pub async fn release(&self) {
        let Some(mut conn) = self.cluster.conn() else {
            return;
        };
        let returns: Vec<(String, shared::Kind, u64)> = {
            let mut st = self.lock();
            let used = st.in_use.clone();
            st.holdings
                .drain()
                .filter_map(|(res, h)| {
                    let keep = used.get(&res).copied().unwrap_or(0) as f64;
                    let spare = (h.units - keep).floor();
                    (spare >= 1.0).then(|| {
                        (
                            self.cluster.key(&res.redis_name()),
                            h.shape.redis(),
                            spare as u64,
                        )
                    })
                })
                .collect()
        };
        crate::telemetry::redis_call("give_back");
        if let Err(e) = self
            .scripts
            .give_back(&mut conn, self.cluster.holder(), &returns)
            .await
        {
            tracing::warn!(error = %e, "could not give back leased limits on shutdown");
        }
        self.cluster.leave().await;
    }
}

/// Per tenant, this gateway's lease records: request id → estimated
/// KV·s, start and gateway.
pub(super) fn lease_records(st: &State, cluster: &Cluster) -> Vec<(String, Vec<(String, String)>)> {
    let mut by_tenant: HashMap<&str, Vec<(String, String)>> = HashMap::new();
    for f in st.in_flight.values() {
        let value = serde_json::json!({
            "kv_mib_seconds": f.kv_mib_seconds,
            "started_unix_ms": f.started_unix_ms,
            "gateway": cluster.gateway_id(),
        });
        by_tenant
            .entry(f.tenant.as_str())
            .or_default()
            .push((f.request_id.clone(), value.to_string()));
    }
    // Tenants whose requests all ended get an empty list (deleted).
    for res in st.in_use.keys() {
        if let Resource::Concurrency(t) = res {
            by_tenant.entry(t.as_str()).or_default();
        }
    }
    by_tenant
        .into_iter()
        .map(|(t, entries)| {
            (
                cluster.key(&format!("leases:{t}:{}", cluster.gateway_id())),
                entries,
            )
        })
        .collect()
}
