//! Parsing RMM-format allocation logs into a compact event list.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};

/// The header of an RMM log.
const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// How many warning messages a lenient parse keeps (all are counted).
const KEPT_WARNINGS: usize = 20;

/// What an event does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Allocate `size` bytes into the slot.
    Allocate,
    /// Free the slot's allocation.
    Free,
}

/// One compiled event: pointers became dense slot indices, streams and threads dense indices
/// into [`Trace::streams`] and [`Trace::threads`], so replay does no hashing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Bytes requested (for a free: the size of the allocation it frees).
    pub size: usize,
    /// The slot holding the allocation; slots are reused once freed, so there are as many as
    /// allocations ever live at once.
    pub slot: u32,
    /// Index into [`Trace::streams`].
    pub stream: u32,
    /// Index into [`Trace::threads`].
    pub thread: u32,
    /// Allocate or free.
    pub action: Action,
}

/// A parsed RMM log, ready to replay.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Where it came from (file name), for messages.
    pub source: String,
    /// The events in log order.
    pub events: Vec<TraceEvent>,
    /// Number of slots the events use.
    pub slot_count: usize,
    /// The logged stream handles, by stream index.
    pub streams: Vec<usize>,
    /// The logged thread ids, by thread index.
    pub threads: Vec<u64>,
    /// `allocate failure` rows in the log (not replayed: the workload never got that memory).
    pub logged_failures: usize,
    /// Rows with a null pointer (zero-byte allocations, frees of null): replayed as such (the
    /// resource returns null), never live.
    pub null_rows: usize,
    /// Lines skipped with a warning (lenient parsing only).
    pub warnings: usize,
    /// The first warnings' messages (`FILE:LINE: ...`).
    pub warning_messages: Vec<String>,
    /// The most bytes the log had live at once (sum of requested sizes).
    pub peak_requested_bytes: u128,
    /// Allocations the log never frees.
    pub unfreed_allocations: usize,
}

/// The longest line a log may have (an RMM log row is under 100 bytes).
pub const MAX_LINE_BYTES: usize = 4096;

/// Reads a log that may be gzip-compressed (recognised by its magic bytes).
fn open_reader(path: &str) -> Result<Box<dyn BufRead>> {
    let io = |e: std::io::Error| Error::Io {
        path: path.to_string(),
        message: e.to_string(),
    };
    let mut file = BufReader::new(std::fs::File::open(path).map_err(io)?);
    let head = file.fill_buf().map_err(io)?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok(Box::new(BufReader::with_capacity(
            1 << 16,
            flate2::read::MultiGzDecoder::new(file),
        )))
    } else {
        Ok(Box::new(file))
    }
}

/// Parses a pointer or stream column: `0x` hex (or bare hex), `0`, `(nil)`, `nil`, `nullptr`.
fn parse_handle(field: &str) -> Option<usize> {
    let f = field.trim();
    match f {
        "(nil)" | "nil" | "nullptr" | "NULL" => return Some(0),
        _ => {}
    }
    let digits = f
        .strip_prefix("0x")
        .or_else(|| f.strip_prefix("0X"))
        .unwrap_or(f);
    if digits.is_empty() {
        return None;
    }
    usize::from_str_radix(digits, 16).ok()
}

struct Parser<'a> {
    source: &'a str,
    lenient: bool,
    trace: Trace,
    /// Live pointer -> (slot, size).
    live: HashMap<usize, (u32, usize)>,
    free_slots: Vec<u32>,
    stream_index: HashMap<usize, u32>,
    thread_index: HashMap<u64, u32>,
    in_use: u128,
}

