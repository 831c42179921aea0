//! Contract v1: the round trip, and one failing input per rule.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use chrono::{DateTime, Duration, TimeZone, Utc};
use proptest::prelude::*;
use rust_decimal::Decimal;
use rust_decimal_macros::dec;
use serde_json::{json, Value};
use usage_contract::{decode, FinishReason, RequestId, UsageEvent, Violation};

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap()
}

fn event() -> UsageEvent {
    let started = now() - Duration::seconds(10);
    UsageEvent {
        schema_version: 1,
        request_id: RequestId::at(started),
        tenant_id: "acme-corp".into(),
        api_key_id: "key_1".into(),
        model: "llama-70b".into(),
        model_version: "2026-10".into(),
        priority: 5,
        started_at: started,
        first_token_at: Some(started + Duration::milliseconds(120)),
        finished_at: started + Duration::milliseconds(900),
        prompt_tokens: 800,
        cached_tokens: 256,
        completion_tokens: 300,
        gpu_seconds: dec!(0.412345),
        preempted_gpu_seconds: dec!(0),
        finish_reason: FinishReason::Stop,
        ttft_ms: Some(120),
        tpot_ms: Some(2),
        replica_id: "r0".into(),
        gateway_id: "gw0".into(),
        stream: false,
        placement: None,
    }
}

fn as_json(e: &UsageEvent) -> Value {
    serde_json::to_value(e).unwrap()
}

/// Decodes a JSON value with the fixed clock and returns the violation code.
fn code_of(v: Value) -> &'static str {
    let bytes = serde_json::to_vec(&v).unwrap();
    decode(&bytes, now()).unwrap_err().code()
}

fn with(field: &str, value: Value) -> Value {
    let mut v = as_json(&event());
    v[field] = value;
    v
}

#[test]
fn round_trip_is_lossless() {
    let e = event();
    let bytes = e.to_json();
    assert_eq!(decode(&bytes, now()).unwrap(), e);
}

#[test]
fn wire_form_uses_strings_for_gpu_seconds_and_millisecond_utc_times() {
    let v = as_json(&event());
    assert_eq!(v["gpu_seconds"], json!("0.412345"));
    assert_eq!(v["started_at"], json!("2026-11-29T11:59:50.000Z"));
    assert!(v["request_id"].as_str().unwrap().starts_with("req_"));
}

#[test]
fn first_token_at_may_be_absent() {
    let mut v = as_json(&event());
    v.as_object_mut().unwrap().remove("first_token_at");
    let bytes = serde_json::to_vec(&v).unwrap();
    assert_eq!(decode(&bytes, now()).unwrap().first_token_at, None);
}

#[test]
fn content_hash_tells_duplicate_from_conflict() {
    let a = event();
    let b = a.clone();
    let mut c = a.clone();
    c.completion_tokens += 1;
    assert_eq!(a.content_hash(), b.content_hash());
    assert_ne!(a.content_hash(), c.content_hash());
}

#[test]
fn undecodable_bytes() {
    assert_eq!(
        decode(b"\xff\x00garbage", now()).unwrap_err().code(),
        "undecodable"
    );
    assert_eq!(decode(b"[1,2,3]", now()).unwrap_err().code(), "undecodable");
}

#[test]
fn unknown_schema_version() {
    assert_eq!(
        code_of(with("schema_version", json!(3))),
        "unknown_schema_version"
    );
    // A v3 event with fields this reader does not know is still "unknown version", not "malformed".
    let mut v = with("schema_version", json!(3));
    v["new_v3_field"] = json!(true);
    assert_eq!(code_of(v), "unknown_schema_version");
}

fn v2() -> serde_json::Value {
    let mut v = with("schema_version", json!(2));
    v["placement"] = json!({"pool": "llama-3.1-70b", "dedicated_to": "acme-corp",
                            "queue_wait_ms": 40, "preemptions": 1});
    v
}

