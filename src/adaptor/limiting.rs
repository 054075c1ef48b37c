//! An adaptor that caps the bytes allocated through it.

use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::resource::{align_up, MemoryResource, SharedResource, ALLOCATION_ALIGNMENT};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Allocates from its upstream until `allocation_limit` bytes are out (each allocation counted
/// rounded up to 256 bytes); beyond that, out of memory with RMM's "Exceeded memory limit".
pub struct LimitingResourceAdaptor {
    upstream: SharedResource,
    allocation_limit: usize,
    allocated_bytes: AtomicUsize,
}

impl LimitingResourceAdaptor {
    /// An adaptor over `upstream` that lets at most `allocation_limit` bytes be allocated.
    pub fn new(upstream: SharedResource, allocation_limit: usize) -> Self {
        LimitingResourceAdaptor {
            upstream,
            allocation_limit,
            allocated_bytes: AtomicUsize::new(0),
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
                Ok(ptr) => return Ok(ptr),
                Err(e) => {
                    self.allocated_bytes.fetch_sub(proposed, Ordering::AcqRel);
                    return Err(e);
                }
            }
        }
        self.allocated_bytes.fetch_sub(proposed, Ordering::AcqRel);
        Err(Error::out_of_memory(bytes, "Exceeded memory limit"))
    }

    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract (this resource hands out the upstream's pointers unchanged).
        unsafe { self.upstream.deallocate(ptr, bytes, stream) }?;
        // `allocate` succeeded with this size, so the rounding cannot overflow.
        let size = align_up(bytes, ALLOCATION_ALIGNMENT).unwrap_or(bytes);
        self.allocated_bytes.fetch_sub(size, Ordering::AcqRel);
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

    #[test]
    fn upstream_failure_is_rolled_back() {
        let mr = LimitingResourceAdaptor::new(simulated(), usize::MAX);
        assert!(mr.allocate(2 << 20, Stream::DEFAULT).is_err());
        assert_eq!(mr.allocated_bytes(), 0);
        assert!(mr.allocate(usize::MAX, Stream::DEFAULT).is_err());
        assert_eq!(mr.allocated_bytes(), 0);
    }
}
