//! The order in which a model's queue lets its waiters go, through
//! [`Queues::wait`] as the gateway calls it — the callers' priority and
//! weight read from the caller — on tokio's paused clock, so nothing
//! times out and every run is the same.

#![allow(clippy::unwrap_used, reason = "tests fail loudly")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

const MODEL: &str = "m";

fn caller(tenant: &str, priority: i16, weight: u32) -> Caller {
    Caller {
        weight,
        ..Caller::unlimited(tenant, &format!("key-{tenant}"), priority)
    }
}

/// Lets every task run until all of them wait.
async fn settle() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

/// `callers` join in this order, each costing the same, while there is
/// no room; then room for one more comes at a time: the tenants in the
/// order they ran.
async fn order(callers: Vec<Caller>) -> Vec<String> {
    let queues = Queues::new([MODEL.to_owned()], 64);
    let room = Arc::new(AtomicUsize::new(0));
    let went = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for c in callers {
        let (queues, room, went) = (queues.clone(), room.clone(), went.clone());
        tasks.push(tokio::spawn(async move {
            let spot = queues.join(MODEL, &c, 1_000_000).unwrap();
            loop {
                spot.turn(Duration::from_secs(600)).await.unwrap();
                let fits = room
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| r.checked_sub(1))
                    .is_ok();
                if fits {
                    went.lock().unwrap().push(c.tenant_id.clone());
                    spot.dispatched();
                    return;
                }
                spot.not_yet();
            }
        }));
        settle().await;
    }
    assert_eq!(queues.depth(MODEL), tasks.len(), "all of them wait");
    for _ in 0..tasks.len() {
        room.fetch_add(1, Ordering::AcqRel);
        queues.wake(MODEL);
        settle().await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    Arc::try_unwrap(went).unwrap().into_inner().unwrap()
}

#[tokio::test(start_paused = true)]
async fn waiters_go_by_priority_whatever_order_they_came_in() {
    let went = order(vec![
        caller("low", 1, 1),
        caller("standard", 3, 1),
        caller("reserved", 4, 1),
        caller("low-2", 1, 1),
    ])
    .await;
    assert_eq!(went, ["reserved", "standard", "low", "low-2"]);
}

#[tokio::test(start_paused = true)]
async fn within_a_priority_waiters_go_by_their_tenants_weight() {
    // Six requests each, equal cost, the heavy tenant's all first.
    let went = order(
        (0..6)
            .map(|_| caller("heavy", 3, 3))
            .chain((0..6).map(|_| caller("light", 3, 1)))
            .collect(),
    )
    .await;
    // Weight 3 to 1: six of the first eight turns are heavy's (4 of 8
    // with the weights ignored).
    let heavy = went[..8].iter().filter(|t| *t == "heavy").count();
    assert_eq!(heavy, 6, "{went:?}");
}

#[tokio::test(start_paused = true)]
async fn an_arrival_queues_behind_anyone_waiting_at_its_level_or_above() {
    let queues = Queues::new([MODEL.to_owned()], 64);
    let standard = caller("standard", 3, 1);
    assert!(
        !queues.must_queue(MODEL, &standard),
        "nobody waits: straight to a replica"
    );
    let waiting = queues.join(MODEL, &standard, 1_000).unwrap();
    // Whatever room there is, an arrival of its level or below queues
    // behind it; only a higher level goes first.
    assert!(queues.must_queue(MODEL, &caller("other", 3, 8)));
    assert!(queues.must_queue(MODEL, &caller("low", 1, 1)));
    assert!(!queues.must_queue(MODEL, &caller("reserved", 4, 1)));
    drop(waiting);
    assert!(
        !queues.must_queue(MODEL, &caller("low", 1, 1)),
        "it left: nobody waits"
    );
}