#[test]
fn a_v2_event_with_its_placement_decodes_and_a_v1_event_still_does() {
    let bytes = serde_json::to_vec(&v2()).unwrap();
    let e = decode(&bytes, now()).unwrap();
    let p = e.placement.clone().unwrap();
    assert_eq!(
        (p.pool.as_str(), p.dedicated_to.as_deref()),
        ("llama-3.1-70b", Some("acme-corp"))
    );
    assert_eq!((p.queue_wait_ms, p.preemptions), (40, 1));
    // Its canonical JSON is what it was decoded from (the hash covers the placement).
    assert_eq!(decode(&e.to_json(), now()).unwrap(), e);
    let v1 = event();
    assert_eq!(decode(&v1.to_json(), now()).unwrap(), v1);
}

#[test]
fn placement_belongs_to_v2_only_and_v2_requires_it() {
    let mut v = v2();
    v["schema_version"] = json!(1);
    assert_eq!(code_of(v), "invalid_field");
    let mut v = v2();
    v.as_object_mut().unwrap().remove("placement");
    assert_eq!(code_of(v), "missing_field");
    let mut v = v2();
    v["placement"]["queue_wait_ms"] = json!(-1);
    assert_eq!(code_of(v), "negative_count");
    let mut v = v2();
    v["placement"]["pool"] = json!("");
    assert_eq!(code_of(v), "bad_identifier");
    let mut v = v2();
    v["placement"]["replica_hint"] = json!("x");
    assert_eq!(code_of(v), "invalid_field");
}

#[test]
fn a_replica_report_is_its_own_record_kind() {
    let report = json!({
        "record": "replica_report", "report_version": 1,
        "report_id": "gw-1/llama-3.1-70b-r0/1764669540000",
        "replica_id": "llama-3.1-70b-r0", "model": "llama-3.1-70b", "reporter_id": "gw-1",
        "gpus": 4, "interval_start": "2025-12-02T09:59:00.000Z",
        "interval_end": "2025-12-02T10:00:00.000Z",
        "busy_gpu_seconds": "200.000001", "idle_gpu_seconds": "39.999999"
    });
    let bytes = serde_json::to_vec(&report).unwrap();
    match usage_contract::decode_record(&bytes, now()).unwrap() {
        usage_contract::Record::Replica(r) => {
            assert_eq!(
                r.busy_gpu_seconds + r.idle_gpu_seconds,
                rust_decimal::Decimal::from(240)
            );
            assert_eq!(r.dedicated_to, None);
        }
        other => panic!("a report decoded as {other:?}"),
    }
    // `decode` reads usage events only.
    assert!(decode(&bytes, now()).is_err());
    let mut bad = report.clone();
    bad["busy_gpu_seconds"] = json!(200.5);
    let err = usage_contract::decode_record(&serde_json::to_vec(&bad).unwrap(), now()).unwrap_err();
    assert_eq!(
        err.code(),
        "invalid_field",
        "a float is not GPU time: {err}"
    );
}

#[test]
fn missing_field_is_named() {
    for field in [
        "tenant_id",
        "prompt_tokens",
        "gpu_seconds",
        "started_at",
        "schema_version",
    ] {
        let mut v = as_json(&event());
        v.as_object_mut().unwrap().remove(field);
        let err = decode(&serde_json::to_vec(&v).unwrap(), now()).unwrap_err();
        assert_eq!(err, Violation::MissingField(field.into()), "field {field}");
    }
}

#[test]
fn float_gpu_seconds_is_rejected() {
    assert_eq!(code_of(with("gpu_seconds", json!(0.5))), "invalid_field");
}

#[test]
fn bad_request_id() {
    assert_eq!(
        code_of(with("request_id", json!("req_not-a-uuid"))),
        "invalid_field"
    );
}

#[test]
fn cached_exceeds_prompt() {
    assert_eq!(
        code_of(with("cached_tokens", json!(801))),
        "cached_exceeds_prompt"
    );
}

