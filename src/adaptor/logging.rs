//! An adaptor that logs every allocation and free to a CSV file, in RMM's format.

use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::resource::{MemoryResource, SharedResource};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// The CSV header RMM's logging adaptor writes (and replay expects).
pub const LOG_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// Logs each allocation and free through it as one CSV row of RMM's format (RMM's
/// `logging_resource_adaptor`), so the log can be replayed by rrmm or by RMM's tools:
///
/// ```text
/// Thread,Time,Action,Pointer,Size,Stream
/// 408,02:09:58.056359,allocate,0x7f4636000000,16384000,0
/// 408,02:09:58.071784,free,0x7f4636000000,16384000,0x55d0c2a1e0f0
/// ```
///
/// Thread is the OS thread id, Time the local time of day with microseconds, Action one of
/// `allocate`, `free`, `allocate failure`; the pointer is written as `%p` writes it (`0x...`,
/// `(nil)` for null: failures log a null pointer) and the stream as C++ streams write a pointer
/// (`0` for the default stream, else `0x...`).
///
/// Rows are formatted outside the lock; the lock covers one buffered write.
pub struct LoggingResourceAdaptor {
    upstream: SharedResource,
    file_name: String,
    auto_flush: bool,
    writer: Mutex<BufWriter<File>>,
}

fn io_error(path: &str, e: std::io::Error) -> Error {
    Error::Io {
        path: path.to_string(),
        message: e.to_string(),
    }
}

impl LoggingResourceAdaptor {
    /// An adaptor over `upstream` logging to `path` (created or truncated, header written at
    /// once). `auto_flush` flushes after every row.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be created or written.
    pub fn new(upstream: SharedResource, path: &str, auto_flush: bool) -> Result<Self> {
        let file = File::create(path).map_err(|e| io_error(path, e))?;
        let mut writer = BufWriter::with_capacity(1 << 16, file);
        writer
            .write_all(LOG_HEADER.as_bytes())
            .and_then(|()| writer.write_all(b"\n"))
            .and_then(|()| writer.flush())
            .map_err(|e| io_error(path, e))?;
        Ok(LoggingResourceAdaptor {
            upstream,
            file_name: path.to_string(),
            auto_flush,
            writer: Mutex::new(writer),
        })
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    /// The log file's path.
    pub fn file_name(&self) -> &str {
        &self.file_name
    }

    /// Writes buffered rows to the file.
    ///
    /// # Errors
    /// [`Error::Io`] when the write fails.
    pub fn flush(&self) -> Result<()> {
        self.writer
            .lock()
            .flush()
            .map_err(|e| io_error(&self.file_name, e))
    }

    /// Formats one row (outside any lock) and writes it with one locked write. Logging is a
    /// side channel: a failed write does not fail the allocation.
    fn log(&self, action: &str, ptr: usize, bytes: usize, stream: Stream) {
        thread_local! {
            static LINE: RefCell<String> = RefCell::new(String::with_capacity(96));
        }
        LINE.with(|line| {
            let Ok(mut line) = line.try_borrow_mut() else {
                return;
            };
            line.clear();
            format_row(
                &mut line,
                thread_id(),
                now_micros(),
                action,
                ptr,
                bytes,
                stream,
            );
            let mut writer = self.writer.lock();
            let _ = writer.write_all(line.as_bytes());
            if self.auto_flush {
                let _ = writer.flush();
            }
        });
    }
}

/// Appends one row of RMM's log format (with its newline) to `out`.
fn format_row(
    out: &mut String,
    thread: u64,
    unix_micros: i64,
    action: &str,
    ptr: usize,
    bytes: usize,
    stream: Stream,
) {
    let local = unix_micros + local_offset_seconds(unix_micros.div_euclid(1_000_000)) * 1_000_000;
    let micros_of_day = local.rem_euclid(86_400 * 1_000_000);
    let secs = micros_of_day / 1_000_000;
    let _ = write!(
        out,
        "{thread},{:02}:{:02}:{:02}.{:06},{action},",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60,
        micros_of_day % 1_000_000
    );
    if ptr == 0 {
        out.push_str("(nil)");
    } else {
        let _ = write!(out, "{ptr:#x}");
    }
    let _ = write!(out, ",{bytes},");
    if stream.raw() == 0 {
        out.push('0');
    } else {
        let _ = write!(out, "{:#x}", stream.raw());
    }
    out.push('\n');
}

fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// The OS thread id (what RMM's `%t` writes), cached per thread. Read from `/proc/thread-self`
/// (a link to `PID/task/TID`); elsewhere a process-unique counter.
fn thread_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TID: u64 = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse().ok())
            .unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed));
    }
    TID.with(|t| *t)
}

/// The local time zone: transitions (unix seconds, UTC offset from then on) and the offset
/// before the first transition; read once from the TZif file of `$TZ` or `/etc/localtime`.
struct Zone {
    transitions: Vec<(i64, i64)>,
    initial: i64,
}

