//! Events → Arrow `RecordBatch` → Parquet bytes, and back.
//!
//! One column per contract field, in contract order, then where the event
//! came from (`kafka_partition`, `kafka_offset`). GPU time is
//! `Decimal128(18, 6)`: exact to the microsecond, never a float. Times are
//! milliseconds since the epoch, UTC (what the contract carries). The
//! request id is the wire form, `req_` + UUIDv7. Encoding is deterministic:
//! the same rows always give the same bytes, so a file written twice under
//! one name (a retried or re-consumed batch) is the same file.

use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, BooleanArray, Decimal128Array, Int16Array, Int32Array, Int64Array,
    RecordBatch, StringArray, TimestampMillisecondArray, UInt32Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use chrono::{DateTime, Utc};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use rust_decimal::Decimal;
use usage_contract::{FinishReason, RequestId, UsageEvent, GPU_SECONDS_SCALE};

use crate::error::IngestError;

/// Precision of the GPU-time columns: 12 integer digits (the contract's
/// limit is 691,200 s) and 6 decimal places.
pub const GPU_PRECISION: u8 = 18;

/// One archived event and where it was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedEvent {
    pub partition: i32,
    pub offset: i64,
    pub event: UsageEvent,
}

/// The columns of every archive file, in order.
pub fn schema() -> SchemaRef {
    let ts = || DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
    let gpu = || DataType::Decimal128(GPU_PRECISION, GPU_SECONDS_SCALE as i8);
    Arc::new(Schema::new(vec![
        Field::new("schema_version", DataType::UInt32, false),
        Field::new("request_id", DataType::Utf8, false),
        Field::new("tenant_id", DataType::Utf8, false),
        Field::new("api_key_id", DataType::Utf8, false),
        Field::new("model", DataType::Utf8, false),
        Field::new("model_version", DataType::Utf8, false),
        Field::new("priority", DataType::Int16, false),
        Field::new("started_at", ts(), false),
        Field::new("first_token_at", ts(), true),
        Field::new("finished_at", ts(), false),
        Field::new("prompt_tokens", DataType::Int64, false),
        Field::new("cached_tokens", DataType::Int64, false),
        Field::new("completion_tokens", DataType::Int64, false),
        Field::new("gpu_seconds", gpu(), false),
        Field::new("preempted_gpu_seconds", gpu(), false),
        Field::new("finish_reason", DataType::Utf8, false),
        Field::new("ttft_ms", DataType::Int64, true),
        Field::new("tpot_ms", DataType::Int64, true),
        Field::new("replica_id", DataType::Utf8, false),
        Field::new("gateway_id", DataType::Utf8, false),
        Field::new("stream", DataType::Boolean, false),
        Field::new("kafka_partition", DataType::Int32, false),
        Field::new("kafka_offset", DataType::Int64, false),
    ]))
}

fn parquet_error(e: impl std::fmt::Display) -> IngestError {
    IngestError::Parquet(e.to_string())
}

/// `d` as an integer count of microseconds (scale 6). Fails rather than
/// round: a valid event never has more than six decimal places.
pub fn to_micros(d: Decimal) -> Result<i128, IngestError> {
    let mut d = d.normalize();
    if d.scale() > GPU_SECONDS_SCALE {
        return Err(IngestError::Parquet(format!(
            "{d} has more than {GPU_SECONDS_SCALE} decimal places"
        )));
    }
    d.rescale(GPU_SECONDS_SCALE);
    Ok(d.mantissa())
}

/// The inverse of [`to_micros`].
pub fn from_micros(v: i128) -> Result<Decimal, IngestError> {
    Decimal::try_from_i128_with_scale(v, GPU_SECONDS_SCALE).map_err(parquet_error)
}

