//! The outbox's log on disk: a directory of segment files, each
//! preallocated so that an append changes no file metadata, that records
//! are appended to in groups and made durable with one `fdatasync` per
//! group. The relay reads them back in order; a segment is deleted whole
//! once every event in it was published.
//!
//! A record is `length: u32 | crc32: u32 | body`, little endian.
//! Preallocated space reads as zeros, so a zero length marks where a
//! segment's records end; a record whose checksum does not match was torn
//! by a crash (it was never acknowledged, since acknowledgement waits for
//! the `fdatasync`) and ends the segment too. After a restart the writer
//! starts a fresh segment instead of writing over a torn tail, so bytes
//! left behind an incomplete write can never be read back as records.
//!
//! Why not a B-tree store (the outbox was a redb table first): each durable
//! redb commit rewrites several pages and the header, ~0.25 ms on the
//! reference disk, where one page appended into preallocated space takes
//! ~0.05 ms, and that flush was all of the latency the gateway added.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fs::FallocateFlags;

/// The size a segment is preallocated to (larger when one record needs it).
pub const SEGMENT_BYTES: u64 = 16 << 20;
/// Length and checksum in front of every record.
pub const HEADER: usize = 8;
/// How much the reader asks the kernel for at once.
const READ_CHUNK: usize = 64 << 10;

const EVENT: u8 = 1;
const PUBLISHED: u8 = 2;

/// One record as read back.
#[derive(Debug, PartialEq, Eq)]
pub enum Record {
    Event(Event),
    /// Every event with a lower sequence number was published.
    Published {
        below: u64,
    },
}

/// A usage event, with the idempotent answer committed with it, if any.
#[derive(Debug, PartialEq, Eq)]
pub struct Event {
    pub seq: u64,
    pub enqueued_at_ms: i64,
    pub key: String,
    pub payload: Vec<u8>,
    pub answer: Option<(Vec<u8>, Vec<u8>)>,
}

/// Appends an event record to `buf`.
pub fn encode_event(
    buf: &mut Vec<u8>,
    seq: u64,
    enqueued_at_ms: i64,
    key: &str,
    payload: &[u8],
    answer: Option<(&[u8], &[u8])>,
) -> io::Result<()> {
    let start = begin(buf);
    buf.push(EVENT);
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(&enqueued_at_ms.to_le_bytes());
    put_bytes(buf, key.as_bytes())?;
    put_bytes(buf, payload)?;
    match answer {
        None => buf.push(0),
        Some((k, v)) => {
            buf.push(1);
            put_bytes(buf, k)?;
            put_bytes(buf, v)?;
        }
    }
    finish(buf, start)
}

/// Appends a "published below `below`" record to `buf`.
pub fn encode_published(buf: &mut Vec<u8>, below: u64) -> io::Result<()> {
    let start = begin(buf);
    buf.push(PUBLISHED);
    buf.extend_from_slice(&below.to_le_bytes());
    finish(buf, start)
}

fn begin(buf: &mut Vec<u8>) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&[0; HEADER]);
    start
}

fn finish(buf: &mut [u8], start: usize) -> io::Result<()> {
    let body = &buf[start + HEADER..];
    let len = u32::try_from(body.len()).map_err(|_| too_long())?;
    let crc = crc32fast::hash(body);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

fn put_bytes(buf: &mut Vec<u8>, b: &[u8]) -> io::Result<()> {
    let len = u32::try_from(b.len()).map_err(|_| too_long())?;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(b);
    Ok(())
}

fn too_long() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "outbox record over 4 GiB")
}

/// Reads a record body; `None` for anything malformed.
fn decode(body: &[u8]) -> Option<Record> {
    let mut r = Fields(body);
    let record = match r.u8()? {
        EVENT => {
            let seq = r.u64()?;
            let enqueued_at_ms = r.u64()? as i64;
            let key = String::from_utf8(r.bytes()?.to_vec()).ok()?;
            let payload = r.bytes()?.to_vec();
            let answer = match r.u8()? {
                0 => None,
                _ => Some((r.bytes()?.to_vec(), r.bytes()?.to_vec())),
            };
            Record::Event(Event {
                seq,
                enqueued_at_ms,
                key,
                payload,
                answer,
            })
        }
        PUBLISHED => Record::Published { below: r.u64()? },
        _ => return None,
    };
    r.0.is_empty().then_some(record)
}

/// A cursor over a record body.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize;
        self.take(n)
    }
}

/// The file of segment `index`.
pub fn segment_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("{index:020}.log"))
}

/// Segment indexes in `dir`, oldest first.
pub fn list_segments(dir: &Path) -> io::Result<Vec<u64>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(index) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        found.push(index);
    }
    found.sort_unstable();
    Ok(found)
}