fn local_offset_seconds(unix_seconds: i64) -> i64 {
    static ZONE: OnceLock<Zone> = OnceLock::new();
    let zone = ZONE.get_or_init(load_zone);
    let i = zone
        .transitions
        .partition_point(|&(t, _)| t <= unix_seconds);
    if i == 0 {
        zone.initial
    } else {
        zone.transitions[i - 1].1
    }
}

fn load_zone() -> Zone {
    let utc = Zone {
        transitions: Vec::new(),
        initial: 0,
    };
    let path = match std::env::var("TZ") {
        Ok(tz) if !tz.is_empty() => {
            let name = tz.trim_start_matches(':');
            if name.starts_with('/') {
                name.to_string()
            } else {
                format!("/usr/share/zoneinfo/{name}")
            }
        }
        _ => "/etc/localtime".to_string(),
    };
    std::fs::read(path)
        .ok()
        .and_then(|data| parse_tzif(&data))
        .unwrap_or(utc)
}

/// Parses the transitions of a TZif file (RFC 8536), using the 64-bit block of version 2+.
fn parse_tzif(data: &[u8]) -> Option<Zone> {
    fn be32(d: &[u8], at: usize) -> Option<i64> {
        let b = d.get(at..at + 4)?;
        Some(i64::from(i32::from_be_bytes([b[0], b[1], b[2], b[3]])))
    }
    fn counts(d: &[u8]) -> Option<[usize; 6]> {
        if d.get(0..4)? != b"TZif" {
            return None;
        }
        let mut c = [0usize; 6];
        for (k, slot) in c.iter_mut().enumerate() {
            *slot = usize::try_from(be32(d, 20 + 4 * k)?).ok()?;
        }
        Some(c) // isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt
    }
    let c = counts(data)?;
    let v1_len = 44 + c[3] * 5 + c[4] * 6 + c[5] + c[2] * 8 + c[1] + c[0];
    let (d, time_size) = if data.get(4).copied().unwrap_or(0) >= b'2' {
        (data.get(v1_len..)?, 8usize)
    } else {
        (data, 4usize)
    };
    let [_, _, _, timecnt, typecnt, _] = counts(d)?;
    let times_at = 44;
    let idx_at = times_at + timecnt * time_size;
    let types_at = idx_at + timecnt;
    let utoff = |t: usize| be32(d, types_at + 6 * t);
    let mut transitions = Vec::with_capacity(timecnt);
    for k in 0..timecnt {
        let at = times_at + k * time_size;
        let time = if time_size == 8 {
            let b = d.get(at..at + 8)?;
            i64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
        } else {
            be32(d, at)?
        };
        let t = usize::from(*d.get(idx_at + k)?);
        if t >= typecnt {
            return None;
        }
        transitions.push((time, utoff(t)?));
    }
    let initial = if typecnt > 0 { utoff(0)? } else { 0 };
    Some(Zone {
        transitions,
        initial,
    })
}

/// The log file for `device`: `name`, or `$RMM_LOG_FILE` when `name` is `None`, with `.dev{N}`
/// inserted before the extension (`rmm_log.csv` -> `rmm_log.dev0.csv`), as RMM's Python
/// `_append_id` does.
///
/// # Errors
/// [`Error::InvalidArgument`] (Python `ValueError`) when there is neither a name nor
/// `RMM_LOG_FILE`.
pub fn log_file_for_device(name: Option<&str>, device: usize) -> Result<String> {
    let base = match name {
        Some(n) => n.to_string(),
        None => std::env::var("RMM_LOG_FILE").map_err(|_| {
            Error::invalid(
                "log_file_name",
                "RMM logging requested without an explicit file name, but RMM_LOG_FILE is unset",
            )
        })?,
    };
    let (stem, ext) = split_extension(&base);
    Ok(format!("{stem}.dev{device}{ext}"))
}

/// Python's `os.path.splitext` on POSIX paths: the extension starts at the last dot of the
/// file name, unless the name is only dots before it (`.bashrc` has none).
fn split_extension(path: &str) -> (&str, &str) {
    let name_start = path.rfind('/').map_or(0, |i| i + 1);
    if let Some(dot) = path.rfind('.') {
        if dot > name_start && path[name_start..dot].bytes().any(|b| b != b'.') {
            return (&path[..dot], &path[dot..]);
        }
    }
    (path, "")
}

