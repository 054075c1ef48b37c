//! An adaptor that serves from its upstream and, when the upstream runs out of memory, from an
//! alternate resource (managed or pinned host memory) instead of failing.

use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::live::LiveAllocations;
use crate::resource::{CallProfile, MemoryResource, SharedResource};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// What went where through a [`FallbackResourceAdaptor`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FallbackCounts {
    /// Allocations the upstream holds now.
    pub upstream_allocations: usize,
    /// Bytes the upstream holds now.
    pub upstream_bytes: usize,
    /// Allocations the alternate holds now.
    pub alternate_allocations: usize,
    /// Bytes the alternate holds now.
    pub alternate_bytes: usize,
    /// The most bytes the alternate held at once.
    pub alternate_peak_bytes: usize,
    /// Allocations that went to the alternate because the upstream was out of memory, ever.
    pub fallbacks: u64,
    /// Allocations that failed in both, ever.
    pub failures: u64,
}

/// Allocates from `upstream`; when that fails for want of memory, from `alternate` (RMM users
/// ask for this: rapidsai/rmm#2074, #1665). A free goes to the resource that made the
/// allocation: the adaptor records the alternate's allocations (they are the exception) and
/// sends every other free upstream. [`FallbackResourceAdaptor::counts`] says what went where.
///
/// Its kind, device and memory figures are the upstream's: the alternate is where memory goes
/// when those run out. Use an alternate that the same kernels can read: managed memory (the
/// device reads it wherever its pages are), or pinned host memory (the device reads it over
/// the link).
pub struct FallbackResourceAdaptor {
    upstream: SharedResource,
    alternate: SharedResource,
    /// The alternate's live allocations (a free of one of them goes to the alternate).
    on_alternate: LiveAllocations,
    upstream_allocations: AtomicUsize,
    upstream_bytes: AtomicUsize,
    alternate_allocations: AtomicUsize,
    alternate_bytes: AtomicUsize,
    alternate_peak_bytes: AtomicUsize,
    fallbacks: AtomicU64,
    failures: AtomicU64,
}

impl FallbackResourceAdaptor {
    /// Serves from `upstream`, and from `alternate` when `upstream` is out of memory.
    pub fn new(upstream: SharedResource, alternate: SharedResource) -> Self {
        FallbackResourceAdaptor {
            upstream,
            alternate,
            on_alternate: LiveAllocations::new(),
            upstream_allocations: AtomicUsize::new(0),
            upstream_bytes: AtomicUsize::new(0),
            alternate_allocations: AtomicUsize::new(0),
            alternate_bytes: AtomicUsize::new(0),
            alternate_peak_bytes: AtomicUsize::new(0),
            fallbacks: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// The resource tried first.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    /// The resource used when the upstream is out of memory.
    pub fn alternate(&self) -> &SharedResource {
        &self.alternate
    }

    /// What went where.
    pub fn counts(&self) -> FallbackCounts {
        FallbackCounts {
            upstream_allocations: self.upstream_allocations.load(Ordering::Relaxed),
            upstream_bytes: self.upstream_bytes.load(Ordering::Relaxed),
            alternate_allocations: self.alternate_allocations.load(Ordering::Relaxed),
            alternate_bytes: self.alternate_bytes.load(Ordering::Relaxed),
            alternate_peak_bytes: self.alternate_peak_bytes.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
        }
    }

    fn on_alternate(&self, bytes: usize, stream: Stream, first: Error) -> Result<usize> {
        let ptr = match self.alternate.allocate(bytes, stream) {
            Ok(ptr) => ptr,
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                return Err(if e.is_out_of_memory() {
                    Error::out_of_memory(
                        bytes,
                        format!(
                            "fallback: {} and its alternate {} are both out of memory ({first}; \
                             {e})",
                            self.upstream.name(),
                            self.alternate.name()
                        ),
                    )
                } else {
                    e
                });
            }
        };
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        if ptr != 0 {
            if let Err(e) = self.on_alternate.insert(ptr, bytes) {
                // SAFETY: `ptr` came from the alternate just now with `bytes`, unused.
                let _ = unsafe { self.alternate.deallocate(ptr, bytes, stream) };
                return Err(e);
            }
            self.alternate_allocations.fetch_add(1, Ordering::Relaxed);
            let now = self.alternate_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
            self.alternate_peak_bytes.fetch_max(now, Ordering::Relaxed);
        }
        Ok(ptr)
    }
}

impl MemoryResource for FallbackResourceAdaptor {
    /// # Errors
    /// Out of memory when both are out of memory (naming both); the upstream's other errors
    /// (a logic or CUDA error is not a reason to fall back); the alternate's errors.
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        match self.upstream.allocate(bytes, stream) {
            Ok(ptr) => {
                if ptr != 0 {
                    self.upstream_allocations.fetch_add(1, Ordering::Relaxed);
                    self.upstream_bytes.fetch_add(bytes, Ordering::Relaxed);
                }
                Ok(ptr)
            }
            Err(e) if e.is_out_of_memory() => self.on_alternate(bytes, stream, e),
            Err(e) => Err(e),
        }
    }