/// Creates segment `index`: `bytes` long, written with zeros and flushed,
/// its directory entry durable. Appends into it then overwrite blocks that
/// exist, and their flush carries data only. (Space that `fallocate` merely
/// reserves is not enough: the first write to each of its blocks changes
/// extent metadata that the flush must commit too; `gateway-capacity`
/// measures a 100-event group at ~0.17 ms that way against ~0.07 ms.)
pub fn create_segment(dir: &Path, index: u64, bytes: u64) -> io::Result<File> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(segment_path(dir, index))?;
    // Reserve it in one piece first: a full disk fails here, not mid-append.
    rustix::fs::fallocate(&file, FallocateFlags::empty(), 0, bytes)?;
    let mut at = 0;
    while at < bytes {
        let n = (bytes - at).min(ZEROS.len() as u64) as usize;
        file.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    file.sync_all()?;
    File::open(dir)?.sync_all()?;
    Ok(file)
}

/// Reads the records of `file` from `at` up to `end`, handing each to
/// `each(record_start, record)` until it returns false. Returns the offset
/// where the valid records end (or where `each` stopped).
pub fn read_records(
    file: &File,
    mut at: u64,
    end: u64,
    mut each: impl FnMut(u64, Record) -> bool,
) -> io::Result<u64> {
    let mut window = Window::default();
    loop {
        let Some(h) = window.get(file, at, HEADER, end)? else {
            return Ok(at);
        };
        let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        if len == 0 {
            return Ok(at);
        }
        let Some(body) = window.get(file, at + HEADER as u64, len, end)? else {
            return Ok(at);
        };
        if crc32fast::hash(body) != crc {
            return Ok(at);
        }
        let Some(record) = decode(body) else {
            return Ok(at);
        };
        if !each(at, record) {
            return Ok(at);
        }
        at += (HEADER + len) as u64;
    }
}

/// A piece of a file held in memory, so records are read a chunk at a time.
#[derive(Default)]
struct Window {
    start: u64,
    bytes: Vec<u8>,
}

impl Window {
    /// Bytes `at..at + len`, or `None` if they run past `end`.
    fn get(&mut self, file: &File, at: u64, len: usize, end: u64) -> io::Result<Option<&[u8]>> {
        let Some(stop) = at.checked_add(len as u64).filter(|s| *s <= end) else {
            return Ok(None);
        };
        if at < self.start || stop > self.start + self.bytes.len() as u64 {
            let want = (len.max(READ_CHUNK) as u64).min(end - at) as usize;
            self.bytes.resize(want, 0);
            file.read_exact_at(&mut self.bytes, at)?;
            self.start = at;
        }
        let from = (at - self.start) as usize;
        Ok(Some(&self.bytes[from..from + len]))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]

    use super::*;

    fn event(seq: u64, answer: bool) -> Event {
        Event {
            seq,
            enqueued_at_ms: 1_700_000_000_000 + seq as i64,
            key: format!("tenant-{seq}"),
            payload: vec![seq as u8; 300 + seq as usize],
            answer: answer.then(|| (b"k".to_vec(), vec![7; 5000])),
        }
    }

    fn write(dir: &Path, index: u64, events: &[Event], published: Option<u64>) -> File {
        let file = create_segment(dir, index, SEGMENT_BYTES).unwrap();
        let mut buf = Vec::new();
        for e in events {
            let answer = e.answer.as_ref().map(|(k, v)| (k.as_slice(), v.as_slice()));
            encode_event(
                &mut buf,
                e.seq,
                e.enqueued_at_ms,
                &e.key,
                &e.payload,
                answer,
            )
            .unwrap();
        }
        if let Some(below) = published {
            encode_published(&mut buf, below).unwrap();
        }
        file.write_all_at(&buf, 0).unwrap();
        file
    }

    fn read_all(file: &File) -> (Vec<Record>, u64) {
        let mut out = Vec::new();
        let end = read_records(file, 0, SEGMENT_BYTES, |_, r| {
            out.push(r);
            true
        })
        .unwrap();
        (out, end)
    }

    #[test]
    fn records_read_back_as_written_across_read_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let events: Vec<Event> = (0..400).map(|s| event(s, s % 7 == 0)).collect();
        let file = write(dir.path(), 3, &events, Some(120));
        let (records, end) = read_all(&file);
        assert_eq!(records.len(), 401);
        for (r, e) in records.iter().zip(&events) {
            assert_eq!(r, &Record::Event(event(e.seq, e.seq % 7 == 0)));
        }
        assert_eq!(records[400], Record::Published { below: 120 });
        assert!(end > READ_CHUNK as u64, "the test crosses chunk boundaries");
        assert_eq!(list_segments(dir.path()).unwrap(), vec![3]);
    }

    #[test]
    fn a_torn_record_ends_the_segment_and_hides_what_follows() {
        let dir = tempfile::tempdir().unwrap();
        let events: Vec<Event> = (0..3).map(|s| event(s, false)).collect();
        let file = write(dir.path(), 0, &events, None);
        let (_, end) = read_all(&file);
        // Flip a byte of the second record's body: its checksum fails.
        let second = HEADER as u64 + 1 + 8 + 8 + 4 + 8 + 4 + 300 + 1;
        let mut one = [0u8];
        file.read_exact_at(&mut one, second + HEADER as u64 + 20)
            .unwrap();
        file.write_all_at(&[one[0] ^ 0xff], second + HEADER as u64 + 20)
            .unwrap();
        let (records, torn_end) = read_all(&file);
        assert_eq!(records, vec![Record::Event(event(0, false))]);
        assert_eq!(torn_end, second);
        assert!(end > torn_end);
    }
}
