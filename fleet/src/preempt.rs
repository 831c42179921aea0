//! Priority preemption: when a priority-5 request cannot start within its
//! TTFT objective on any eligible replica, one replica gives up its
//! lowest-priority request in flight — its partial work is discarded (the
//! GPU time stays on it as `preempted_gpu_seconds`) and it goes back to its
//! own queue, so its client sees delay, not failure.
//!
//! [`choose`] decides *whom*; the caller decides *when* and carries it out.
//! The rules:
//! - only a request of lower priority than the preemptor;
//! - never one that has already streamed tokens to its client;
//! - never on a replica that preempted in the last [`COOLDOWN`];
//! - chains stop at depth [`MAX_DEPTH`]: a fresh request has depth 0, a
//!   request re-queued by a preemption the preemptor's depth + 1, and only
//!   a request below the maximum depth may preempt;
//! - of the candidates, the lowest priority, then the least GPU time lost;
//! - except that work *lent* on the preemptor's own dedicated replicas (a
//!   request of another tenant running on a replica the preemptor owns) is
//!   preempted first, whatever its priority: the owner gets its capacity
//!   back before anyone else's work is thrown away. The other rules (not
//!   streamed, the cooldown, the depth) still hold;
//! - and never an owner's own request on its own dedicated replica: no
//!   other tenant's request could start there while the owner runs there,
//!   and the replica's time is the owner's, already paid for on its
//!   reserved line (work thrown away there would be billed twice: on that
//!   line and, as lost GPU time, on the request's usage).

use std::time::{Duration, Instant};

/// A replica that just preempted is immune this long.
pub const COOLDOWN: Duration = Duration::from_secs(5);
/// The deepest a chain of preemptions goes.
pub const MAX_DEPTH: u8 = 2;

/// A request running on a replica, as preemption sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub id: u64,
    pub tenant: String,
    pub priority: i16,
    /// It has sent tokens to its client.
    pub streamed: bool,
    /// GPU-µs it has used so far (what preempting it throws away).
    pub gpu_micros: u64,
}

/// A replica: when it last preempted, what runs on it, and the tenant it
/// is dedicated to, if any.
#[derive(Debug, Clone, Default)]
pub struct Replica {
    pub last_preempted: Option<Instant>,
    pub running: Vec<Running>,
    pub owner: Option<String>,
}

/// The request that cannot start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preemptor<'a> {
    pub tenant: &'a str,
    pub priority: i16,
    /// 0 for a fresh request; a re-queued one carries its chain depth.
    pub depth: u8,
    /// Only take back lent work on the preemptor's own dedicated replicas
    /// (an owner below priority 5 preempts nothing else).
    pub lent_only: bool,
}

/// What to preempt: on replica `replica`, request `victim`; it is
/// re-queued with chain depth `victim_depth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub replica: usize,
    pub victim: u64,
    pub victim_depth: u8,
}