impl Parser<'_> {
    fn problem(&mut self, line_no: usize, message: String) -> Result<()> {
        let text = format!("{}:{}: {}", self.source, line_no, message);
        if self.lenient {
            self.trace.warnings += 1;
            if self.trace.warning_messages.len() < KEPT_WARNINGS {
                self.trace.warning_messages.push(text);
            }
            Ok(())
        } else {
            Err(Error::invalid("log", text))
        }
    }

    fn index_of_stream(&mut self, stream: usize) -> u32 {
        let next = self.trace.streams.len() as u32;
        *self.stream_index.entry(stream).or_insert_with(|| {
            self.trace.streams.push(stream);
            next
        })
    }

    fn index_of_thread(&mut self, thread: u64) -> u32 {
        let next = self.trace.threads.len() as u32;
        *self.thread_index.entry(thread).or_insert_with(|| {
            self.trace.threads.push(thread);
            next
        })
    }

    fn take_slot(&mut self) -> Result<u32> {
        if let Some(s) = self.free_slots.pop() {
            return Ok(s);
        }
        let s = u32::try_from(self.trace.slot_count).map_err(|_| {
            Error::invalid("log", format!("{}: too many live allocations", self.source))
        })?;
        self.trace.slot_count += 1;
        Ok(s)
    }

    /// A row with a null pointer: an event on a slot that is free again at once.
    fn null_event(&mut self, action: Action, stream: usize, thread: u64) -> Result<()> {
        self.trace.null_rows += 1;
        let slot = self.take_slot()?;
        self.free_slots.push(slot);
        let event = TraceEvent {
            size: 0,
            slot,
            stream: self.index_of_stream(stream),
            thread: self.index_of_thread(thread),
            action,
        };
        self.trace.events.push(event);
        Ok(())
    }

    fn line(&mut self, line_no: usize, line: &str) -> Result<()> {
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != 6 {
            return self.problem(
                line_no,
                format!(
                    "malformed line: expected 6 comma-separated fields ({HEADER}), found {}",
                    fields.len()
                ),
            );
        }
        let Ok(thread) = fields[0].trim().parse::<u64>() else {
            return self.problem(line_no, format!("malformed thread id {:?}", fields[0]));
        };
        if fields[1].trim().is_empty() {
            return self.problem(line_no, "malformed line: empty time".to_string());
        }
        let Some(ptr) = parse_handle(fields[3]) else {
            return self.problem(line_no, format!("malformed pointer {:?}", fields[3]));
        };
        let Ok(size) = fields[4].trim().parse::<usize>() else {
            return self.problem(line_no, format!("malformed size {:?}", fields[4]));
        };
        let Some(stream) = parse_handle(fields[5]) else {
            return self.problem(line_no, format!("malformed stream {:?}", fields[5]));
        };
        match fields[2].trim() {
            "allocate" => {
                if ptr == 0 {
                    if size == 0 {
                        // A zero-byte allocation (null pointer): replayed, never live.
                        return self.null_event(Action::Allocate, stream, thread);
                    }
                    return self.problem(
                        line_no,
                        format!("allocate of {size} bytes logged with a null pointer"),
                    );
                }
                if self.live.contains_key(&ptr) {
                    return self.problem(
                        line_no,
                        format!("allocate of pointer {ptr:#x}, which is already allocated"),
                    );
                }
                let slot = self.take_slot()?;
                self.live.insert(ptr, (slot, size));
                self.in_use += size as u128;
                self.trace.peak_requested_bytes = self.trace.peak_requested_bytes.max(self.in_use);
                let event = TraceEvent {
                    size,
                    slot,
                    stream: self.index_of_stream(stream),
                    thread: self.index_of_thread(thread),
                    action: Action::Allocate,
                };
                self.trace.events.push(event);
            }
            "free" => {
                if ptr == 0 {
                    // Freeing null is a no-op; replayed as one.
                    return self.null_event(Action::Free, stream, thread);
                }
                let Some(&(slot, allocated)) = self.live.get(&ptr) else {
                    return self.problem(
                        line_no,
                        format!("free of pointer {ptr:#x}, which was never allocated (or is already freed)"),
                    );
                };
                if allocated != size {
                    // Leniently, free with the allocated size (what the resource needs).
                    self.problem(
                        line_no,
                        format!("free of pointer {ptr:#x} with size {size}, allocated with size {allocated}"),
                    )?;
                }
                self.live.remove(&ptr);
                self.free_slots.push(slot);
                self.in_use -= allocated as u128;
                let event = TraceEvent {
                    size: allocated,
                    slot,
                    stream: self.index_of_stream(stream),
                    thread: self.index_of_thread(thread),
                    action: Action::Free,
                };
                self.trace.events.push(event);
            }
            "allocate failure" => {
                self.trace.logged_failures += 1;
            }
            other => {
                return self.problem(
                    line_no,
                    format!(
                        "unknown action {other:?} (expected allocate, free or allocate failure)"
                    ),
                );
            }
        }
        Ok(())
    }
}

