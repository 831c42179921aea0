//! Admission by class under a long-context flood from one tenant.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]

use engine::clock::{run_virtual, Input};
use engine::{EngineError, ModelProfile, Replica, SeqRequest, ServiceClass};

fn p70() -> ModelProfile {
    ModelProfile::reference().swap_remove(1)
}

/// The 70B profile without the backlog limit: admission by KV alone.
fn p70_kv_only() -> ModelProfile {
    ModelProfile {
        backlog_steps: 0,
        ..p70()
    }
}

fn req(class: ServiceClass, prompt: u32, output: u32) -> SeqRequest {
    SeqRequest {
        class,
        prompt_tokens: prompt,
        blocks: Vec::new(),
        output_tokens: output,
        capped: false,
        stream: false,
    }
}

/// A standard and a reserved request are admitted at time 0.
fn the_higher_classes_get_in(replica: &mut Replica) {
    replica
        .submit("finserv", req(ServiceClass::Standard, 300, 10), 0)
        .unwrap();
    replica
        .submit("acme", req(ServiceClass::Reserved, 300, 10), 0)
        .unwrap();
}

#[test]
fn a_long_context_flood_leaves_room_for_other_classes() {
    // codegen floods 100k-token prompts every 10 ms as best effort; the
    // others send short requests every 50 ms as standard and reserved. The
    // flood may only start work below 60% occupancy, so the others (85%,
    // 92%) are always admitted, and start ahead of the flood's queue.
    let mut timeline = Vec::new();
    for i in 0..60u64 {
        let flood = req(ServiceClass::BestEffort, 100_000, 200);
        timeline.push((
            i * 10_000,
            Input::Arrive {
                tenant: "codegen".into(),
                req: flood,
            },
        ));
    }
    for i in 0..300u64 {
        let (tenant, class) = if i % 2 == 0 {
            ("finserv", ServiceClass::Standard)
        } else {
            ("acme", ServiceClass::Reserved)
        };
        let r = req(class, 300, 150);
        timeline.push((
            i * 50_000,
            Input::Arrive {
                tenant: tenant.into(),
                req: r,
            },
        ));
    }
    timeline.sort_by_key(|(t, _)| *t);
    let mut replica = Replica::new(&p70(), "flood-r0").unwrap();
    let report = run_virtual(&mut replica, timeline);
    let mut flood_admitted = 0;
    let mut others = 0;
    let mut worst_ttft = 0;
    for o in report.outcomes.iter().flatten() {
        if o.prompt_tokens == 100_000 {
            flood_admitted += 1;
        } else {
            others += 1;
            let first = o
                .first_token_at
                .expect("every short request produced tokens");
            worst_ttft = worst_ttft.max(first - o.arrived_at);
        }
    }
    assert!(flood_admitted > 0);
    assert_eq!(others, 300, "standard and reserved requests were refused");
    // They were not queued behind the flood either.
    assert!(worst_ttft < 1_000_000, "worst TTFT {worst_ttft} µs");
}

#[test]
fn each_class_is_refused_at_its_own_threshold() {
    let p = p70_kv_only();
    let mut replica = Replica::new(&p, "thresholds-r0").unwrap();
    // Three 100k-token contexts (~17.7% each) start one after another:
    // occupancy climbs past 60% but stays under 85%.
    for _ in 0..4 {
        replica
            .submit("big", req(ServiceClass::Reserved, 100_000, 1_000), 0)
            .unwrap();
    }
    while replica.kv().used() * 100 < replica.kv().total() * 61 {
        replica.step().unwrap();
    }
    let best = replica.submit("late", req(ServiceClass::BestEffort, 10, 10), replica.now());
    assert!(
        matches!(
            best,
            Err(EngineError::NoCapacity {
                class: "best-effort",
                ..
            })
        ),
        "{best:?}"
    );
    replica
        .submit("late", req(ServiceClass::Standard, 10, 10), replica.now())
        .unwrap();
    replica
        .submit("late", req(ServiceClass::Reserved, 10, 10), replica.now())
        .unwrap();
    assert_eq!(replica.stats().rejected, 1);
}

#[test]
fn a_flood_that_cannot_start_is_refused_not_queued_forever() {
    // Nothing has run yet, so no block is in use: only the queue's demand
    // (each 100k-token prompt needs ~17.7% of the KV) can stop the flood.
    let mut replica = Replica::new(&p70_kv_only(), "queue-r0").unwrap();
    let mut admitted = 0;
    while replica
        .submit("flood", req(ServiceClass::BestEffort, 100_000, 200), 0)
        .is_ok()
    {
        admitted += 1;
        assert!(admitted < 10, "the flood was never refused");
    }
    assert_eq!(admitted, 4, "four fit under 60%, the fifth would not");
    // The other classes still get in, up to their own thresholds.
    the_higher_classes_get_in(&mut replica);

    // vLLM-style queueing (the benchmark's setting) admits the whole flood.
    let mut queueing = Replica::new(&p70(), "vllm-r0").unwrap();
    queueing.set_queue_admission(false);
    for _ in 0..10 {
        queueing
            .submit("flood", req(ServiceClass::BestEffort, 100_000, 200), 0)
            .unwrap();
    }
}

#[test]
fn a_replica_queues_at_most_its_backlog_of_prefill_ahead_of_each_class() {
    // 128 steps of 512 tokens: 65,536 prompt tokens may wait to start.
    let p = p70();
    assert_eq!(p.backlog_steps, 128);
    let limit = 128 * u64::from(p.step_token_budget);
    let mut replica = Replica::new(&p, "backlog-r0").unwrap();
    // Nothing has run: every admitted request waits. 2,000-token prompts
    // are admitted until 65,536 tokens wait (33 of them), then refused.
    let mut admitted = 0u64;
    while replica
        .submit("codegen", req(ServiceClass::BestEffort, 2_000, 200), 0)
        .is_ok()
    {
        admitted += 1;
        assert!(admitted < 100, "never refused");
    }
    assert_eq!(admitted, limit.div_ceil(2_000));
    let refused = replica.submit("codegen", req(ServiceClass::BestEffort, 2_000, 200), 0);
    assert!(
        matches!(
            &refused,
            Err(EngineError::NoCapacity { why: engine::error::NoRoom::Backlog { waiting_tokens }, .. })
                if *waiting_tokens == admitted * 2_000
        ),
        "{refused:?}"
    );
    // A higher class starts ahead of that queue: it is not held by it.
    the_higher_classes_get_in(&mut replica);
    // Once the queue has started, best effort is admitted again.
    while replica
        .submit(
            "codegen",
            req(ServiceClass::BestEffort, 2_000, 200),
            replica.now(),
        )
        .is_err()
    {
        replica.step().unwrap();
    }
}
