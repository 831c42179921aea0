//! A model served by a pool of simulated replicas: where requests go, and
//! what happens to them when a replica dies.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use std::collections::HashMap;
use std::time::Duration;

use engine::{CompletionRequest, EngineError, ModelProfile, ServiceClass, Simulator};
use rust_decimal::Decimal;

const MODEL: &str = "llama-3.1-70b";

/// The reference profiles with the 70B on `replicas` replicas, in real time.
fn pool(replicas: u32) -> Simulator {
    let mut profiles = ModelProfile::reference();
    ModelProfile::set_replicas(&mut profiles, &format!("{MODEL}={replicas}")).unwrap();
    Simulator::new(profiles, 1)
}

fn req(n: u64) -> CompletionRequest {
    CompletionRequest {
        model: MODEL.into(),
        prompt: format!("request {n}: {}", "tell me about GPU pools ".repeat(100)),
        max_tokens: Some(500),
        seed: n,
        tenant_id: format!("t{}", n % 5),
        class: ServiceClass::Standard,
        body: None,
    }
}

#[tokio::test]
async fn a_burst_spreads_over_the_pool_within_a_few_requests_of_the_mean() {
    let sim = std::sync::Arc::new(pool(12));
    // 240 requests arrive at once, all routed before any replica publishes
    // a new reading: the router's own accounting must spread them.
    let mut starts = tokio::task::JoinSet::new();
    for n in 0..240 {
        let sim = sim.clone();
        starts.spawn(async move { sim.start(&req(n), false).await.unwrap() });
    }
    let running = starts.join_all().await;
    let mut per_replica: HashMap<String, u32> = HashMap::new();
    for g in &running {
        *per_replica.entry(g.replica_id().to_owned()).or_default() += 1;
    }
    assert_eq!(
        per_replica.len(),
        12,
        "every replica is used: {per_replica:?}"
    );
    let (min, max) = (
        *per_replica.values().min().unwrap(),
        *per_replica.values().max().unwrap(),
    );
    assert!(
        min >= 20 - 5 && max <= 20 + 5,
        "in flight per replica, mean 20: {per_replica:?}"
    );
    let snaps = sim.snapshots();
    assert_eq!(snaps.iter().filter(|s| s.model == MODEL).count(), 12);
}

#[tokio::test]
async fn a_dead_replica_fails_its_requests_billed_for_what_they_used_and_leaves_the_pool() {
    let sim = pool(2);
    let mut running = Vec::new();
    for n in 0..6 {
        running.push(sim.start(&req(n), false).await.unwrap());
    }
    let dead = format!("{MODEL}-r0");
    assert!(running.iter().any(|g| g.replica_id() == dead));
    // Let them run a while: prefill done, tokens decoded.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(sim.fail_replica(&dead));
    assert!(!sim.fail_replica(&dead), "a replica dies once");
    assert_eq!(sim.replica_ids(MODEL), [format!("{MODEL}-r1")]);
    assert!(sim.snapshots().iter().all(|s| s.replica_id != dead));

    let (mut failed, mut alive) = (0, 0);
    for g in running {
        if g.replica_id() == dead {
            match g.finish().await {
                Err(EngineError::ReplicaFailed { replica, used }) => {
                    assert_eq!(replica, dead);
                    assert_eq!(used.replica_id, dead);
                    assert!(used.gpu_seconds > Decimal::ZERO, "its GPU time is billed");
                    assert!(used.completion_tokens > 0, "it had decoded tokens");
                    assert!(used.completion_tokens < 500);
                    failed += 1;
                }
                other => panic!("a request on the dead replica ended with {other:?}"),
            }
        } else {
            // The other replica's requests go on.
            let used = g.cancel().await.unwrap();
            assert!(used.gpu_seconds > Decimal::ZERO);
            alive += 1;
        }
    }
    assert!(failed > 0 && alive > 0, "failed {failed}, alive {alive}");
    // New requests go to the replica left.
    for n in 10..16 {
        let g = sim.start(&req(n), false).await.unwrap();
        assert_eq!(g.replica_id(), format!("{MODEL}-r1"));
    }
}

