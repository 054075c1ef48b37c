//! A pinned host range made the fast way: reserved, committed on the GPU's NUMA node with huge
//! pages, faulted in by several threads, then registered with CUDA (`cuMemHostRegister`).
//! Unregistered and unmapped on drop.

use crate::cuda;
use crate::error::{Error, Result};
use crate::os::host_pages::{
    available_host_memory, check_host_room, numa_node_of, Commit, Reservation, HUGE_PAGE,
    SMALL_PAGE,
};
use std::time::Instant;

/// How one [`PinnedPages`] was made: seconds per step and what each did, to tell where a slow
/// pinned pool spends its start-up ([`PinnedPages::startup`]; a pinned resource's latest,
/// `PinnedHostMemoryResource.startup()` in Python).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct PinnedStartup {
    /// Bytes asked for.
    pub bytes: usize,
    /// Bytes committed, faulted in and registered (whole huge pages from 2 MiB).
    pub committed_bytes: usize,
    /// Seconds to check the host's room and reserve the addresses (`mmap`).
    pub reserve_s: f64,
    /// Seconds of `mprotect` to read-write.
    pub protect_s: f64,
    /// Seconds of `madvise(MADV_HUGEPAGE)`.
    pub madvise_s: f64,
    /// Seconds of `mbind` to the NUMA node.
    pub numa_bind_s: f64,
    /// Seconds to fault every page in, from `touch_threads` threads.
    pub touch_s: f64,
    /// Seconds of `cuMemHostRegister`.
    pub register_s: f64,
    /// Seconds of the whole construction.
    pub total_s: f64,
    /// Threads that faulted the pages in.
    pub touch_threads: usize,
    /// Whether the kernel took the huge-page advice.
    pub huge_pages_advised: bool,
    /// Bytes of the range backed by transparent huge pages after the touch
    /// (`AnonHugePages` of its mapping in `/proc/self/smaps`), where readable.
    pub huge_page_bytes: Option<usize>,
    /// `/sys/kernel/mm/transparent_hugepage/enabled` (the bracketed choice).
    pub thp_enabled: Option<String>,
    /// `/sys/kernel/mm/transparent_hugepage/defrag` (the bracketed choice: `always` makes
    /// faults compact memory synchronously, a known cause of slow faulting).
    pub thp_defrag: Option<String>,
    /// The NUMA node asked for (the device's host node, as the driver reports it).
    pub numa_node_requested: Option<u32>,
    /// Whether the kernel took the NUMA placement.
    pub numa_node_placed: bool,
    /// The NUMA node the first page landed on, where the kernel says.
    pub numa_node_found: Option<u32>,
    /// Bytes of host memory available before (MemAvailable, capped by the cgroup's room).
    pub available_before: Option<usize>,
    /// Whether the range was ready in the process's host page supply (made before, by an
    /// earlier user or ahead of need): nothing was made for this one, `total_s` is the take.
    pub from_supply: bool,
}

/// The bracketed choice of a transparent huge page setting (`always [madvise] never`).
fn thp_setting(name: &str) -> Option<String> {
    let text =
        std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{name}")).ok()?;
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_owned())
}

/// `AnonHugePages` of the mapping that starts at `addr` in `/proc/self/smaps`, in bytes.
fn huge_page_bytes(addr: usize) -> Option<usize> {
    let text = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let head = format!("{addr:x}-");
    let mut lines = text.lines().skip_while(|l| !l.starts_with(&head));
    lines.next()?;
    for line in lines {
        if let Some(rest) = line.strip_prefix("AnonHugePages:") {
            let kib: usize = rest.split_whitespace().next()?.parse().ok()?;
            return kib.checked_mul(1024);
        }
        // The next mapping's header: no figure for this one.
        if line
            .split_whitespace()
            .next()
            .is_some_and(|w| w.contains('-') && !w.ends_with(':'))
        {
            return None;
        }
    }
    None
}

/// A registered (pinned) host range of its own reservation.
#[derive(Debug)]
pub struct PinnedPages {
    reservation: Reservation,
    bytes: usize,
    /// The device whose context registered it: its context is made current to unregister it,
    /// whoever drops it (a wake, a give-back from a thread with no context).
    device: usize,
    /// How it was made.
    startup: PinnedStartup,
}

