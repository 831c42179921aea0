use std::collections::HashSet;

use proptest::prelude::*;
use rust_decimal::Decimal;
use usage_contract::{FinishReason, UsageEvent};

use super::*;
use crate::diurnal::is_off_peak;
use crate::ModelShare;

/// November 2026: a 30-day month.
fn month() -> (DateTime<Utc>, DateTime<Utc>) {
    (
        "2026-11-01T00:00:00Z".parse().unwrap(),
        "2026-12-01T00:00:00Z".parse().unwrap(),
    )
}

fn sample(seed: u64, events: u64) -> Vec<UsageEvent> {
    let (from, to) = month();
    Generator::reference(seed, from, to, events)
        .unwrap()
        .collect()
}

fn per_tenant(events: &[UsageEvent]) -> Vec<(String, u64)> {
    Tenant::reference()
        .into_iter()
        .map(|t| {
            let n = events.iter().filter(|e| e.tenant_id == t.name).count() as u64;
            (t.name, n)
        })
        .collect()
}

fn median(mut xs: Vec<i64>) -> i64 {
    xs.sort_unstable();
    xs[xs.len() / 2]
}

#[test]
fn every_event_is_valid_in_range_in_order_and_uniquely_named() {
    let (from, to) = month();
    let events = sample(1, 50_000);
    assert_eq!(events.len(), 50_000);
    let mut ids = HashSet::new();
    for e in &events {
        e.validate(to).unwrap();
        assert!(e.started_at >= from && e.started_at < to);
        assert_eq!(e.request_id.created_at(), e.started_at);
        assert!(ids.insert(e.request_id));
        // The wire form decodes to the same event.
        assert_eq!(&usage_contract::decode(&e.to_json(), to).unwrap(), e);
    }
    assert!(events
        .windows(2)
        .all(|w| w[0].started_at <= w[1].started_at));
}

#[test]
fn timings_are_consistent() {
    for e in sample(2, 20_000) {
        let total = (e.finished_at - e.started_at).num_milliseconds();
        match e.first_token_at {
            Some(first) => {
                assert!(e.completion_tokens > 0);
                assert_eq!(e.ttft_ms, Some((first - e.started_at).num_milliseconds()));
            }
            None => {
                assert_eq!(e.completion_tokens, 0);
                assert_eq!(e.ttft_ms, None);
            }
        }
        if let (Some(ttft), Some(tpot)) = (e.ttft_ms, e.tpot_ms) {
            assert!(matches!(
                e.finish_reason,
                FinishReason::Stop | FinishReason::Length
            ));
            assert_eq!(tpot, (total - ttft) / (e.completion_tokens - 1));
            assert!((5..200).contains(&tpot), "tpot {tpot} ms on {}", e.model);
        }
        assert!(e.preempted_gpu_seconds <= e.gpu_seconds);
        assert!(e.gpu_seconds.scale() == 6);
    }
}

#[test]
fn the_same_seed_gives_the_same_events_and_another_seed_others() {
    let a = sample(7, 3_000);
    assert_eq!(a, sample(7, 3_000));
    let b = sample(8, 3_000);
    assert_ne!(a[0].request_id, b[0].request_id);
    assert_ne!(a, b);
}

#[test]
fn ids_stay_unique_when_thousands_of_events_share_a_millisecond() {
    let (from, _) = month();
    let to = from + TimeDelta::milliseconds(3);
    let events: Vec<_> = Generator::reference(1, from, to, 20_000).unwrap().collect();
    let ids: HashSet<_> = events.iter().map(|e| e.request_id).collect();
    assert_eq!(ids.len(), 20_000);
    for e in &events {
        e.validate(to).unwrap();
    }
}

#[test]
fn tenants_share_the_events_by_their_reference_rates() {
    // 200/50/30/10/100 of 390 requests/s.
    let got = per_tenant(&sample(3, 39_001));
    let want = [20_000, 5_000, 3_000, 1_000, 10_000];
    for ((name, n), w) in got.iter().zip(want) {
        assert!(n.abs_diff(w) <= 1, "{name}: {n} events, expected {w}");
    }
}

