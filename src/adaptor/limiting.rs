//! An adaptor that caps the bytes allocated through it.

use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::live::LiveAllocations;
use crate::resource::{align_up, MemoryResource, SharedResource, ALLOCATION_ALIGNMENT};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Allocates from its upstream until `allocation_limit` bytes are out (each allocation counted
/// rounded up to 256 bytes); beyond that, out of memory with RMM's "Exceeded memory limit".
///
/// Frees are checked against the allocations made through it (a [`LiveAllocations`]): the byte
/// counter can only drop by what was really allocated, whatever the upstream accepts.
pub struct LimitingResourceAdaptor {
    upstream: SharedResource,
    allocation_limit: usize,
    allocated_bytes: AtomicUsize,
    live: LiveAllocations,
}

impl LimitingResourceAdaptor {
    /// An adaptor over `upstream` that lets at most `allocation_limit` bytes be allocated.
    pub fn new(upstream: SharedResource, allocation_limit: usize) -> Self {
        LimitingResourceAdaptor {
            upstream,
            allocation_limit,
            allocated_bytes: AtomicUsize::new(0),
            live: LiveAllocations::new(),
        }
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    /// Bytes currently allocated through this adaptor (each allocation rounded up to 256).
    pub fn allocated_bytes(&self) -> usize {
        self.allocated_bytes.load(Ordering::Relaxed)
    }

    /// The limit given at construction.
    pub fn allocation_limit(&self) -> usize {
        self.allocation_limit
    }
}

impl MemoryResource for LimitingResourceAdaptor {
    /// # Errors
    /// Out of memory ("Exceeded memory limit") when the request would pass the limit; the
    /// upstream's errors otherwise.
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let proposed = align_up(bytes, ALLOCATION_ALIGNMENT)
            .ok_or_else(|| Error::out_of_memory(bytes, "Exceeded memory limit"))?;
        let old = self.allocated_bytes.fetch_add(proposed, Ordering::AcqRel);
        if old
            .checked_add(proposed)
            .is_some_and(|total| total <= self.allocation_limit)
        {
            match self.upstream.allocate(bytes, stream) {
                Ok(0) => {
                    self.allocated_bytes.fetch_sub(proposed, Ordering::AcqRel);
                    return Ok(0);
                }
                Ok(ptr) => {
                    if let Err(e) = self.live.insert(ptr, bytes) {
                        self.allocated_bytes.fetch_sub(proposed, Ordering::AcqRel);
                        return Err(e);
                    }
                    return Ok(ptr);
                }
                Err(e) => {
                    self.allocated_bytes.fetch_sub(proposed, Ordering::AcqRel);
                    return Err(e);
                }
            }
        }
        self.allocated_bytes.fetch_sub(proposed, Ordering::AcqRel);
        Err(Error::out_of_memory(bytes, "Exceeded memory limit"))
    }

    /// Checks the free against the allocations made through this adaptor, frees through the
    /// upstream and lowers the byte counter.
    ///
    /// # Safety
    /// Preconditions 3 and 4 of [`MemoryResource::deallocate`]; 1 and 2 are checked.
    ///
    /// # Errors
    /// [`Error::Logic`] (and the upstream is not called) for a pointer not allocated through
    /// this adaptor or already freed, or a size other than the allocation's (counting it would
    /// wrap the counter and refuse every later allocation). The upstream's errors otherwise.
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            // A null free frees nothing; forwarded so a resource below that counts zero-byte
            // allocations (the statistics adaptor, as RMM's) ends the one this adaptor passed
            // down.
            // SAFETY: a null pointer is never a live allocation: freeing it is a no-op for
            // every resource (the trait's contract).
            return unsafe { self.upstream.deallocate(0, bytes, stream) };
        }
        let size = align_up(bytes, ALLOCATION_ALIGNMENT).unwrap_or(usize::MAX);
        self.live
            .free_checked(ptr, bytes, Some("limiting_resource_adaptor"), || {
                // SAFETY: the record shows `ptr` came from the upstream with `bytes`, not freed
                // since (1, 2); the caller's contract gives 3 and 4.
                unsafe { self.upstream.deallocate(ptr, bytes, stream) }
            })?;
        // The record guarantees this size was counted; saturate anyway rather than wrap.
        let _ = self
            .allocated_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_sub(size))
            });
        Ok(())
    }

    forward_upstream_info!();

    fn name(&self) -> &'static str {
        "limiting"
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_send_sync, simulated};
    use super::*;

    #[test]
    fn limit_is_enforced_on_rounded_sizes() {
        assert_send_sync::<LimitingResourceAdaptor>();
        let mr = LimitingResourceAdaptor::new(simulated(), 1024);
        assert_eq!(mr.allocation_limit(), 1024);
        let a = mr.allocate(1, Stream::DEFAULT).unwrap();
        assert_eq!(mr.allocated_bytes(), 256);
        let b = mr.allocate(768, Stream::DEFAULT).unwrap();
        assert_eq!(mr.allocated_bytes(), 1024);
        let err = mr.allocate(1, Stream::DEFAULT).unwrap_err();
        assert!(err.is_out_of_memory());
        assert!(err.to_string().contains("Exceeded memory limit"));
        assert_eq!(mr.allocated_bytes(), 1024);
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(a, 1, Stream::DEFAULT) }.unwrap();
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(b, 768, Stream::DEFAULT) }.unwrap();
        assert_eq!(mr.allocated_bytes(), 0);
        assert_eq!(mr.kind(), crate::MemoryKind::Simulated);
    }

    /// Issue 9: a free with the wrong size wrapped the counter to 18446744073708503296 and
    /// every later allocation was refused.
    #[test]
    fn a_too_large_free_is_a_logic_error_and_the_counter_does_not_wrap() {
        let up = simulated();
        let mr = LimitingResourceAdaptor::new(up.clone(), 1 << 20);
        let a = mr.allocate(1000, Stream::DEFAULT).unwrap();
        // SAFETY: simulated memory checks its frees; the adaptor refuses before forwarding.
        let err = unsafe { mr.deallocate(a, 1 << 20, Stream::DEFAULT) }.unwrap_err();
        assert!(
            matches!(&err, Error::Logic(m) if m.contains("size 1048576") && m.contains("size 1000")),
            "{err}"
        );
        // SAFETY: as above: a smaller wrong size is refused too.
        assert!(unsafe { mr.deallocate(a, 10, Stream::DEFAULT) }.is_err());
        assert_eq!(mr.allocated_bytes(), 1024);
        let b = mr.allocate(4096, Stream::DEFAULT).unwrap();
        assert_eq!(mr.allocated_bytes(), 1024 + 4096);
        // SAFETY: `a` and `b` are live with these sizes.
        unsafe { mr.deallocate(a, 1000, Stream::DEFAULT) }.unwrap();
        // SAFETY: as above.
        unsafe { mr.deallocate(b, 4096, Stream::DEFAULT) }.unwrap();
        assert_eq!(mr.allocated_bytes(), 0);
        // SAFETY: checked by the adaptor (nothing allocated), never forwarded.
        assert!(unsafe { mr.deallocate(b, 4096, Stream::DEFAULT) }.is_err());
        assert_eq!(mr.allocated_bytes(), 0);
        assert!(mr.allocate(1 << 19, Stream::DEFAULT).is_ok());
    }

    #[test]
    fn upstream_failure_is_rolled_back() {
        let mr = LimitingResourceAdaptor::new(simulated(), usize::MAX);
        assert!(mr.allocate(2 << 20, Stream::DEFAULT).is_err());
        assert_eq!(mr.allocated_bytes(), 0);
        assert!(mr.allocate(usize::MAX, Stream::DEFAULT).is_err());
        assert_eq!(mr.allocated_bytes(), 0);
    }
}