impl PinnedPages {
    /// Makes `bytes` of pinned host memory, its pages on `numa_node` where given.
    ///
    /// Records how long each step took ([`PinnedPages::startup`]).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](Error::OutOfMemory) when the host or the driver cannot give
    /// that much (more than the host has available is refused before anything is touched); no
    /// driver; CUDA errors of the registration.
    pub fn new(bytes: usize, numa_node: Option<u32>) -> Result<Self> {
        cuda::ensure_driver()?;
        let started = Instant::now();
        // Refused before anything is reserved or touched when the host cannot hold it (the
        // commit checks again): faulting in more than the host has gets the process killed.
        let pages = bytes.checked_next_multiple_of(HUGE_PAGE).ok_or_else(|| {
            Error::out_of_memory(bytes, "pinned host memory: larger than the address space")
        })?;
        // What the commit below faults in.
        let touched = if bytes >= HUGE_PAGE {
            pages
        } else {
            bytes.next_multiple_of(SMALL_PAGE)
        };
        check_host_room(touched, true)?;
        let mut record = PinnedStartup {
            bytes,
            available_before: available_host_memory().map(|r| r.available),
            numa_node_requested: numa_node,
            thp_enabled: thp_setting("enabled"),
            thp_defrag: thp_setting("defrag"),
            ..PinnedStartup::default()
        };
        let reservation = Reservation::new(bytes)?;
        record.reserve_s = started.elapsed().as_secs_f64();
        // Whole huge pages from 2 MiB (the kernel backs them with huge pages where it can);
        // below, only the small pages the request needs.
        let committed = if bytes >= HUGE_PAGE {
            reservation.len()
        } else {
            bytes.next_multiple_of(SMALL_PAGE)
        };
        let times = reservation.commit_timed(
            0,
            committed,
            Commit {
                numa_node,
                populate: true,
            },
        )?;
        let step = Instant::now();
        // SAFETY: the committed range stays mapped until drop, which unregisters it first.
        unsafe { cuda::mem_host_register(reservation.base(), committed) }?;
        record.register_s = step.elapsed().as_secs_f64();
        record.total_s = started.elapsed().as_secs_f64();
        record.committed_bytes = committed;
        record.protect_s = times.protect.as_secs_f64();
        record.madvise_s = times.advise.as_secs_f64();
        record.numa_bind_s = times.place.as_secs_f64();
        record.touch_s = times.touch.as_secs_f64();
        record.touch_threads = times.touch_threads;
        record.huge_pages_advised = times.huge_pages_advised;
        record.numa_node_placed = times.node_placed;
        // Read after the clock stopped: diagnostics, not part of the start-up.
        record.huge_page_bytes = huge_page_bytes(reservation.base());
        record.numa_node_found = numa_node_of(reservation.base());
        Ok(PinnedPages {
            reservation,
            bytes,
            device: cuda::current_device()?,
            startup: record,
        })
    }

    /// How it was made: the figures of the call that made it.
    pub fn startup(&self) -> &PinnedStartup {
        &self.startup
    }

    /// The first address.
    pub fn addr(&self) -> usize {
        self.reservation.base()
    }

    /// The bytes asked for.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for PinnedPages {
    fn drop(&mut self) {
        // cuMemHostUnregister needs a current context; the thread that drops it may have none.
        let _ctx = cuda::ContextGuard::new(self.device).ok();
        // SAFETY: registered in `new`, once; the owner dropped the range after the work that
        // used it finished (the resource synchronizes the stream before dropping). An error
        // cannot be reported from drop; the reservation is unmapped after either way.
        let _ = unsafe { cuda::mem_host_unregister(self.reservation.base()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diagnostics_read_the_kernel_s_figures() {
        // The bracketed choice, where the kernel has transparent huge pages.
        if let Some(enabled) = thp_setting("enabled") {
            assert!(
                ["always", "madvise", "never"].contains(&enabled.as_str()),
                "{enabled}"
            );
        }
        let r = Reservation::new(4 * HUGE_PAGE).unwrap();
        let how = Commit {
            numa_node: None,
            populate: true,
        };
        r.commit(0, 4 * HUGE_PAGE, how).unwrap();
        // The mapping's own figure (0 where the kernel gave small pages).
        assert!(huge_page_bytes(r.base()).is_some_and(|b| b <= 4 * HUGE_PAGE));
        assert_eq!(huge_page_bytes(1), None);
    }
}