#[tokio::test]
async fn with_every_replica_dead_a_request_is_refused_not_hung() {
    let sim = pool(2);
    for id in sim.replica_ids(MODEL) {
        assert!(sim.fail_replica(&id));
    }
    let refused = sim.start(&req(1), false).await.err().unwrap();
    assert!(
        matches!(refused, EngineError::NoCapacity { .. }),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_dedicated_replica_is_its_owners_while_it_runs_there_and_lent_when_idle() {
    let mut profiles = ModelProfile::reference();
    ModelProfile::set_replicas(&mut profiles, &format!("{MODEL}=4")).unwrap();
    ModelProfile::set_dedicated(&mut profiles, &format!("{MODEL}:acme=2")).unwrap();
    let sim = Simulator::new(profiles, 1);
    let owned = [format!("{MODEL}-r0"), format!("{MODEL}-r1")];
    let as_tenant = |tenant: &str, n: u64| CompletionRequest {
        tenant_id: tenant.into(),
        ..req(n)
    };
    // The owner's requests go to its own replicas first.
    let mut acme = Vec::new();
    for n in 0..4 {
        let g = sim.start(&as_tenant("acme", n), false).await.unwrap();
        assert!(
            owned.contains(&g.replica_id().to_owned()),
            "{}",
            g.replica_id()
        );
        acme.push(g);
    }
    // While it runs there, nobody else starts there.
    let mut others = Vec::new();
    for n in 10..40 {
        let g = sim.start(&as_tenant("codegen", n), false).await.unwrap();
        assert!(
            !owned.contains(&g.replica_id().to_owned()),
            "{}",
            g.replica_id()
        );
        others.push(g);
    }
    // The owner idle: its replicas, now the emptiest, are lent.
    for g in acme {
        g.cancel().await.unwrap();
    }
    let mut lent = 0;
    for n in 40..60 {
        let g = sim.start(&as_tenant("codegen", n), false).await.unwrap();
        lent += u32::from(owned.contains(&g.replica_id().to_owned()));
        others.push(g);
    }
    assert!(lent > 0, "an idle owner's replicas are lent");
}

#[tokio::test]
async fn an_owner_waiting_for_room_keeps_its_replicas_from_being_lent() {
    let mut profiles = ModelProfile::reference();
    ModelProfile::set_replicas(&mut profiles, &format!("{MODEL}=2")).unwrap();
    ModelProfile::set_dedicated(&mut profiles, &format!("{MODEL}:acme=1")).unwrap();
    let sim = Simulator::new(profiles, 1);
    let owned = format!("{MODEL}-r0");
    let as_tenant = |tenant: &str, n: u64| CompletionRequest {
        tenant_id: tenant.into(),
        ..req(n)
    };
    assert!(
        sim.owner_waiting(MODEL, "codegen").is_none(),
        "a tenant owning no replica of the model has nothing to hold"
    );
    // The owner has a request waiting in the gateway's queue: nobody else
    // starts on its idle replica.
    let waiting = sim.owner_waiting(MODEL, "acme").unwrap();
    let mut others = Vec::new();
    for n in 0..20 {
        let g = sim.start(&as_tenant("codegen", n), false).await.unwrap();
        assert_ne!(g.replica_id(), owned);
        others.push(g);
    }
    // It is placed (or gives up): the replica, emptier, is lent again.
    drop(waiting);
    let mut lent = 0;
    for n in 20..30 {
        let g = sim.start(&as_tenant("codegen", n), false).await.unwrap();
        lent += u32::from(g.replica_id() == owned);
        others.push(g);
    }
    assert!(lent > 0, "lent again once the owner stopped waiting");
}

#[tokio::test]
async fn a_dedicated_replica_counts_what_it_lent_every_attempt_included() {
    let mut profiles = ModelProfile::reference();
    ModelProfile::set_replicas(&mut profiles, &format!("{MODEL}=1")).unwrap();
    ModelProfile::set_dedicated(&mut profiles, &format!("{MODEL}:acme=1")).unwrap();
    let sim = Simulator::new(profiles, 20);
    let as_tenant = |tenant: &str, n: u64| CompletionRequest {
        tenant_id: tenant.into(),
        ..req(n)
    };
    // A borrower's attempt cut short (as a preemption does), a borrower's
    // request run to the end, and the owner's own.
    let cut = sim.start(&as_tenant("codegen", 1), false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let lost = cut.cancel().await.unwrap().gpu_seconds;
    let borrowed = sim.complete(&as_tenant("codegen", 2)).await.unwrap();
    let own = sim.complete(&as_tenant("acme", 3)).await.unwrap();
    assert!(lost > Decimal::ZERO);
    let mut time = sim.gpu_time().await;
    time.retain(|r| r.model == MODEL);
    assert_eq!(time.len(), 1);
    let micros = |d: Decimal| {
        use rust_decimal::prelude::ToPrimitive;
        (d * Decimal::from(1_000_000)).to_u64().unwrap()
    };
    assert_eq!(
        time[0].time.lent_gpu_micros,
        micros(lost + borrowed.gpu_seconds),
        "lent = every borrower attempt's GPU time"
    );
    assert_eq!(
        time[0].time.busy_gpu_micros,
        micros(lost + borrowed.gpu_seconds + own.gpu_seconds),
        "busy = lent + the owner's own"
    );
}
