//! One row of RMM's allocation log (`Thread,Time,Action,Pointer,Size,Stream`), as the logging
//! adaptor writes it and `rrmm replay` reads it.

use crate::cuda::Stream;
use chrono::{DateTime, Local, Timelike, Utc};
use std::fmt::Write as _;

/// The CSV header RMM's logging adaptor writes (and replay expects).
pub const LOG_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// Appends one row (with its newline) to `out`: the OS thread id, the local time of day of
/// `time` with microseconds, the action, the pointer as `%p` writes it (`0x...`, `(nil)` for
/// null), the size, and the stream as C++ streams write a pointer (`0` for the default stream,
/// else `0x...`).
pub(crate) fn format_row(
    out: &mut String,
    thread: u64,
    time: DateTime<Local>,
    action: &str,
    ptr: usize,
    bytes: usize,
    stream: Stream,
) {
    let _ = write!(
        out,
        "{thread},{:02}:{:02}:{:02}.{:06},{action},",
        time.hour(),
        time.minute(),
        time.second(),
        // A leap second shows as 60.xxx in `second()`'s place; chrono keeps it in the fraction.
        (time.nanosecond() / 1_000) % 1_000_000
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

/// The local time now (the time zone of `$TZ` or the system's, as chrono finds it).
pub(crate) fn now() -> DateTime<Local> {
    Utc::now().with_timezone(&Local)
}

/// The OS thread id (what RMM's `%t` writes), cached per thread; elsewhere than Linux a
/// process-unique counter.
pub(crate) fn thread_id() -> u64 {
    thread_local! {
        // Why process-wide: the OS id of a thread is asked once per thread, not once per row.
        static TID: u64 = os_thread_id();
    }
    TID.with(|t| *t)
}

#[cfg(target_os = "linux")]
fn os_thread_id() -> u64 {
    rustix::thread::gettid()
        .as_raw_nonzero()
        .get()
        .unsigned_abs()
        .into()
}

#[cfg(not(target_os = "linux"))]
fn os_thread_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    // Why process-wide: without gettid, thread ids are numbered across the whole process.
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn rows_have_rmm_format() {
        let mut s = String::new();
        let time = Local
            .with_ymd_and_hms(2024, 7, 1, 2, 9, 58)
            .earliest()
            .unwrap()
            + chrono::Duration::microseconds(56_359);
        format_row(
            &mut s,
            408,
            time,
            "allocate",
            0x7f46_3600_0000,
            16_384_000,
            Stream::DEFAULT,
        );
        assert_eq!(
            s,
            "408,02:09:58.056359,allocate,0x7f4636000000,16384000,0\n"
        );
        s.clear();
        format_row(
            &mut s,
            1,
            time,
            "allocate failure",
            0,
            5,
            // SAFETY: only formatted, never passed to the driver.
            unsafe { Stream::from_raw(0xabc) },
        );
        assert_eq!(s, "1,02:09:58.056359,allocate failure,(nil),5,0xabc\n");
    }

    #[test]
    fn thread_ids_differ_between_threads_and_stay_put() {
        let here = thread_id();
        assert_eq!(here, thread_id());
        let there = std::thread::spawn(thread_id).join().unwrap();
        assert_ne!(here, there);
        assert_ne!(here, 0);
    }
}
