//! Rows ↔ Arrow `RecordBatch` ↔ Parquet bytes.
//!
//! One column per contract field, in contract order, then what ingest
//! recorded about the row: `ingested_at` (when its request_log insert
//! committed, microseconds, UTC: what billing compares with an invoice's
//! finalization), `kafka_partition` and `kafka_offset` (the message it was
//! stored from). GPU time is `Decimal128(18, 6)`: exact to the microsecond,
//! never a float. Contract times are milliseconds, UTC. The request id is
//! the wire form, `req_` + UUIDv7.
//!
//! Two layouts. A batch file (the archiver's, one UTC hour of one batch) is
//! one row group in id order. A compacted file is sorted by tenant, start
//! time and id (the reads that matter: a tenant's month, a period), in row
//! groups of up to [`COMPACTED_ROW_GROUP`] rows, with a bloom filter on
//! `request_id` so a lookup skips the row groups that cannot hold its id.
//! Both are zstd-compressed, `request_id` delta-encoded as bytes and the
//! times and offsets as integers (near-sorted values: small deltas).
//!
//! Contract v2's placement (`pool`, `dedicated_to`, `queue_wait_ms`,
//! `preemptions`) comes last, nullable: null on rows of v1 events, absent
//! from files written before v2.
//!
//! Schema evolution: columns are read by name. A column this build knows
//! but a file lacks (written before it existed) reads as null, which only
//! nullable columns may be; a column a file has and this build does not
//! know is ignored. New columns are therefore always added nullable.

use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, BooleanArray, Decimal128Array, Int16Array, Int32Array, Int64Array,
    RecordBatch, StringArray, TimestampMicrosecondArray, TimestampMillisecondArray, UInt32Array,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;
use rust_decimal::Decimal;
use usage_contract::{FinishReason, Placement, RequestId, UsageEvent, GPU_SECONDS_SCALE};

use crate::error::ArchiveError;

/// Precision of the GPU-time columns: 12 integer digits (the contract's
/// limit is 691,200 s) and 6 decimal places.
pub const GPU_PRECISION: u8 = 18;

/// Rows per row group of a compacted file: large enough for scans (a
/// tenant-month is a few row groups), small enough that a lookup reads one.
pub const COMPACTED_ROW_GROUP: usize = 1 << 20;

/// One archived request: the event as request_log stored it, and when and
/// from where ingest stored it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedRequest {
    pub event: UsageEvent,
    pub ingested_at: DateTime<Utc>,
    pub kafka_partition: i32,
    pub kafka_offset: i64,
}

/// How a file is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One row group, rows as given.
    Batch,
    /// Sorted by tenant, start time and id; row groups of
    /// [`COMPACTED_ROW_GROUP`]; bloom filter on `request_id`.
    Compacted,
}

/// The columns of every file this build writes, in order.
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
        Field::new(
            "ingested_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("kafka_partition", DataType::Int32, false),
        Field::new("kafka_offset", DataType::Int64, false),
        Field::new("pool", DataType::Utf8, true),
        Field::new("dedicated_to", DataType::Utf8, true),
        Field::new("queue_wait_ms", DataType::Int64, true),
        Field::new("preemptions", DataType::Int64, true),
    ]))
}

fn parquet_error(e: impl std::fmt::Display) -> ArchiveError {
    ArchiveError::Parquet(e.to_string())
}

/// `d` as an integer count of microseconds (scale 6). Fails rather than
/// round: a valid event never has more than six decimal places.
pub fn to_micros(d: Decimal) -> Result<i128, ArchiveError> {
    let mut d = d.normalize();
    if d.scale() > GPU_SECONDS_SCALE {
        return Err(ArchiveError::Row(format!(
            "{d} has more than {GPU_SECONDS_SCALE} decimal places"
        )));
    }
    d.rescale(GPU_SECONDS_SCALE);
    Ok(d.mantissa())
}

/// The inverse of [`to_micros`].
pub fn from_micros(v: i128) -> Result<Decimal, ArchiveError> {
    Decimal::try_from_i128_with_scale(v, GPU_SECONDS_SCALE).map_err(parquet_error)
}

/// `t` at the contract's precision (milliseconds).
pub fn millis(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::milliseconds(1)).unwrap_or(t)
}