#[test]
fn codegen_runs_off_peak_and_acme_in_business_hours() {
    let events = sample(4, 60_000);
    let off_peak_share = |tenant: &str| {
        let mine: Vec<_> = events.iter().filter(|e| e.tenant_id == tenant).collect();
        let off = mine.iter().filter(|e| is_off_peak(e.started_at)).count();
        off as f64 / mine.len() as f64
    };
    let (codegen, acme) = (
        off_peak_share("codegen-platform"),
        off_peak_share("acme-corp"),
    );
    assert!(codegen > 0.75, "codegen {codegen}");
    assert!(acme < 0.15, "acme {acme}");
    // acme's busiest local hours are 09–16 New York time.
    let business = events
        .iter()
        .filter(|e| e.tenant_id == "acme-corp")
        .filter(|e| {
            let h =
                chrono::Timelike::hour(&e.started_at.with_timezone(&chrono_tz::America::New_York));
            (8..20).contains(&h)
        })
        .count() as f64;
    let acme_total = per_tenant(&events)[0].1 as f64;
    assert!(business / acme_total > 0.7, "{}", business / acme_total);
}

#[test]
fn token_medians_are_the_references() {
    let events = sample(5, 40_000);
    let prompt = median(events.iter().map(|e| e.prompt_tokens).collect());
    let output = median(events.iter().map(|e| e.completion_tokens).collect());
    assert!((760..=840).contains(&prompt), "prompt p50 {prompt}");
    assert!((280..=320).contains(&output), "output p50 {output}");
    let cached: i64 = events.iter().map(|e| e.cached_tokens).sum();
    let prompts: i64 = events.iter().map(|e| e.prompt_tokens).sum();
    let share = cached as f64 / prompts as f64;
    assert!((0.15..0.45).contains(&share), "cached share {share}");
}

#[test]
fn finish_reasons_are_mostly_stop() {
    let events = sample(6, 40_000);
    let share = |r: FinishReason| {
        events.iter().filter(|e| e.finish_reason == r).count() as f64 / events.len() as f64
    };
    assert!(share(FinishReason::Stop) > 0.95);
    assert!((0.001..0.03).contains(&share(FinishReason::Length)));
    assert!((0.005..0.02).contains(&share(FinishReason::Cancelled)));
    assert!((0.0005..0.005).contains(&share(FinishReason::Error)));
    assert!(events.iter().any(|e| e.stream) && events.iter().any(|e| !e.stream));
}

/// The calibration the demo depends on: 1.5M events in 30 days are
/// 2,000–6,000 GPU-hours (checked on a 1/15 sample, scaled).
#[test]
fn a_month_of_one_and_a_half_million_events_is_thousands_of_gpu_hours() {
    let (from, to) = month();
    let summary = Generator::reference(1, from, to, 100_000)
        .unwrap()
        .into_summary();
    let hours = summary.gpu_hours() * Decimal::from(15);
    assert!(
        hours > Decimal::from(2_000) && hours < Decimal::from(6_000),
        "{hours} GPU-hours"
    );
    // No tenant is trivial: each has at least 1% of the GPU time.
    let total = summary.total().gpu_seconds;
    for t in &summary.tenants {
        assert!(
            t.totals.gpu_seconds * Decimal::from(100) > total,
            "{}",
            t.tenant
        );
    }
}