#[test]
fn negative_counts() {
    assert_eq!(code_of(with("prompt_tokens", json!(-1))), "negative_count");
    assert_eq!(
        code_of(with("completion_tokens", json!(-5))),
        "negative_count"
    );
    assert_eq!(
        code_of(with("gpu_seconds", json!("-0.000001"))),
        "negative_count"
    );
}

#[test]
fn absurd_counts() {
    assert_eq!(
        code_of(with("completion_tokens", json!(10_000_001))),
        "absurd_count"
    );
    assert_eq!(
        code_of(with("gpu_seconds", json!("999999999"))),
        "absurd_count"
    );
}

#[test]
fn gpu_seconds_finer_than_a_microsecond() {
    assert_eq!(
        code_of(with("gpu_seconds", json!("0.0000001"))),
        "too_precise"
    );
    // Trailing zeros are not extra precision.
    let v = with("gpu_seconds", json!("0.50000000"));
    let e = decode(&serde_json::to_vec(&v).unwrap(), now()).unwrap();
    assert_eq!(e.gpu_seconds, dec!(0.5));
}

#[test]
fn finished_before_started() {
    let e = event();
    let v = with(
        "finished_at",
        json!((e.started_at - Duration::milliseconds(1)).to_rfc3339()),
    );
    assert_eq!(code_of(v), "finished_before_started");
}

#[test]
fn first_token_outside_the_request() {
    let e = event();
    let v = with(
        "first_token_at",
        json!((e.finished_at + Duration::seconds(1)).to_rfc3339()),
    );
    assert_eq!(code_of(v), "first_token_out_of_range");
}

#[test]
fn time_more_than_a_day_in_the_future() {
    let later = now() + Duration::days(1) + Duration::seconds(1);
    let mut v = with("started_at", json!(later.to_rfc3339()));
    v["finished_at"] = json!((later + Duration::seconds(1)).to_rfc3339());
    v["first_token_at"] = Value::Null;
    assert_eq!(code_of(v), "in_future");
}

#[test]
fn priority_out_of_range() {
    assert_eq!(code_of(with("priority", json!(0))), "bad_priority");
    assert_eq!(code_of(with("priority", json!(6))), "bad_priority");
}

#[test]
fn empty_identifier_or_one_with_control_characters() {
    assert_eq!(code_of(with("tenant_id", json!(""))), "bad_identifier");
    // Postgres text cannot hold NUL: such an event must be rejected here, not
    // fail the whole batch's transaction.
    assert_eq!(
        code_of(with("tenant_id", json!("acme\u{0}corp"))),
        "bad_identifier"
    );
    assert_eq!(code_of(with("model", json!("m\n"))), "bad_identifier");
}

#[test]
fn unknown_finish_reason_and_unknown_fields() {
    assert_eq!(
        code_of(with("finish_reason", json!("exploded"))),
        "invalid_field"
    );
    // v1 carries no other fields: in particular no prompt or completion text.
    assert_eq!(code_of(with("prompt", json!("hello"))), "invalid_field");
}

proptest! {
    #[test]
    fn any_valid_event_round_trips(
        prompt in 0i64..2_000_000,
        cached_share in 0u32..=100,
        completion in 0i64..200_000,
        micros in 0i64..1_000_000_000,
        reason in prop_oneof![
            Just(FinishReason::Stop), Just(FinishReason::Length),
            Just(FinishReason::Cancelled), Just(FinishReason::Error)],
        priority in 1i16..=5,
    ) {
        let mut e = event();
        e.prompt_tokens = prompt;
        e.cached_tokens = prompt * i64::from(cached_share) / 100;
        e.completion_tokens = completion;
        e.gpu_seconds = Decimal::new(micros, 6);
        e.finish_reason = reason;
        e.priority = priority;
        let back = decode(&e.to_json(), now()).unwrap();
        prop_assert_eq!(back.content_hash(), e.content_hash());
        prop_assert_eq!(back, e);
    }
}