/// The rows as one Arrow batch.
pub fn to_record_batch(rows: &[ArchivedRequest]) -> Result<RecordBatch, ArchiveError> {
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
    let count = |f: &dyn Fn(&ArchivedRequest) -> Option<i64>| -> ArrayRef {
        Arc::new(Int64Array::from(rows.iter().map(f).collect::<Vec<_>>()))
    };
    let gpu = |f: &dyn Fn(&UsageEvent) -> Decimal| -> Result<ArrayRef, ArchiveError> {
        let micros = rows
            .iter()
            .map(|r| to_micros(f(&r.event)))
            .collect::<Result<Vec<i128>, _>>()?;
        let array = Decimal128Array::from(micros)
            .with_precision_and_scale(GPU_PRECISION, GPU_SECONDS_SCALE as i8)?;
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
        Arc::new(
            TimestampMicrosecondArray::from_iter_values(
                rows.iter().map(|r| r.ingested_at.timestamp_micros()),
            )
            .with_timezone("UTC"),
        ),
        Arc::new(Int32Array::from_iter_values(
            rows.iter().map(|r| r.kafka_partition),
        )),
        count(&|r| Some(r.kafka_offset)),
        Arc::new(StringArray::from(
            rows.iter()
                .map(|r| r.event.placement.as_ref().map(|p| p.pool.as_str()))
                .collect::<Vec<_>>(),
        )),
        Arc::new(StringArray::from(
            rows.iter()
                .map(|r| {
                    r.event
                        .placement
                        .as_ref()
                        .and_then(|p| p.dedicated_to.as_deref())
                })
                .collect::<Vec<_>>(),
        )),
        count(&|r| r.event.placement.as_ref().map(|p| p.queue_wait_ms)),
        count(&|r| r.event.placement.as_ref().map(|p| p.preemptions)),
    ];
    Ok(RecordBatch::try_new(schema(), columns)?)
}

/// The order of a compacted file: tenant, start time, id.
pub fn sort_for_scans(rows: &mut [ArchivedRequest]) {
    rows.sort_by(|a, b| {
        (&a.event.tenant_id, a.event.started_at, a.event.request_id).cmp(&(
            &b.event.tenant_id,
            b.event.started_at,
            b.event.request_id,
        ))
    });
}

/// Integer columns written as deltas.
const DELTA_COLUMNS: [&str; 5] = [
    "started_at",
    "first_token_at",
    "finished_at",
    "ingested_at",
    "kafka_offset",
];

fn properties(layout: Layout, rows: usize) -> WriterProperties {
    let id = ColumnPath::from("request_id");
    let builder = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        // Unique per row: a dictionary never pays. Ids in time order share
        // long prefixes, which delta encoding stores once.
        .set_column_dictionary_enabled(id.clone(), false)
        .set_column_encoding(id.clone(), Encoding::DELTA_BYTE_ARRAY)
        .set_statistics_enabled(EnabledStatistics::Chunk);
    // Times and offsets are near-sorted integers: their deltas are small.
    let builder = DELTA_COLUMNS.iter().fold(builder, |b, c| {
        let c = ColumnPath::from(*c);
        b.set_column_dictionary_enabled(c.clone(), false)
            .set_column_encoding(c, Encoding::DELTA_BINARY_PACKED)
    });
    match layout {
        Layout::Batch => builder
            .set_max_row_group_row_count(Some(rows.max(1)))
            .build(),
        Layout::Compacted => builder
            .set_max_row_group_row_count(Some(COMPACTED_ROW_GROUP))
            .set_column_bloom_filter_enabled(id.clone(), true)
            .set_column_bloom_filter_max_ndv(id.clone(), rows.clamp(1, COMPACTED_ROW_GROUP) as u64)
            .set_column_bloom_filter_fpp(id, 0.01)
            .build(),
    }
}

/// The rows as one Parquet file in `layout` (a compacted layout expects the
/// rows in [`sort_for_scans`] order). Deterministic: the same rows give the
/// same bytes.
pub fn encode(rows: &[ArchivedRequest], layout: Layout) -> Result<Vec<u8>, ArchiveError> {
    let mut out = Vec::new();
    let mut writer =
        ArrowWriter::try_new(&mut out, schema(), Some(properties(layout, rows.len())))?;
    let chunk = match layout {
        Layout::Batch => rows.len().max(1),
        Layout::Compacted => 64 * 1024,
    };
    for part in rows.chunks(chunk) {
        writer.write(&to_record_batch(part)?)?;
    }
    writer.close()?;
    Ok(out)
}

/// Reads a whole archive file back into rows.
pub fn decode(bytes: bytes::Bytes) -> Result<Vec<ArchivedRequest>, ArchiveError> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
    let mut out = Vec::new();
    for batch in reader {
        read_batch(&batch?, &mut out)?;
    }
    Ok(out)
}

/// A column by name, or (`None`) absent from the file.
fn optional<'a, T: Array + 'static>(
    b: &'a RecordBatch,
    name: &str,
) -> Result<Option<&'a T>, ArchiveError> {
    match b.column_by_name(name) {
        None => Ok(None),
        Some(c) => c
            .as_any()
            .downcast_ref::<T>()
            .map(Some)
            .ok_or_else(|| ArchiveError::Parquet(format!("column {name} has another type"))),
    }
}