#[test]
fn the_summary_is_the_exact_sum_of_what_was_yielded() {
    let (from, to) = month();
    let mut generator = Generator::reference(9, from, to, 10_000).unwrap();
    let events: Vec<_> = generator.by_ref().take(6_000).collect();
    let summary = generator.summary();
    assert_eq!(generator.len(), 4_000);
    let total = summary.total();
    assert_eq!(total.requests, 6_000);
    let gpu: Decimal = events.iter().map(|e| e.gpu_seconds).sum();
    let preempted: Decimal = events.iter().map(|e| e.preempted_gpu_seconds).sum();
    let off_peak: Decimal = events
        .iter()
        .filter(|e| is_off_peak(e.started_at))
        .map(|e| e.gpu_seconds)
        .sum();
    assert_eq!(total.gpu_seconds, gpu);
    assert_eq!(total.preempted_gpu_seconds, preempted);
    assert_eq!(total.off_peak_gpu_seconds, off_peak);
    let sum = |f: fn(&UsageEvent) -> i64| events.iter().map(f).sum::<i64>() as u64;
    assert_eq!(total.prompt_tokens, sum(|e| e.prompt_tokens));
    assert_eq!(total.cached_tokens, sum(|e| e.cached_tokens));
    assert_eq!(total.completion_tokens, sum(|e| e.completion_tokens));
    let acme = summary.tenant("acme-corp").unwrap();
    let acme_70b = &acme.models[0];
    assert_eq!(acme_70b.model, "llama-3.1-70b");
    let want = events
        .iter()
        .filter(|e| e.tenant_id == "acme-corp" && e.model == "llama-3.1-70b")
        .count() as u64;
    assert_eq!(acme_70b.totals.requests, want);
    assert!(summary.to_string().contains("acme-corp"));
}

#[test]
fn higher_concurrency_bills_less_gpu_time() {
    let (from, to) = month();
    let gpu = |concurrency| {
        let mut config = Config::reference(1, from, to, 5_000);
        config.fleet = Fleet::with_concurrency(concurrency);
        Generator::new(config)
            .unwrap()
            .into_summary()
            .total()
            .gpu_seconds
    };
    let (four, sixteen) = (gpu(4), gpu(16));
    assert!(sixteen * Decimal::from(3) < four, "{four} vs {sixteen}");
}

#[test]
fn bad_configs_are_refused_by_name() {
    let (from, to) = month();
    assert!(matches!(
        Generator::reference(1, to, from, 1),
        Err(WorkloadError::EmptyRange { .. })
    ));
    assert_eq!(Generator::reference(1, to, from, 0).unwrap().count(), 0);
    let mut config = Config::reference(1, from, to, 1);
    config.tenants[0].models.push(ModelShare {
        model: "gpt-9".into(),
        percent: 0,
    });
    assert!(matches!(
        Generator::new(config),
        Err(WorkloadError::UnknownModel { .. })
    ));
    let mut config = Config::reference(1, from, to, 1);
    config.tenants[1].models[0].percent = 90;
    assert!(matches!(
        Generator::new(config),
        Err(WorkloadError::BadTenant { .. })
    ));
    let mut config = Config::reference(1, from, to, 1);
    config.fleet.models[0].concurrency = 0;
    assert!(matches!(
        Generator::new(config),
        Err(WorkloadError::ZeroConcurrency(_))
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_range_and_count_gives_exactly_that_many_valid_ordered_events(
        seed in any::<u64>(),
        start_ms in 1_700_000_000_000i64..1_800_000_000_000,
        span_ms in 1i64..40 * 86_400_000,
        events in 0u64..3_000,
    ) {
        let from = DateTime::from_timestamp_millis(start_ms).unwrap();
        let to = from + TimeDelta::milliseconds(span_ms);
        let got: Vec<_> = Generator::reference(seed, from, to, events).unwrap().collect();
        prop_assert_eq!(got.len() as u64, events);
        let mut ids = HashSet::new();
        for e in &got {
            prop_assert!(e.validate(to).is_ok(), "{:?}", e.validate(to));
            prop_assert!(e.started_at >= from && e.started_at < to);
            prop_assert!(ids.insert(e.request_id));
        }
        prop_assert!(got.windows(2).all(|w| w[0].started_at <= w[1].started_at));
    }

    #[test]
    fn sub_millisecond_bounds_keep_events_inside(
        start_us in 1_700_000_000_000_000i64..1_800_000_000_000_000,
        span_us in 1_001i64..50_000,
        events in 1u64..200,
    ) {
        let from = DateTime::from_timestamp_micros(start_us).unwrap();
        let to = from + TimeDelta::microseconds(span_us);
        for e in Generator::reference(1, from, to, events).unwrap() {
            prop_assert!(e.started_at >= from && e.started_at < to);
        }
    }
}