impl Trace {
    /// Parses the RMM-format log at `path` (plain or gzip-compressed CSV). With `lenient`, bad
    /// lines are skipped and counted in [`Trace::warnings`]; otherwise the first one is an error.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read; [`Error::InvalidArgument`] with a
    /// `FILE:LINE: ...` message for a missing header, a malformed line, an unknown action, a free
    /// of a pointer that is not allocated, or a double allocation.
    ///
    /// # Time Complexity
    /// O(lines).
    pub fn from_path(path: &str, lenient: bool) -> Result<Trace> {
        let reader = open_reader(path)?;
        Self::from_reader(path, reader, lenient)
    }

    /// Parses an RMM-format log from `reader` (uncompressed); `source` names it in messages.
    ///
    /// # Errors
    /// As [`Trace::from_path`].
    pub fn from_reader(source: &str, reader: impl Read, lenient: bool) -> Result<Trace> {
        let mut reader = BufReader::new(reader);
        let mut parser = Parser {
            source,
            lenient,
            trace: Trace {
                source: source.to_string(),
                ..Trace::default()
            },
            live: HashMap::new(),
            free_slots: Vec::new(),
            stream_index: HashMap::new(),
            thread_index: HashMap::new(),
            in_use: 0,
        };
        let mut buf = Vec::with_capacity(128);
        let mut line_no = 0usize;
        let mut seen_header = false;
        loop {
            buf.clear();
            // At most one byte past the longest line, so a file without newlines (a binary file,
            // /dev/zero) is an error after a few KiB instead of being read whole.
            let n = (&mut reader)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|e| Error::Io {
                    path: source.to_string(),
                    message: e.to_string(),
                })?;
            if n == 0 {
                break;
            }
            line_no += 1;
            if buf.len() > MAX_LINE_BYTES && buf.last() != Some(&b'\n') {
                return Err(Error::invalid(
                    "log",
                    format!(
                        "{source}:{line_no}: a line longer than {MAX_LINE_BYTES} bytes: not an \
                         RMM log"
                    ),
                ));
            }
            let Ok(text) = std::str::from_utf8(&buf) else {
                parser.problem(line_no, "line is not valid UTF-8".to_string())?;
                continue;
            };
            let text = text
                .trim_start_matches('\u{feff}')
                .trim_end_matches(['\n', '\r']);
            if text.trim().is_empty() {
                continue;
            }
            if !seen_header {
                seen_header = true;
                if text.trim() == HEADER {
                    continue;
                }
                return Err(Error::invalid(
                    "log",
                    format!("{source}:{line_no}: not an RMM log: expected the header {HEADER:?}"),
                ));
            }
            parser.line(line_no, text)?;
        }
        if !seen_header {
            return Err(Error::invalid(
                "log",
                format!("{source}:1: empty log: expected the header {HEADER:?}"),
            ));
        }
        parser.trace.unfreed_allocations = parser.live.len();
        Ok(parser.trace)
    }

    /// Number of allocate events.
    pub fn allocations(&self) -> usize {
        self.events
            .iter()
            .filter(|e| e.action == Action::Allocate)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, lenient: bool) -> Result<Trace> {
        Trace::from_reader("t.csv", text.as_bytes(), lenient)
    }

    /// A hand-written sample with RMM's exact formatting (current RMM: `%p` pointers, `(nil)`
    /// on failures, streams as C++ writes pointers; older RMM: `0x0`).
    const RMM_SAMPLE: &str = "Thread,Time,Action,Pointer,Size,Stream\n\
        2931,14:02:11.123456,allocate,0x7f2d4a000000,1048576,0\n\
        2931,14:02:11.123501,allocate,0x7f2d4a100000,256,0x55f1c3e2a8b0\n\
        2932,14:02:11.123600,allocate failure,(nil),1099511627776,0\n\
        2932,14:02:11.123610,allocate failure,0x0,1099511627776,0x0\n\
        2931,14:02:11.123700,free,0x7f2d4a000000,1048576,0\n\
        2932,14:02:11.123800,allocate,0x7f2d4a000000,4096,0x55f1c3e2a8b0\n\
        2931,14:02:11.123900,free,0x7f2d4a100000,256,0x55f1c3e2a8b0\n";

    /// Issue 18: a line without a newline (`/dev/zero`) was read whole into memory.
    #[test]
    fn endless_lines_are_an_error_after_a_few_kib() {
        struct Zeros(usize);
        impl std::io::Read for Zeros {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                self.0 += buf.len();
                assert!(self.0 < 1 << 20, "read far past the longest line");
                buf.fill(0);
                Ok(buf.len())
            }
        }
        let e = Trace::from_reader("zeros", Zeros(0), true).unwrap_err();
        assert!(e.to_string().contains("longer than 4096"), "{e}");
        let long = format!(
            "{HEADER}\n1,00:00:00.000000,allocate,0x1,{},0\n",
            "1".repeat(5000)
        );
        assert!(parse(&long, true).is_err());
    }

    #[test]
    fn parses_rmm_sample() {
        let t = parse(RMM_SAMPLE, false).unwrap();
        assert_eq!(t.events.len(), 5);
        assert_eq!(t.logged_failures, 2);
        assert_eq!(t.streams, vec![0, 0x55f1_c3e2_a8b0]);
        assert_eq!(t.threads, vec![2931, 2932]);
        assert_eq!(t.slot_count, 2);
        assert_eq!(t.peak_requested_bytes, 1_048_576 + 256);
        assert_eq!(t.unfreed_allocations, 1);
        assert_eq!(
            t.events[3],
            TraceEvent {
                size: 4096,
                slot: 0,
                stream: 1,
                thread: 1,
                action: Action::Allocate
            }
        );
        assert_eq!(t.allocations(), 3);
    }

    #[test]
    fn crlf_bom_blank_lines_and_null_rows_are_accepted() {
        let text = "\u{feff}Thread,Time,Action,Pointer,Size,Stream\r\n\r\n\
            1,00:00:00.000000,allocate,(nil),0,0\r\n\
            1,00:00:00.000001,free,(nil),0,0\r\n\
            1,00:00:00.000002,allocate,7a00,10,0\r\n";
        let t = parse(text, false).unwrap();
        assert_eq!(t.events.len(), 3);
        assert_eq!(t.null_rows, 2);
        assert_eq!(t.slot_count, 1);
        assert_eq!(t.unfreed_allocations, 1);
    }

    fn expect_error(body: &str, line: usize, needle: &str) {
        let text = format!("{HEADER}\n1,00:00:00.000000,allocate,0x100,10,0\n{body}\n");
        let err = parse(&text, false).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{msg}");
        assert!(msg.contains(&format!("t.csv:{line}: ")), "{msg}");
        assert!(msg.contains(needle), "{msg}");
        let t = parse(&text, true).unwrap();
        assert_eq!(t.warnings, 1, "{body}");
        assert_eq!(t.warning_messages.len(), 1);
    }

    #[test]
    fn every_bad_input_is_an_error_naming_file_and_line() {
        // (the bad row, a word of its error); the row is the log's third line.
        let bad_rows = [
            ("1,00:00:00.1,allocate,0x200,10", "expected 6"),
            ("1,00:00:00.1,allocate,0x200,10,0,7", "expected 6"),
            ("x,00:00:00.1,allocate,0x200,10,0", "thread"),
            ("1,,allocate,0x200,10,0", "time"),
            ("1,00:00:00.1,allocate,0xZZ,10,0", "pointer"),
            ("1,00:00:00.1,allocate,0x200,-5,0", "size"),
            ("1,00:00:00.1,allocate,0x200,10,q", "stream"),
            ("1,00:00:00.1,reallocate,0x200,10,0", "unknown action"),
            ("1,00:00:00.1,free,0x300,10,0", "never allocated"),
            ("1,00:00:00.1,allocate,0x100,10,0", "already allocated"),
            ("1,00:00:00.1,free,0x100,11,0", "allocated with size 10"),
            ("1,00:00:00.1,allocate,(nil),10,0", "null pointer"),
        ];
        for (row, needle) in bad_rows {
            expect_error(row, 3, needle);
        }
    }

    #[test]
    fn double_free_is_an_error_and_lenient_skips_it() {
        let text = format!(
            "{HEADER}\n1,t,allocate,0x100,10,0\n1,t,free,0x100,10,0\n1,t,free,0x100,10,0\n"
        );
        let msg = parse(&text, false).unwrap_err().to_string();
        assert!(msg.contains("t.csv:4: free of pointer 0x100"), "{msg}");
        let t = parse(&text, true).unwrap();
        assert_eq!((t.events.len(), t.warnings), (2, 1));
    }

    #[test]
    fn header_is_required() {
        let msg = parse("1,t,allocate,0x100,10,0\n", true)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("t.csv:1: not an RMM log"), "{msg}");
        assert!(parse("", false)
            .unwrap_err()
            .to_string()
            .contains("empty log"));
        let bad_utf8: &[u8] = b"Thread,Time,Action,Pointer,Size,Stream\n\xff\xfe\n";
        let err = Trace::from_reader("b.csv", bad_utf8, false).unwrap_err();
        assert!(err.to_string().contains("b.csv:2: line is not valid UTF-8"));
    }

    #[test]
    fn lenient_counts_all_warnings_but_keeps_a_few() {
        let mut text = format!("{HEADER}\n");
        for _ in 0..50 {
            text.push_str("garbage\n");
        }
        let t = parse(&text, true).unwrap();
        assert_eq!(t.warnings, 50);
        assert_eq!(t.warning_messages.len(), KEPT_WARNINGS);
    }

    #[test]
    fn reads_gzip_and_plain_files_and_reports_missing_ones() {
        use std::io::Write;
        let dir = std::env::temp_dir();
        let plain = dir.join(format!("rrmm-trace-{}.csv", std::process::id()));
        let gz = dir.join(format!("rrmm-trace-{}.csv.gz", std::process::id()));
        std::fs::write(&plain, RMM_SAMPLE).unwrap();
        let mut enc = flate2::write::GzEncoder::new(
            std::fs::File::create(&gz).unwrap(),
            flate2::Compression::fast(),
        );
        enc.write_all(RMM_SAMPLE.as_bytes()).unwrap();
        enc.finish().unwrap();
        let a = Trace::from_path(plain.to_str().unwrap(), false).unwrap();
        let b = Trace::from_path(gz.to_str().unwrap(), false).unwrap();
        assert_eq!(a.events, b.events);
        let _ = std::fs::remove_file(&plain);
        let _ = std::fs::remove_file(&gz);
        assert!(matches!(
            Trace::from_path("/nonexistent/x.csv", false),
            Err(Error::Io { .. })
        ));
    }
}
