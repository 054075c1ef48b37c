//! An adaptor that logs every allocation and free to a CSV file, in RMM's format (the row is
//! `log_row`'s job; the file's name is the caller's: RMM-Python's `.dev{N}` naming lives in
//! `rrmm._logging`).

use super::log_row::{format_row, now, thread_id, LOG_HEADER};
use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::resource::{MemoryResource, SharedResource};
use parking_lot::Mutex;
use std::cell::RefCell;
use std::fs::File;
use std::io::{BufWriter, Write as _};

/// The allocation-log file of `device` (RMM's naming, as its Python `_append_id` does): `name`
/// (`$RMM_LOG_FILE` when `None`) with `.dev{device}` inserted before the extension
/// (`rmm_log.csv` -> `rmm_log.dev0.csv`; the extension is what follows the last dot of the file's
/// name, leading dots not counted, as Python's `os.path.splitext`).
///
/// # Errors
/// [`Error::InvalidArgument`] naming `log_file_name` when there is neither a name nor
/// `RMM_LOG_FILE`, or the name is empty.
pub fn log_file_for_device(name: Option<&str>, device: usize) -> Result<String> {
    let name = match name {
        Some(name) => name.to_string(),
        None => std::env::var("RMM_LOG_FILE").map_err(|_| {
            Error::invalid(
                "log_file_name",
                "RMM logging requested without an explicit file name, but RMM_LOG_FILE is unset",
            )
        })?,
    };
    if name.is_empty() {
        return Err(Error::invalid("log_file_name", "must not be empty"));
    }
    let base_start = name.rfind('/').map_or(0, |i| i + 1);
    let base = &name[base_start..];
    let leading = base.len() - base.trim_start_matches('.').len();
    let dot = base[leading..].rfind('.').map(|i| base_start + leading + i);
    Ok(match dot {
        Some(dot) => format!("{}.dev{device}{}", &name[..dot], &name[dot..]),
        None => format!("{name}.dev{device}"),
    })
}

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
            // Why process-wide: a line buffer per thread: a row allocates nothing, locks nothing.
            static LINE: RefCell<String> = RefCell::new(String::with_capacity(96));
        }
        LINE.with(|line| {
            let Ok(mut line) = line.try_borrow_mut() else {
                return;
            };
            line.clear();
            format_row(&mut line, thread_id(), now(), action, ptr, bytes, stream);
            let mut writer = self.writer.lock();
            let _ = writer.write_all(line.as_bytes());
            if self.auto_flush {
                let _ = writer.flush();
            }
        });
    }
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

    // Writes the log file.
    forward_upstream_info!(and BLOCKING);

    fn name(&self) -> &'static str {
        "logging"
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_send_sync, simulated, temp_log_path};
    use super::*;

    /// RMM-Python's `_append_id` cases (`os.path.splitext` semantics).
    #[test]
    fn the_device_goes_before_the_extension() {
        for (name, device, want) in [
            ("rmm_log.csv", 0, "rmm_log.dev0.csv"),
            ("/a.b/log", 3, "/a.b/log.dev3"),
            ("x.tar.gz", 1, "x.tar.dev1.gz"),
            (".hidden", 1, ".hidden.dev1"),
            ("d/..x", 1, "d/..x.dev1"),
            ("d/.a.csv", 2, "d/.a.dev2.csv"),
            ("a.", 0, "a.dev0."),
        ] {
            assert_eq!(
                log_file_for_device(Some(name), device).unwrap(),
                want,
                "{name}"
            );
        }
        assert!(log_file_for_device(Some(""), 0).is_err());
    }

    #[test]
    fn logs_allocations_frees_and_failures() {
        assert_send_sync::<LoggingResourceAdaptor>();
        let path = temp_log_path("basic");
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
        let path = temp_log_path("flush");
        let mr = LoggingResourceAdaptor::new(simulated(), &path, true).unwrap();
        let p = mr.allocate(10, Stream::DEFAULT).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2);
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(p, 10, Stream::DEFAULT) }.unwrap();
        drop(mr);
        let _ = std::fs::remove_file(&path);
        assert!(LoggingResourceAdaptor::new(simulated(), "/nonexistent/dir/x.csv", false).is_err());
    }
}