/// The rows as one Arrow batch.
pub fn to_record_batch(rows: &[ArchivedEvent]) -> Result<RecordBatch, IngestError> {
    let text = |f: &dyn Fn(&UsageEvent) -> &str| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| f(&r.event)),
        ))
    };
    let time = |f: &dyn Fn(&UsageEvent) -> Option<DateTime<Utc>>| -> ArrayRef {
        Arc::new(
            TimestampMillisecondArray::from(
                rows.iter()
                    .map(|r| f(&r.event).map(|t| t.timestamp_millis()))
                    .collect::<Vec<_>>(),
            )
            .with_timezone("UTC"),
        )
    };
    let count = |f: &dyn Fn(&ArchivedEvent) -> Option<i64>| -> ArrayRef {
        Arc::new(Int64Array::from(rows.iter().map(f).collect::<Vec<_>>()))
    };
    let gpu = |f: &dyn Fn(&UsageEvent) -> Decimal| -> Result<ArrayRef, IngestError> {
        let micros = rows
            .iter()
            .map(|r| to_micros(f(&r.event)))
            .collect::<Result<Vec<i128>, _>>()?;
        let array = Decimal128Array::from(micros)
            .with_precision_and_scale(GPU_PRECISION, GPU_SECONDS_SCALE as i8)
            .map_err(parquet_error)?;
        Ok(Arc::new(array))
    };
    let request_ids: Vec<String> = rows
        .iter()
        .map(|r| r.event.request_id.to_string())
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from_iter_values(
            rows.iter().map(|r| r.event.schema_version),
        )),
        Arc::new(StringArray::from_iter_values(request_ids)),
        text(&|e| &e.tenant_id),
        text(&|e| &e.api_key_id),
        text(&|e| &e.model),
        text(&|e| &e.model_version),
        Arc::new(Int16Array::from_iter_values(
            rows.iter().map(|r| r.event.priority),
        )),
        time(&|e| Some(e.started_at)),
        time(&|e| e.first_token_at),
        time(&|e| Some(e.finished_at)),
        count(&|r| Some(r.event.prompt_tokens)),
        count(&|r| Some(r.event.cached_tokens)),
        count(&|r| Some(r.event.completion_tokens)),
        gpu(&|e| e.gpu_seconds)?,
        gpu(&|e| e.preempted_gpu_seconds)?,
        text(&|e| e.finish_reason.as_str()),
        count(&|r| r.event.ttft_ms),
        count(&|r| r.event.tpot_ms),
        text(&|e| &e.replica_id),
        text(&|e| &e.gateway_id),
        Arc::new(BooleanArray::from(
            rows.iter().map(|r| r.event.stream).collect::<Vec<_>>(),
        )),
        Arc::new(Int32Array::from_iter_values(
            rows.iter().map(|r| r.partition),
        )),
        count(&|r| Some(r.offset)),
    ];
    RecordBatch::try_new(schema(), columns).map_err(parquet_error)
}

/// The rows as one Parquet file (Snappy-compressed, one row group).
pub fn encode(rows: &[ArchivedEvent]) -> Result<Vec<u8>, IngestError> {
    let batch = to_record_batch(rows)?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(rows.len().max(1)))
        .build();
    let mut out = Vec::new();
    let mut writer =
        ArrowWriter::try_new(&mut out, batch.schema(), Some(props)).map_err(parquet_error)?;
    writer.write(&batch).map_err(parquet_error)?;
    writer.close().map_err(parquet_error)?;
    Ok(out)
}

/// Reads a file written by [`encode`] back into events (for `verify` and
/// tests). Refuses a file whose columns are not the archive's schema.
pub fn decode(bytes: bytes::Bytes) -> Result<Vec<ArchivedEvent>, IngestError> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(parquet_error)?
        .build()
        .map_err(parquet_error)?;
    let expected = schema();
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(parquet_error)?;
        if batch.schema().fields() != expected.fields() {
            return Err(IngestError::Parquet(
                "file does not have the archive's columns".into(),
            ));
        }
        read_batch(&batch, &mut out)?;
    }
    Ok(out)
}