impl MemoryResource for LoggingResourceAdaptor {
    /// Allocates from the upstream and logs `allocate`, or `allocate failure` (with a null
    /// pointer) before returning the upstream's error.
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        match self.upstream.allocate(bytes, stream) {
            Ok(ptr) => {
                self.log("allocate", ptr, bytes, stream);
                Ok(ptr)
            }
            Err(e) => {
                self.log("allocate failure", 0, bytes, stream);
                Err(e)
            }
        }
    }

    /// Logs `free`, then frees through the upstream.
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        self.log("free", ptr, bytes, stream);
        // SAFETY: the caller's contract (this resource hands out the upstream's pointers unchanged).
        unsafe { self.upstream.deallocate(ptr, bytes, stream) }
    }

    forward_upstream_info!();

    fn name(&self) -> &'static str {
        "logging"
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_send_sync, simulated};
    use super::*;

    fn temp_path(tag: &str) -> String {
        let dir = std::env::temp_dir();
        dir.join(format!("rrmm-log-{tag}-{}.csv", std::process::id()))
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn rows_have_rmm_format() {
        let mut s = String::new();
        let t = (2 * 3600 + 9 * 60 + 58) * 1_000_000 + 56_359;
        format_row(
            &mut s,
            408,
            t,
            "allocate",
            0x7f46_3600_0000,
            16_384_000,
            Stream::DEFAULT,
        );
        let expected_time = {
            let local = t + local_offset_seconds(t / 1_000_000) * 1_000_000;
            let secs = local / 1_000_000 % 86_400;
            format!(
                "{:02}:{:02}:{:02}.056359",
                secs / 3600,
                secs / 60 % 60,
                secs % 60
            )
        };
        assert_eq!(
            s,
            format!("408,{expected_time},allocate,0x7f4636000000,16384000,0\n")
        );
        s.clear();
        format_row(
            &mut s,
            1,
            0,
            "allocate failure",
            0,
            5,
            // SAFETY: only formatted, never passed to the driver.
            unsafe { Stream::from_raw(0xabc) },
        );
        assert!(s.ends_with(",allocate failure,(nil),5,0xabc\n"), "{s}");
    }

    #[test]
    fn logs_allocations_frees_and_failures() {
        assert_send_sync::<LoggingResourceAdaptor>();
        let path = temp_path("basic");
        let mr = LoggingResourceAdaptor::new(simulated(), &path, false).unwrap();
        assert_eq!(mr.file_name(), path);
        // SAFETY: a key only: simulated memory never passes it to the driver.
        let s = unsafe { Stream::from_raw(0x1000) };
        let p = mr.allocate(1000, s).unwrap();
        assert!(mr.allocate(2 << 20, Stream::DEFAULT).is_err());
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(p, 1000, s) }.unwrap();
        mr.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], LOG_HEADER);
        assert_eq!(lines.len(), 4);
        let fields: Vec<Vec<&str>> = lines[1..].iter().map(|l| l.split(',').collect()).collect();
        assert_eq!(
            fields[0][2..],
            ["allocate", &format!("{p:#x}"), "1000", "0x1000"]
        );
        assert_eq!(
            fields[1][2..],
            ["allocate failure", "(nil)", "2097152", "0"]
        );
        assert_eq!(
            fields[2][2..],
            ["free", &format!("{p:#x}"), "1000", "0x1000"]
        );
        let tid: u64 = fields[0][0].parse().unwrap();
        assert_eq!(tid, thread_id());
        let time = fields[0][1];
        assert_eq!(time.len(), 15);
        assert_eq!(&time[2..3], ":");
        assert_eq!(&time[8..9], ".");
        drop(mr);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn auto_flush_writes_each_row() {
        let path = temp_path("flush");
        let mr = LoggingResourceAdaptor::new(simulated(), &path, true).unwrap();
        let p = mr.allocate(10, Stream::DEFAULT).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(p, 10, Stream::DEFAULT) }.unwrap();
        drop(mr);
        let _ = std::fs::remove_file(&path);
        assert!(LoggingResourceAdaptor::new(simulated(), "/nonexistent/dir/x.csv", false).is_err());
    }

    #[test]
    fn device_file_names_follow_rmm() {
        assert_eq!(
            log_file_for_device(Some("rmm_log.csv"), 0).unwrap(),
            "rmm_log.dev0.csv"
        );
        assert_eq!(
            log_file_for_device(Some("/a.b/log"), 3).unwrap(),
            "/a.b/log.dev3"
        );
        assert_eq!(
            log_file_for_device(Some("x.tar.gz"), 1).unwrap(),
            "x.tar.dev1.gz"
        );
        assert_eq!(
            log_file_for_device(Some(".hidden"), 1).unwrap(),
            ".hidden.dev1"
        );
        assert_eq!(log_file_for_device(Some("d/..x"), 1).unwrap(), "d/..x.dev1");
        // The environment variable is read only when no name is given.
        if std::env::var_os("RMM_LOG_FILE").is_none() {
            assert!(matches!(
                log_file_for_device(None, 0),
                Err(Error::InvalidArgument { .. })
            ));
        }
    }

    #[test]
    fn tzif_parsing_handles_garbage() {
        assert!(parse_tzif(b"nope").is_none());
        assert!(parse_tzif(b"TZif2").is_none());
        if let Ok(data) = std::fs::read("/usr/share/zoneinfo/Europe/Paris") {
            let zone = parse_tzif(&data).unwrap();
            // 2024-07-01T00:00:00Z is summer time in Paris: UTC+2.
            let i = zone
                .transitions
                .partition_point(|&(t, _)| t <= 1_719_792_000);
            assert_eq!(zone.transitions[i - 1].1, 7200);
        }
    }
}