fn column<'a, T: Array + 'static>(b: &'a RecordBatch, name: &str) -> Result<&'a T, ArchiveError> {
    optional(b, name)?.ok_or_else(|| ArchiveError::Parquet(format!("column {name} missing")))
}

fn time(v: i64) -> Result<DateTime<Utc>, ArchiveError> {
    DateTime::from_timestamp_millis(v)
        .ok_or_else(|| ArchiveError::Row(format!("time {v} out of range")))
}

/// Appends the rows of one record batch of an archive file to `out`.
pub fn read_batch(b: &RecordBatch, out: &mut Vec<ArchivedRequest>) -> Result<(), ArchiveError> {
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
    let t = |name| optional::<TimestampMillisecondArray>(b, name);
    let (started, first_token, finished) = (
        column::<TimestampMillisecondArray>(b, "started_at")?,
        t("first_token_at")?,
        column::<TimestampMillisecondArray>(b, "finished_at")?,
    );
    let i = |name| column::<Int64Array>(b, name);
    let (prompt, cached, completion, offset) = (
        i("prompt_tokens")?,
        i("cached_tokens")?,
        i("completion_tokens")?,
        i("kafka_offset")?,
    );
    let ttft = optional::<Int64Array>(b, "ttft_ms")?;
    let tpot = optional::<Int64Array>(b, "tpot_ms")?;
    let gpu = column::<Decimal128Array>(b, "gpu_seconds")?;
    let preempted = column::<Decimal128Array>(b, "preempted_gpu_seconds")?;
    let stream = column::<BooleanArray>(b, "stream")?;
    let partition = column::<Int32Array>(b, "kafka_partition")?;
    let ingested = column::<TimestampMicrosecondArray>(b, "ingested_at")?;
    let pool = optional::<StringArray>(b, "pool")?;
    let dedicated_to = optional::<StringArray>(b, "dedicated_to")?;
    let queue_wait = optional::<Int64Array>(b, "queue_wait_ms")?;
    let preemptions = optional::<Int64Array>(b, "preemptions")?;
    let opt_str = |a: Option<&StringArray>, r: usize| {
        a.filter(|a| !a.is_null(r)).map(|a| a.value(r).to_owned())
    };
    let opt_i64 =
        |a: Option<&Int64Array>, r: usize| a.filter(|a| !a.is_null(r)).map(|a| a.value(r));
    for r in 0..b.num_rows() {
        let finish_reason = FinishReason::parse(finish.value(r)).ok_or_else(|| {
            ArchiveError::Row(format!("unknown finish_reason {:?}", finish.value(r)))
        })?;
        let id: RequestId = request_id
            .value(r)
            .parse()
            .map_err(|e| ArchiveError::Row(format!("{e}")))?;
        let placement = match (
            opt_str(pool, r),
            opt_i64(queue_wait, r),
            opt_i64(preemptions, r),
        ) {
            (Some(pool), Some(queue_wait_ms), Some(preemptions)) => Some(Placement {
                pool,
                dedicated_to: opt_str(dedicated_to, r),
                queue_wait_ms,
                preemptions,
            }),
            _ => None,
        };
        let first_token_at = match first_token {
            Some(a) if !a.is_null(r) => Some(time(a.value(r))?),
            _ => None,
        };
        out.push(ArchivedRequest {
            event: UsageEvent {
                schema_version: version.value(r),
                request_id: id,
                tenant_id: tenant.value(r).to_owned(),
                api_key_id: key.value(r).to_owned(),
                model: model.value(r).to_owned(),
                model_version: model_version.value(r).to_owned(),
                priority: priority.value(r),
                started_at: time(started.value(r))?,
                first_token_at,
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
                placement,
            },
            ingested_at: DateTime::from_timestamp_micros(ingested.value(r)).ok_or_else(|| {
                ArchiveError::Row(format!("ingested_at {} out of range", ingested.value(r)))
            })?,
            kafka_partition: partition.value(r),
            kafka_offset: offset.value(r),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]
    use super::*;
    use chrono::TimeZone;
    use rust_decimal_macros::dec;

    pub(crate) fn row(n: i64) -> ArchivedRequest {
        let started = Utc
            .with_ymd_and_hms(2026, 11, 29, 10, 0, 0)
            .unwrap()
            .checked_add_signed(TimeDelta::milliseconds(n * 1_234 + 7))
            .unwrap();
        ArchivedRequest {
            event: UsageEvent {
                schema_version: if n % 3 != 0 { 2 } else { 1 },
                request_id: RequestId::at(started),
                tenant_id: format!("tenant-{}", n % 3),
                api_key_id: "key-1".into(),
                model: "llama-3.1-70b".into(),
                model_version: "2024-07".into(),
                priority: (n % 5 + 1) as i16,
                started_at: started,
                first_token_at: (n % 2 == 0).then(|| started + TimeDelta::milliseconds(31)),
                finished_at: started + TimeDelta::milliseconds(900),
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
                placement: (n % 3 != 0).then(|| Placement {
                    pool: "llama-3.1-70b".into(),
                    dedicated_to: (n % 3 == 2).then(|| "acme-corp".into()),
                    queue_wait_ms: n * 10,
                    preemptions: n % 2,
                }),
            },
            ingested_at: started + TimeDelta::microseconds(1_500_123),
            kafka_partition: 2,
            kafka_offset: 1000 + n,
        }
    }

    #[test]
    fn rows_round_trip_field_for_field_in_both_layouts() {
        let rows: Vec<ArchivedRequest> = (0..50).map(row).collect();
        for layout in [Layout::Batch, Layout::Compacted] {
            let back = decode(bytes::Bytes::from(encode(&rows, layout).unwrap())).unwrap();
            assert_eq!(back, rows, "{layout:?}");
        }
    }

    #[test]
    fn gpu_seconds_are_exact_and_more_places_are_refused() {
        assert_eq!(to_micros(dec!(691200.000001)).unwrap(), 691_200_000_001);
        assert!(to_micros(dec!(1.0000001)).is_err());
        assert_eq!(from_micros(100_000).unwrap(), dec!(0.1));
    }

    #[test]
    fn encoding_is_deterministic() {
        let rows: Vec<ArchivedRequest> = (0..20).map(row).collect();
        assert_eq!(
            encode(&rows, Layout::Compacted).unwrap(),
            encode(&rows, Layout::Compacted).unwrap()
        );
    }

    /// A file as this build writes it, without the named columns: a file
    /// of an older schema.
    fn without(rows: &[ArchivedRequest], dropped: &[&str]) -> bytes::Bytes {
        let batch = to_record_batch(rows).unwrap();
        let keep: Vec<usize> = (0..batch.num_columns())
            .filter(|i| !dropped.contains(&batch.schema().field(*i).name().as_str()))
            .collect();
        let old = batch.project(&keep).unwrap();
        let mut bytes = Vec::new();
        let mut w = ArrowWriter::try_new(&mut bytes, old.schema(), None).unwrap();
        w.write(&old).unwrap();
        w.close().unwrap();
        bytes::Bytes::from(bytes)
    }

    #[test]
    fn files_written_before_and_after_contract_v2_read_together() {
        const V2: [&str; 4] = ["pool", "dedicated_to", "queue_wait_ms", "preemptions"];
        let v1_rows: Vec<ArchivedRequest> = (0..30)
            .map(row)
            .map(|mut r| {
                r.event.placement = None;
                r.event.schema_version = 1;
                r
            })
            .collect();
        let v2_rows: Vec<ArchivedRequest> = (30..60).map(row).collect();
        let old_file = without(&v1_rows, &V2);
        let new_file = bytes::Bytes::from(encode(&v2_rows, Layout::Compacted).unwrap());
        let mut both = decode(old_file).unwrap();
        both.extend(decode(new_file).unwrap());
        let expected: Vec<ArchivedRequest> = v1_rows.into_iter().chain(v2_rows).collect();
        assert_eq!(both, expected);
        assert!(both.iter().any(|r| r.event.placement.is_some()));
        assert!(both[..30].iter().all(|r| r.event.placement.is_none()));
    }

    #[test]
    fn a_file_without_a_nullable_column_reads_it_as_null() {
        // A file of an older schema: no ttft_ms, tpot_ms, first_token_at.
        let rows: Vec<ArchivedRequest> = (0..10).map(row).collect();
        let batch = to_record_batch(&rows).unwrap();
        let keep: Vec<usize> = (0..batch.num_columns())
            .filter(|i| {
                !matches!(
                    batch.schema().field(*i).name().as_str(),
                    "ttft_ms" | "tpot_ms" | "first_token_at"
                )
            })
            .collect();
        let old = batch.project(&keep).unwrap();
        let mut bytes = Vec::new();
        let mut w = ArrowWriter::try_new(&mut bytes, old.schema(), None).unwrap();
        w.write(&old).unwrap();
        w.close().unwrap();
        let back = decode(bytes::Bytes::from(bytes)).unwrap();
        assert_eq!(back.len(), 10);
        assert!(back.iter().all(|r| r.event.ttft_ms.is_none()
            && r.event.tpot_ms.is_none()
            && r.event.first_token_at.is_none()));
        assert_eq!(back[3].event.prompt_tokens, rows[3].event.prompt_tokens);
    }
}