fn column<'a, T: Array + 'static>(b: &'a RecordBatch, name: &str) -> Result<&'a T, IngestError> {
    b.column_by_name(name)
        .and_then(|c| c.as_any().downcast_ref::<T>())
        .ok_or_else(|| IngestError::Parquet(format!("column {name} missing or mistyped")))
}

fn time(v: i64) -> Result<DateTime<Utc>, IngestError> {
    DateTime::from_timestamp_millis(v)
        .ok_or_else(|| IngestError::Parquet(format!("time {v} out of range")))
}

fn read_batch(b: &RecordBatch, out: &mut Vec<ArchivedEvent>) -> Result<(), IngestError> {
    let version = column::<UInt32Array>(b, "schema_version")?;
    let s = |name| column::<StringArray>(b, name);
    let (request_id, tenant, key, model, model_version, finish, replica, gateway) = (
        s("request_id")?,
        s("tenant_id")?,
        s("api_key_id")?,
        s("model")?,
        s("model_version")?,
        s("finish_reason")?,
        s("replica_id")?,
        s("gateway_id")?,
    );
    let priority = column::<Int16Array>(b, "priority")?;
    let t = |name| column::<TimestampMillisecondArray>(b, name);
    let (started, first_token, finished) =
        (t("started_at")?, t("first_token_at")?, t("finished_at")?);
    let i = |name| column::<Int64Array>(b, name);
    let (prompt, cached, completion, ttft, tpot, offset) = (
        i("prompt_tokens")?,
        i("cached_tokens")?,
        i("completion_tokens")?,
        i("ttft_ms")?,
        i("tpot_ms")?,
        i("kafka_offset")?,
    );
    let gpu = column::<Decimal128Array>(b, "gpu_seconds")?;
    let preempted = column::<Decimal128Array>(b, "preempted_gpu_seconds")?;
    let stream = column::<BooleanArray>(b, "stream")?;
    let partition = column::<Int32Array>(b, "kafka_partition")?;
    let opt_i64 = |a: &Int64Array, r: usize| (!a.is_null(r)).then(|| a.value(r));
    for r in 0..b.num_rows() {
        let finish_reason = match finish.value(r) {
            "stop" => FinishReason::Stop,
            "length" => FinishReason::Length,
            "cancelled" => FinishReason::Cancelled,
            "error" => FinishReason::Error,
            other => {
                return Err(IngestError::Parquet(format!(
                    "unknown finish_reason {other:?}"
                )))
            }
        };
        let id: RequestId = request_id.value(r).parse().map_err(parquet_error)?;
        out.push(ArchivedEvent {
            partition: partition.value(r),
            offset: offset.value(r),
            event: UsageEvent {
                schema_version: version.value(r),
                request_id: id,
                tenant_id: tenant.value(r).to_owned(),
                api_key_id: key.value(r).to_owned(),
                model: model.value(r).to_owned(),
                model_version: model_version.value(r).to_owned(),
                priority: priority.value(r),
                started_at: time(started.value(r))?,
                first_token_at: if first_token.is_null(r) {
                    None
                } else {
                    Some(time(first_token.value(r))?)
                },
                finished_at: time(finished.value(r))?,
                prompt_tokens: prompt.value(r),
                cached_tokens: cached.value(r),
                completion_tokens: completion.value(r),
                gpu_seconds: from_micros(gpu.value(r))?,
                preempted_gpu_seconds: from_micros(preempted.value(r))?,
                finish_reason,
                ttft_ms: opt_i64(ttft, r),
                tpot_ms: opt_i64(tpot, r),
                replica_id: replica.value(r).to_owned(),
                gateway_id: gateway.value(r).to_owned(),
                stream: stream.value(r),
            },
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use rust_decimal_macros::dec;

    fn event(n: i64) -> UsageEvent {
        let started = Utc
            .with_ymd_and_hms(2026, 11, 29, 10, 0, 0)
            .unwrap()
            .checked_add_signed(chrono::TimeDelta::milliseconds(n * 1_234 + 7))
            .unwrap();
        UsageEvent {
            schema_version: 1,
            request_id: RequestId::at(started),
            tenant_id: format!("tenant-{}", n % 3),
            api_key_id: "key-1".into(),
            model: "llama-3.1-70b".into(),
            model_version: "2024-07".into(),
            priority: (n % 5 + 1) as i16,
            started_at: started,
            first_token_at: (n % 2 == 0).then(|| started + chrono::TimeDelta::milliseconds(31)),
            finished_at: started + chrono::TimeDelta::milliseconds(900),
            prompt_tokens: 100 + n,
            cached_tokens: n,
            completion_tokens: 7 * n,
            gpu_seconds: Decimal::new(123_456_789 + n, 6),
            preempted_gpu_seconds: if n % 4 == 0 { dec!(0.000001) } else { dec!(0) },
            finish_reason: [
                FinishReason::Stop,
                FinishReason::Length,
                FinishReason::Cancelled,
                FinishReason::Error,
            ][(n % 4) as usize],
            ttft_ms: (n % 2 == 0).then_some(31),
            tpot_ms: (n % 3 == 0).then_some(12),
            replica_id: "replica-a".into(),
            gateway_id: "gw-1".into(),
            stream: n % 2 == 1,
        }
    }

    fn rows(n: i64) -> Vec<ArchivedEvent> {
        (0..n)
            .map(|i| ArchivedEvent {
                partition: 2,
                offset: 1000 + i,
                event: event(i),
            })
            .collect()
    }

    #[test]
    fn events_round_trip_field_for_field() {
        let rows = rows(50);
        let bytes = encode(&rows).unwrap();
        let back = decode(bytes::Bytes::from(bytes)).unwrap();
        assert_eq!(back, rows);
    }

    #[test]
    fn gpu_seconds_are_exact_decimal128_micros() {
        let rows = vec![ArchivedEvent {
            partition: 0,
            offset: 0,
            event: UsageEvent {
                gpu_seconds: dec!(691200.000001),
                preempted_gpu_seconds: dec!(0.1),
                ..event(1)
            },
        }];
        let batch = to_record_batch(&rows).unwrap();
        let gpu = column::<Decimal128Array>(&batch, "gpu_seconds").unwrap();
        assert_eq!(gpu.value(0), 691_200_000_001);
        assert_eq!(gpu.precision(), 18);
        assert_eq!(gpu.scale(), 6);
        let preempted = column::<Decimal128Array>(&batch, "preempted_gpu_seconds").unwrap();
        assert_eq!(preempted.value(0), 100_000);
        let back = decode(bytes::Bytes::from(encode(&rows).unwrap())).unwrap();
        assert_eq!(back[0].event.gpu_seconds, dec!(691200.000001));
    }

    #[test]
    fn encoding_is_deterministic() {
        let rows = rows(20);
        assert_eq!(encode(&rows).unwrap(), encode(&rows).unwrap());
    }

    #[test]
    fn more_than_six_decimal_places_is_refused_not_rounded() {
        assert!(to_micros(dec!(1.0000001)).is_err());
        assert_eq!(to_micros(dec!(1.5000000)).unwrap(), 1_500_000);
    }

    #[test]
    fn times_are_utc_milliseconds() {
        let batch = to_record_batch(&rows(1)).unwrap();
        let field = batch
            .schema()
            .field_with_name("started_at")
            .unwrap()
            .clone();
        assert_eq!(
            field.data_type(),
            &DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
        );
    }
}
