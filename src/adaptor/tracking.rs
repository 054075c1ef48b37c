//! An adaptor that records every outstanding allocation (and optionally where it was made).

use crate::cuda::Stream;
use crate::error::{Error, Result};
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
        if ptr == 0 {
            return Ok(0);
        }
        // Capture the stack outside the lock; it is the slow part.
        let stack = self.capture_stacks.then(Backtrace::force_capture);
        self.allocations
            .lock()
            .insert(ptr, AllocationInfo { size: bytes, stack });
        self.allocated_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(ptr)
    }

    /// Checks `ptr` and `bytes` against the tracked allocations, then frees through the
    /// upstream.
    ///
    /// # Safety
    /// Preconditions 3 and 4 of [`MemoryResource::deallocate`]; 1 and 2 are checked.
    ///
    /// # Errors
    /// [`Error::Logic`] (the upstream is not called) for a pointer not allocated through this
    /// adaptor or already freed, and for a size other than the allocation's (the message names
    /// both); the upstream's errors otherwise (the allocation stays tracked).
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            // A null free frees nothing; forwarded so a resource below that counts zero-byte
            // allocations (the statistics adaptor, as RMM's) ends the one this adaptor passed
            // down.
            // SAFETY: a null pointer is never a live allocation: freeing it is a no-op for
            // every resource (the trait's contract).
            return unsafe { self.upstream.deallocate(0, bytes, stream) };
        }
        let info = {
            let mut allocations = self.allocations.lock();
            match allocations.get(&ptr) {
                None => {
                    return Err(Error::Logic(format!(
                        "tracking_resource_adaptor: deallocate of {ptr:#x} ({bytes} bytes), which \
                         is not tracked (never allocated through this adaptor, or already freed)"
                    )))
                }
                Some(info) if info.size != bytes => {
                    return Err(Error::Logic(format!(
                        "tracking_resource_adaptor: deallocate of {ptr:#x} with size {bytes}, but \
                         it was allocated with size {}",
                        info.size
                    )))
                }
                // Taken out under the lock, so a concurrent double free finds it gone.
                Some(_) => allocations.remove(&ptr),
            }
        };
        // SAFETY: the record shows `ptr` came from the upstream with `bytes`, not freed since
        // (1, 2); the caller's contract gives 3 and 4.
        let freed = unsafe { self.upstream.deallocate(ptr, bytes, stream) };
        match (freed, info) {
            (Ok(()), _) => {
                let _ =
                    self.allocated_bytes
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                            Some(n.saturating_sub(bytes))
                        });
                Ok(())
            }
            (Err(e), Some(info)) => {
                self.allocations.lock().insert(ptr, info);
                Err(e)
            }
            (Err(e), None) => Err(e),
        }
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
    fn bogus_double_and_wrong_size_frees_are_logic_errors() {
        let mr = TrackingResourceAdaptor::new(simulated(), false);
        let a = mr.allocate(100, Stream::DEFAULT).unwrap();
        // SAFETY: the adaptor checks 1 and 2 and does not forward a bad free.
        let wrong = unsafe { mr.deallocate(a, 200, Stream::DEFAULT) }.unwrap_err();
        assert!(
            matches!(&wrong, Error::Logic(m) if m.contains("size 200") && m.contains("size 100")),
            "{wrong}"
        );
        // SAFETY: as above.
        let bogus = unsafe { mr.deallocate(0x4000, 8, Stream::DEFAULT) }.unwrap_err();
        assert!(
            matches!(&bogus, Error::Logic(m) if m.contains("0x4000")),
            "{bogus}"
        );
        assert_eq!(mr.allocated_bytes(), 100);
        assert_eq!(mr.outstanding_allocations(), vec![(a, 100)]);
        // SAFETY: `a` is live with 100 bytes.
        unsafe { mr.deallocate(a, 100, Stream::DEFAULT) }.unwrap();
        // SAFETY: checked, as above.
        let double = unsafe { mr.deallocate(a, 100, Stream::DEFAULT) };
        assert!(matches!(double, Err(Error::Logic(_))));
        assert_eq!(mr.allocated_bytes(), 0);
        assert_eq!(mr.allocate(0, Stream::DEFAULT).unwrap(), 0);
        assert!(
            mr.outstanding_allocations().is_empty(),
            "null is not tracked"
        );
    }

    #[test]
    fn captures_stacks_when_asked() {
        let mr = TrackingResourceAdaptor::new(
            std::sync::Arc::new(crate::SystemMemoryResource::new()),
            true,
        );
        let a = mr.allocate(64, Stream::DEFAULT).unwrap();
        assert!(mr.outstanding_allocations_str().contains(" : callstack:\n"));
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(a, 64, Stream::DEFAULT) }.unwrap();
    }
}
