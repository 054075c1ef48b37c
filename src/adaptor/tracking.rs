//! An adaptor that records every outstanding allocation (and optionally where it was made).

use crate::cuda::Stream;
use crate::error::Result;
use crate::resource::{MemoryResource, SharedResource};
use parking_lot::Mutex;
use std::backtrace::Backtrace;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

struct AllocationInfo {
    size: usize,
    stack: Option<Backtrace>,
}

/// Tracks outstanding allocations: pointer -> size, and the call stack of the allocation when
/// `capture_stacks` is set (RMM's `tracking_resource_adaptor`), for finding leaks.
pub struct TrackingResourceAdaptor {
    upstream: SharedResource,
    capture_stacks: bool,
    allocations: Mutex<BTreeMap<usize, AllocationInfo>>,
    allocated_bytes: AtomicUsize,
}

impl TrackingResourceAdaptor {
    /// An adaptor over `upstream`; `capture_stacks` records a backtrace per allocation (slow).
    pub fn new(upstream: SharedResource, capture_stacks: bool) -> Self {
        TrackingResourceAdaptor {
            upstream,
            capture_stacks,
            allocations: Mutex::new(BTreeMap::new()),
            allocated_bytes: AtomicUsize::new(0),
        }
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    /// Bytes allocated through this adaptor and not yet freed.
    pub fn allocated_bytes(&self) -> usize {
        self.allocated_bytes.load(Ordering::Relaxed)
    }

    /// The outstanding allocations as (pointer, size), by address.
    ///
    /// # Time Complexity
    /// O(n) in the outstanding allocations.
    pub fn outstanding_allocations(&self) -> Vec<(usize, usize)> {
        self.allocations
            .lock()
            .iter()
            .map(|(&ptr, info)| (ptr, info.size))
            .collect()
    }

    /// The outstanding allocations in RMM's format: one `0xPTR: SIZE B` line each, followed by
    /// ` : callstack:` and the stack when stacks are captured.
    pub fn outstanding_allocations_str(&self) -> String {
        let allocations = self.allocations.lock();
        let mut out = String::new();
        for (ptr, info) in allocations.iter() {
            let _ = write!(out, "{ptr:#x}: {} B", info.size);
            if let Some(stack) = &info.stack {
                let _ = write!(out, " : callstack:\n{stack}");
            }
            out.push('\n');
        }
        out
    }

    /// Writes the outstanding allocations to RMM's debug log: the file `$RMM_DEBUG_LOG_FILE`
    /// when set, else standard error. Write errors are ignored (this is a diagnostic).
    pub fn log_outstanding_allocations(&self) {
        let line = format!(
            "Outstanding Allocations: {}\n",
            self.outstanding_allocations_str()
        );
        let file = std::env::var_os("RMM_DEBUG_LOG_FILE").and_then(|path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .ok()
        });
        let _ = match file {
            Some(mut f) => f.write_all(line.as_bytes()),
            None => std::io::stderr().lock().write_all(line.as_bytes()),
        };
    }
}

impl MemoryResource for TrackingResourceAdaptor {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let ptr = self.upstream.allocate(bytes, stream)?;
        // Capture the stack outside the lock; it is the slow part.
        let stack = self.capture_stacks.then(Backtrace::force_capture);
        self.allocations
            .lock()
            .insert(ptr, AllocationInfo { size: bytes, stack });
        self.allocated_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract (this resource hands out the upstream's pointers unchanged).
        unsafe { self.upstream.deallocate(ptr, bytes, stream) }?;
        let removed = self.allocations.lock().remove(&ptr);
        if let Some(info) = removed {
            self.allocated_bytes.fetch_sub(info.size, Ordering::Relaxed);
        }
        Ok(())
    }

    forward_upstream_info!();

    fn name(&self) -> &'static str {
        "tracking"
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_send_sync, simulated};
    use super::*;

    #[test]
    fn tracks_outstanding_allocations() {
        assert_send_sync::<TrackingResourceAdaptor>();
        let mr = TrackingResourceAdaptor::new(simulated(), false);
        let a = mr.allocate(100, Stream::DEFAULT).unwrap();
        let b = mr.allocate(300, Stream::DEFAULT).unwrap();
        assert_eq!(mr.allocated_bytes(), 400);
        assert_eq!(mr.outstanding_allocations(), vec![(a, 100), (b, 300)]);
        assert_eq!(
            mr.outstanding_allocations_str(),
            format!("{a:#x}: 100 B\n{b:#x}: 300 B\n")
        );
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(a, 100, Stream::DEFAULT) }.unwrap();
        assert_eq!(mr.outstanding_allocations(), vec![(b, 300)]);
        mr.log_outstanding_allocations();
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(b, 300, Stream::DEFAULT) }.unwrap();
        assert_eq!(mr.allocated_bytes(), 0);
        assert_eq!(mr.outstanding_allocations_str(), "");
    }

    #[test]
    fn captures_stacks_when_asked() {
        let mr =
            TrackingResourceAdaptor::new(std::sync::Arc::new(crate::SystemMemoryResource), true);
        let a = mr.allocate(64, Stream::DEFAULT).unwrap();
        assert!(mr.outstanding_allocations_str().contains(" : callstack:\n"));
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(a, 64, Stream::DEFAULT) }.unwrap();
    }
}
