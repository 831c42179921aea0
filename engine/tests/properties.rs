//! Property tests of a replica on the virtual clock: GPU-seconds are
//! conserved exactly under random arrivals, lengths, cancellations and
//! preemptions; no tenant ever hits another tenant's cache entry;
//! cached_tokens < prompt_tokens; the same timeline gives the same results.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use engine::clock::{run_virtual, Input, RunReport};
use engine::profile::BLOCK_TOKENS;
use engine::replica::Finish;
use engine::{ModelProfile, Replica, SeqRequest, ServiceClass};
use proptest::prelude::*;

/// The 70B profile with a KV budget of 400 blocks, so preemption happens.
fn tight_profile() -> ModelProfile {
    let mut p = ModelProfile::reference().swap_remove(1);
    p.kv_budget_bytes = p.kv_bytes_per_token * u64::from(BLOCK_TOKENS) * 400;
    p.max_context = 2_048;
    p.max_running = 24;
    p
}

#[derive(Debug, Clone)]
struct Arrival {
    gap_us: u64,
    tenant: u32,
    class: ServiceClass,
    prompt: u32,
    output: u32,
    /// Which shared prefix (same hashes for every tenant) and how long.
    family: u64,
    family_blocks: u32,
    cancel_after_us: Option<u64>,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    (
        0u64..300_000,
        0u32..3,
        prop_oneof![
            Just(ServiceClass::BestEffort),
            Just(ServiceClass::Standard),
            Just(ServiceClass::Reserved)
        ],
        1u32..1_500,
        0u32..400,
        0u64..3,
        0u32..40,
        prop::option::weighted(0.2, 0u64..2_000_000),
    )
        .prop_map(
            |(gap_us, tenant, class, prompt, output, family, family_blocks, cancel_after_us)| {
                Arrival {
                    gap_us,
                    tenant,
                    class,
                    prompt,
                    output,
                    family,
                    family_blocks,
                    cancel_after_us,
                }
            },
        )
}

fn timeline(arrivals: &[Arrival]) -> Vec<(u64, Input)> {
    let mut t = 0;
    let mut items = Vec::new();
    for (n, a) in arrivals.iter().enumerate() {
        t += a.gap_us;
        let blocks = (0..a.prompt / BLOCK_TOKENS)
            .map(|i| {
                if i < a.family_blocks {
                    a.family << 32 | u64::from(i)
                } else {
                    (n as u64 + 1) << 40 | u64::from(i)
                }
            })
            .collect();
        let req = SeqRequest {
            class: a.class,
            prompt_tokens: a.prompt,
            blocks,
            output_tokens: a.output,
            capped: false,
            stream: n % 2 == 0,
        };
        let tenant = format!("tenant-{}", a.tenant);
        items.push((t, Input::Arrive { tenant, req }));
        if let Some(after) = a.cancel_after_us {
            items.push((t + after, Input::Cancel { arrival: n }));
        }
    }
    items.sort_by_key(|(t, _)| *t);
    items
}

fn run(arrivals: &[Arrival]) -> (RunReport, Replica) {
    let mut replica = Replica::new(&tight_profile(), "prop-r0").unwrap();
    let report = run_virtual(&mut replica, timeline(arrivals));
    (report, replica)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn gpu_seconds_are_conserved_exactly(arrivals in prop::collection::vec(arrival(), 1..60)) {
        let (report, replica) = run(&arrivals);
        let attributed: u64 = report.outcomes.iter().flatten().map(|o| o.gpu_micros).sum();
        prop_assert_eq!(attributed, report.busy_micros * replica.gpus());
        let by_tenant: u64 = replica.stats().tenant_gpu_micros.iter().sum();
        prop_assert_eq!(by_tenant, attributed);
        // Every admitted request ends, finished or cancelled; nothing is left.
        let admitted = report.outcomes.iter().flatten().count();
        prop_assert_eq!(admitted + report.rejected, arrivals.len());
        prop_assert!(!replica.has_work());
        prop_assert_eq!(replica.kv().used(), 0);
        for (a, o) in arrivals.iter().zip(&report.outcomes) {
            let Some(o) = o else { continue };
            prop_assert!(o.preempted_micros <= o.gpu_micros);
            prop_assert!(o.completion_tokens <= a.output);
            if o.finish != Finish::Cancelled {
                prop_assert_eq!(o.completion_tokens, a.output);
            }
        }
    }

    #[test]
    fn no_tenant_ever_hits_another_tenants_cache(arrivals in prop::collection::vec(arrival(), 1..60)) {
        let (report, _) = run(&arrivals);
        for (i, (a, o)) in arrivals.iter().zip(&report.outcomes).enumerate() {
            let Some(o) = o else { continue };
            prop_assert!(o.cached_tokens < o.prompt_tokens || o.prompt_tokens == 0);
            prop_assert!(o.cached_tokens <= a.family_blocks * BLOCK_TOKENS);
            if o.cached_tokens > 0 {
                // Only a request of the same tenant with the same prefix can
                // have put those blocks there.
                let same_tenant_same_prefix = arrivals.iter().enumerate().any(|(j, b)| {
                    j != i && b.tenant == a.tenant && b.family == a.family && b.family_blocks > 0
                });
                prop_assert!(same_tenant_same_prefix, "request {i} hit another tenant's blocks");
            }
        }
    }

    #[test]
    fn the_same_timeline_gives_the_same_results(arrivals in prop::collection::vec(arrival(), 1..40)) {
        let (a, _) = run(&arrivals);
        let (b, _) = run(&arrivals);
        prop_assert_eq!(a, b);
    }
}

#[test]
fn preemption_is_reported_and_still_conserved() {
    // Twenty long requests at once overflow the 400-block KV while decoding.
    let arrivals: Vec<Arrival> = (0..20)
        .map(|n| Arrival {
            gap_us: 0,
            tenant: n % 3,
            class: ServiceClass::Reserved,
            prompt: 300,
            output: 600,
            family: 9,
            family_blocks: 0,
            cancel_after_us: None,
        })
        .collect();
    let (report, replica) = run(&arrivals);
    assert!(replica.preemptions() > 0, "no preemption happened");
    let outcomes: Vec<_> = report.outcomes.iter().flatten().collect();
    assert_eq!(outcomes.len(), 20);
    assert!(outcomes
        .iter()
        .any(|o| o.preempted_micros > 0 && o.preemptions > 0));
    let attributed: u64 = outcomes.iter().map(|o| o.gpu_micros).sum();
    assert_eq!(attributed, report.busy_micros * replica.gpus());
    assert!(outcomes.iter().all(|o| o.completion_tokens == 600));
}

#[test]
fn idle_time_is_counted_apart_from_busy_time() {
    let arrivals = vec![
        Arrival {
            gap_us: 0,
            tenant: 0,
            class: ServiceClass::Standard,
            prompt: 100,
            output: 10,
            family: 0,
            family_blocks: 0,
            cancel_after_us: None,
        },
        Arrival {
            gap_us: 10_000_000,
            tenant: 1,
            class: ServiceClass::Standard,
            prompt: 100,
            output: 10,
            family: 0,
            family_blocks: 0,
            cancel_after_us: None,
        },
    ];
    let (report, replica) = run(&arrivals);
    assert_eq!(report.busy_micros + report.idle_micros, report.end);
    assert!(report.idle_micros > 9_000_000);
    let attributed: u64 = report.outcomes.iter().flatten().map(|o| o.gpu_micros).sum();
    assert_eq!(attributed, report.busy_micros * replica.gpus());
}
