//! An adaptor that serves from its upstream and, when the upstream runs out of memory, from an
//! alternate resource (managed or pinned host memory) instead of failing.

use super::tiered::{Tier, TierRecord, TieredMemoryResource};
use crate::cuda::Stream;
use crate::error::Result;
use crate::resource::{MemoryResource, SharedResource};
use std::sync::Arc;

/// What went where through a [`FallbackResourceAdaptor`] (`counts()` in Python: a dict of these
/// fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
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
/// It is a [`TieredMemoryResource`] of two tiers, `upstream` and `alternate`, recording the
/// second's allocations only ([`TierRecord::BeyondFirst`]): one core for both.
///
/// Its kind, device, memory figures and report are the upstream's: the alternate is where
/// memory goes when those run out. Use an alternate that the same kernels can read: managed
/// memory (the device reads it wherever its pages are), or pinned host memory (the device reads
/// it over the link).
#[derive(Debug)]
pub struct FallbackResourceAdaptor {
    upstream: SharedResource,
    alternate: SharedResource,
    tiers: TieredMemoryResource,
}

impl FallbackResourceAdaptor {
    /// Serves from `upstream`, and from `alternate` when `upstream` is out of memory.
    pub fn new(upstream: SharedResource, alternate: SharedResource) -> Self {
        let tiers = vec![
            Tier::new("upstream", upstream.clone()),
            Tier::new("alternate", alternate.clone()),
        ];
        FallbackResourceAdaptor {
            upstream,
            alternate,
            tiers: TieredMemoryResource::checked(tiers, TierRecord::BeyondFirst, "fallback"),
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
        let counts = self.tiers.tier_counts();
        let (up, alt) = (&counts[0], &counts[1]);
        FallbackCounts {
            upstream_allocations: up.current_allocations,
            upstream_bytes: up.current_bytes,
            alternate_allocations: alt.current_allocations,
            alternate_bytes: alt.current_bytes,
            alternate_peak_bytes: alt.peak_bytes,
            fallbacks: alt.total_allocations,
            failures: self.tiers.failures(),
        }
    }
}

impl MemoryResource for FallbackResourceAdaptor {
    /// # Errors
    /// Out of memory when both are out of memory (naming both); the upstream's other errors
    /// (a logic or CUDA error is not a reason to fall back); the alternate's errors.
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        self.tiers.allocate(bytes, stream)
    }

    /// Frees through the resource that made the allocation.
    ///
    /// # Safety
    /// As [`MemoryResource::deallocate`]; an allocation of the alternate is checked (a wrong
    /// size is [`Error::Logic`](crate::Error::Logic)), one of the upstream is as safe as the upstream.
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract, passed on (the tiers check the alternate's frees).
        unsafe { self.tiers.deallocate(ptr, bytes, stream) }
    }

    fn kind(&self) -> crate::resource::MemoryKind {
        self.upstream().kind()
    }

    fn device(&self) -> Option<usize> {
        self.upstream().device()
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.upstream().memory_info()
    }

    fn report(&self) -> Option<&dyn crate::report::PoolReport> {
        self.upstream().report()
    }

    fn upstreams(&self) -> Vec<SharedResource> {
        self.tiers.upstreams()
    }

    /// Both resources' (the primary's memory).
    fn link(&self) -> crate::resource::Link {
        self.tiers.link()
    }

    fn name(&self) -> &'static str {
        "fallback"
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn into_any(self: Arc<Self>) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        Some(self)
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::*;
    use crate::resource::SimulatedMemoryResource;
    use crate::test_support::free;
    use crate::Error;

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
        assert!(
            err.to_string().contains("every tier is out of memory"),
            "{err}"
        );
        assert_eq!(mr.counts().failures, 1);
        assert_eq!(mr.allocate(0, Stream::DEFAULT).unwrap(), 0);
        assert_eq!(mr.upstreams().len(), 2);
    }
}