    /// Frees through the resource that made the allocation.
    ///
    /// # Safety
    /// As [`MemoryResource::deallocate`]; an allocation of the alternate is checked (a wrong
    /// size is [`Error::Logic`]), one of the upstream is as safe as the upstream.
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            // A null free frees nothing; forwarded so a resource below that counts zero-byte
            // allocations (the statistics adaptor, as RMM's) ends the one this adaptor passed
            // down.
            // SAFETY: a null pointer is never a live allocation: freeing it is a no-op for
            // every resource (the trait's contract).
            return unsafe { self.upstream.deallocate(0, bytes, stream) };
        }
        if self.on_alternate.size_of(ptr).is_some() {
            self.on_alternate.free_checked(
                ptr,
                bytes,
                Some("fallback_resource_adaptor"),
                || {
                    // SAFETY: the record shows `ptr` came from the alternate with `bytes` and
                    // was not freed since (1, 2); the caller's contract gives 3 and 4.
                    unsafe { self.alternate.deallocate(ptr, bytes, stream) }
                },
            )?;
            self.alternate_allocations.fetch_sub(1, Ordering::Relaxed);
            self.alternate_bytes.fetch_sub(bytes, Ordering::Relaxed);
            return Ok(());
        }
        // SAFETY: not the alternate's, so the upstream's (the caller's contract).
        unsafe { self.upstream.deallocate(ptr, bytes, stream) }?;
        // Saturating: an upstream that accepts a free of a pointer it never made (one that does
        // not check) must not wrap the counters.
        let _ = self
            .upstream_allocations
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
        let _ = self
            .upstream_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(bytes))
            });
        Ok(())
    }

    fn kind(&self) -> crate::resource::MemoryKind {
        self.upstream.kind()
    }

    fn device(&self) -> Option<usize> {
        self.upstream.device()
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.upstream.memory_info()
    }

    fn report(&self) -> Option<&dyn crate::report::PoolReport> {
        self.upstream.report()
    }

    fn upstreams(&self) -> Vec<SharedResource> {
        vec![self.upstream.clone(), self.alternate.clone()]
    }

    /// Both resources' (the primary's memory).
    fn link(&self) -> crate::resource::Link {
        crate::resource::Link::join(&[self.upstream.link(), self.alternate.link()])
            .unwrap_or_else(|| crate::resource::Link::source(self.kind(), self.device()))
    }

    fn call_profile(&self) -> CallProfile {
        // The adaptor's own work is a map lookup: quick.
        self.upstream
            .call_profile()
            .and(self.alternate.call_profile())
    }

    fn name(&self) -> &'static str {
        "fallback"
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;
    use crate::resource::SimulatedMemoryResource;
    use crate::test_support::free;
    use std::sync::Arc;

    const MIB: usize = 1 << 20;

    #[test]
    fn serves_from_the_upstream_then_the_alternate_and_frees_each_where_it_came_from() {
        let device = Arc::new(SimulatedMemoryResource::new(8 * MIB));
        let host = Arc::new(SimulatedMemoryResource::managed(0, 64 * MIB));
        let mr = FallbackResourceAdaptor::new(device.clone(), host.clone());
        let a = mr.allocate(6 * MIB, Stream::DEFAULT).unwrap();
        let b = mr.allocate(4 * MIB, Stream::DEFAULT).unwrap(); // the device is full
        let c = mr.allocate(MIB, Stream::DEFAULT).unwrap(); // fits the device again
        assert_eq!(device.bytes_in_use(), 7 * MIB);
        assert_eq!(host.bytes_in_use(), 4 * MIB);
        let counts = mr.counts();
        assert_eq!(
            (counts.upstream_allocations, counts.upstream_bytes),
            (2, 7 * MIB)
        );
        assert_eq!(
            (
                counts.alternate_allocations,
                counts.alternate_bytes,
                counts.fallbacks
            ),
            (1, 4 * MIB, 1)
        );
        // A wrong size for the alternate's allocation is refused and changes nothing.
        assert!(matches!(free(&mr, b, MIB), Err(Error::Logic(_))));
        free(&mr, b, 4 * MIB).unwrap();
        free(&mr, a, 6 * MIB).unwrap();
        free(&mr, c, MIB).unwrap();
        assert_eq!((device.bytes_in_use(), host.bytes_in_use()), (0, 0));
        let counts = mr.counts();
        assert_eq!(counts.alternate_peak_bytes, 4 * MIB);
        assert_eq!((counts.upstream_bytes, counts.alternate_bytes), (0, 0));
        // Both full: out of memory naming both, counted.
        let err = mr.allocate(100 * MIB, Stream::DEFAULT).unwrap_err();
        assert!(err.is_out_of_memory());
        assert!(err.to_string().contains("both out of memory"), "{err}");
        assert_eq!(mr.counts().failures, 1);
        assert_eq!(mr.allocate(0, Stream::DEFAULT).unwrap(), 0);
        assert_eq!(mr.upstreams().len(), 2);
    }
}