/// The victim for `p` among `replicas` at `now`, if the rules allow one.
pub fn choose(replicas: &[Replica], p: Preemptor<'_>, now: Instant) -> Option<Plan> {
    if p.depth >= MAX_DEPTH {
        return None;
    }
    let candidates = || {
        replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.last_preempted
                    .is_none_or(|at| now.saturating_duration_since(at) >= COOLDOWN)
            })
            .flat_map(|(i, r)| r.running.iter().map(move |v| (i, r, v)))
            .filter(|(_, _, v)| !v.streamed)
    };
    let lent = candidates()
        .filter(|(_, r, v)| r.owner.as_deref() == Some(p.tenant) && v.tenant != p.tenant)
        .min_by_key(|(i, _, v)| (v.priority, v.gpu_micros, *i, v.id));
    lent.or_else(|| {
        candidates()
            .filter(|_| !p.lent_only)
            .filter(|(_, r, v)| r.owner.as_deref() != Some(v.tenant.as_str()))
            .filter(|(_, _, v)| v.priority < p.priority)
            .min_by_key(|(i, _, v)| (v.priority, v.gpu_micros, *i, v.id))
    })
    .map(|(i, _, v)| Plan {
        replica: i,
        victim: v.id,
        victim_depth: p.depth + 1,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;
    use proptest::prelude::*;

    fn running(id: u64, priority: i16, streamed: bool, gpu: u64) -> Running {
        Running {
            id,
            tenant: format!("t{priority}"),
            priority,
            streamed,
            gpu_micros: gpu,
        }
    }

    #[test]
    fn the_lowest_priority_unstreamed_request_off_cooldown_with_least_lost() {
        let now = Instant::now();
        let replicas = vec![
            Replica {
                last_preempted: Some(now - Duration::from_secs(1)),
                running: vec![running(1, 1, false, 10)],
                owner: None,
            },
            Replica {
                last_preempted: None,
                running: vec![
                    running(2, 1, true, 5),
                    running(3, 2, false, 500),
                    running(4, 2, false, 50),
                ],
                owner: None,
            },
        ];
        let fresh = Preemptor {
            tenant: "prod",
            priority: 5,
            depth: 0,
            lent_only: false,
        };
        // 1 is on a replica in its cooldown, 2 has streamed: 4 (P2, least lost).
        assert_eq!(
            choose(&replicas, fresh, now),
            Some(Plan {
                replica: 1,
                victim: 4,
                victim_depth: 1
            })
        );
        // Out of the cooldown, the P1 on replica 0 goes first.
        let later = now + Duration::from_secs(5);
        assert_eq!(choose(&replicas, fresh, later).unwrap().victim, 1);
        // A chain stops at depth 2; never an equal or higher priority.
        assert_eq!(
            choose(
                &replicas,
                Preemptor {
                    tenant: "prod",
                    priority: 5,
                    depth: 2,
                    lent_only: false
                },
                later
            ),
            None
        );
        assert_eq!(
            choose(
                &replicas,
                Preemptor {
                    tenant: "prod",
                    priority: 1,
                    depth: 0,
                    lent_only: false
                },
                later
            ),
            None
        );
        assert_eq!(
            choose(
                &replicas,
                Preemptor {
                    tenant: "prod",
                    priority: 3,
                    depth: 1,
                    lent_only: false
                },
                later
            )
            .unwrap()
            .victim_depth,
            2
        );
    }

    #[test]
    fn lent_work_on_the_owners_replica_goes_first_whatever_its_priority() {
        let now = Instant::now();
        let replicas = vec![
            Replica {
                last_preempted: None,
                running: vec![running(1, 1, false, 10)],
                owner: None,
            },
            Replica {
                last_preempted: None,
                // Lent to a P4 and a P3 while acme was idle; acme's own P5.
                running: vec![
                    running(2, 4, false, 10),
                    running(3, 3, false, 900),
                    Running {
                        tenant: "acme".into(),
                        ..running(4, 5, false, 1)
                    },
                ],
                owner: Some("acme".into()),
            },
        ];
        let acme = Preemptor {
            tenant: "acme",
            priority: 5,
            depth: 0,
            lent_only: false,
        };
        // The P3 lent on acme's replica, before the P1 on the shared one.
        assert_eq!(choose(&replicas, acme, now).unwrap().victim, 3);
        // Anyone else preempts by priority: the P1.
        let other = Preemptor {
            tenant: "prod",
            ..acme
        };
        assert_eq!(choose(&replicas, other, now).unwrap().victim, 1);
        // A lower-priority owner still takes its replica back from a P4.
        let low_owner = Preemptor {
            priority: 2,
            ..acme
        };
        assert_eq!(choose(&replicas, low_owner, now).unwrap().victim, 3);
        // The owner's replica in its cooldown: back to the priority rule.
        let mut cooling = replicas.clone();
        cooling[1].last_preempted = Some(now);
        assert_eq!(choose(&cooling, acme, now).unwrap().victim, 1);
        // An owner below priority 5 takes back only what it lent.
        let lent_only = Preemptor {
            priority: 2,
            lent_only: true,
            ..acme
        };
        assert_eq!(choose(&replicas, lent_only, now).unwrap().victim, 3);
        assert_eq!(choose(&cooling, lent_only, now), None);
    }

    #[test]
    fn an_owners_own_work_on_its_dedicated_replica_is_never_preempted_by_another() {
        let now = Instant::now();
        let owned = |owner: &str| Replica {
            last_preempted: None,
            running: vec![Running {
                tenant: "batch-owner".into(),
                ..running(1, 1, false, 10)
            }],
            owner: Some(owner.into()),
        };
        let prod = Preemptor {
            tenant: "prod",
            priority: 5,
            depth: 0,
            lent_only: false,
        };
        // On its own replica: untouchable, though it is the lowest priority.
        assert_eq!(choose(&[owned("batch-owner")], prod, now), None);
        // The same request on a replica someone else owns is fair game.
        assert_eq!(choose(&[owned("acme")], prod, now).unwrap().victim, 1);
    }

    proptest! {
        /// Whatever runs where: a plan always respects every rule, and a
        /// plan is found whenever some request qualifies.
        #[test]
        fn a_plan_keeps_every_rule_and_exists_when_a_candidate_does(
            shape in proptest::collection::vec(
                (proptest::option::of(0u64..10), proptest::collection::vec((1i16..=5, any::<bool>(), 0u64..1000), 0..6)),
                1..6,
            ),
            priority in 1i16..=5,
            depth in 0u8..4,
        ) {
            let now = Instant::now() + Duration::from_secs(100);
            let mut id = 0;
            let replicas: Vec<Replica> = shape
                .iter()
                .map(|(ago, rs)| Replica {
                    owner: None,
                    last_preempted: ago.map(|s| now - Duration::from_secs(s)),
                    running: rs
                        .iter()
                        .map(|(p, streamed, gpu)| {
                            id += 1;
                            running(id, *p, *streamed, *gpu)
                        })
                        .collect(),
                })
                .collect();
            let p = Preemptor { tenant: "prod", priority, depth, lent_only: false };
            let qualifies = |r: &Replica, v: &Running| {
                r.last_preempted.is_none_or(|at| now - at >= COOLDOWN)
                    && v.priority < priority
                    && !v.streamed
            };
            let any = depth < MAX_DEPTH
                && replicas.iter().any(|r| r.running.iter().any(|v| qualifies(r, v)));
            match choose(&replicas, p, now) {
                None => prop_assert!(!any),
                Some(plan) => {
                    let r = &replicas[plan.replica];
                    let v = r.running.iter().find(|v| v.id == plan.victim).unwrap();
                    prop_assert!(qualifies(r, v));
                    prop_assert!(plan.victim_depth <= MAX_DEPTH && depth < MAX_DEPTH);
                    // No qualifying request of lower priority anywhere.
                    for r2 in &replicas {
                        for v2 in &r2.running {
                            if qualifies(r2, v2) {
                                prop_assert!(v2.priority >= v.priority);
                            }
                        }
                    }
                }
            }
        }
    }
}
