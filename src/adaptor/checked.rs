//! An adaptor that checks every free against the allocations it handed out.

use crate::cuda::Stream;
use crate::error::Result;
use crate::live::LiveAllocations;
use crate::resource::{MemoryResource, SharedResource};

/// Records every allocation of its upstream (pointer -> size in a [`LiveAllocations`]) and
/// checks each free against it before the upstream sees it: a pointer it never handed out, a
/// double free and a free with the wrong size are [`Error::Logic`](crate::Error::Logic), the
/// upstream is not called, and the resource keeps working. Meant for source resources whose own
/// free has undefined behaviour on such input (`cuMemFree`, the system allocator) when they are
/// driven from an untrusted caller such as Python.
///
/// With this adaptor, preconditions 1 and 2 of
/// [`MemoryResource::deallocate`] are checked, not assumed.
#[derive(Debug)]
pub struct CheckedResourceAdaptor {
    upstream: SharedResource,
    live: LiveAllocations,
}

impl CheckedResourceAdaptor {
    /// A checking adaptor over `upstream`.
    pub fn new(upstream: SharedResource) -> Self {
        CheckedResourceAdaptor {
            upstream,
            live: LiveAllocations::new(),
        }
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    /// The live allocations made through this adaptor.
    pub fn live(&self) -> &LiveAllocations {
        &self.live
    }
}

impl MemoryResource for CheckedResourceAdaptor {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let ptr = self.upstream.allocate(bytes, stream)?;
        if ptr != 0 {
            // An upstream that hands out a live pointer twice is broken; report it and keep
            // the first record (freeing either copy would free the other).
            self.live.insert(ptr, bytes)?;
        }
        Ok(ptr)
    }

    /// Checks `ptr` and `bytes` against the live allocations, then frees through the upstream.
    ///
    /// # Safety
    /// Preconditions 3 and 4 of [`MemoryResource::deallocate`] (stream order, a live stream);
    /// 1 and 2 are checked.
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            // A null free frees nothing; forwarded so a resource below that counts zero-byte
            // allocations (the statistics adaptor, as RMM's) ends the one this adaptor passed
            // down.
            // SAFETY: a null pointer is never a live allocation: freeing it is a no-op for
            // every resource (the trait's contract).
            return unsafe { self.upstream.deallocate(0, bytes, stream) };
        }
        self.live.free_checked(ptr, bytes, None, || {
            // SAFETY: the record shows `ptr` was allocated from the upstream with `bytes` and
            // not freed since (1, 2); the caller's contract gives 3 and 4.
            unsafe { self.upstream.deallocate(ptr, bytes, stream) }
        })
    }

    forward_upstream_info!();

    fn name(&self) -> &'static str {
        self.upstream.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptor::test_util::{assert_send_sync, simulated};
    use crate::{Error, SystemMemoryResource};
    use std::sync::Arc;

    /// The upstream shows as its name (`Debug` of a `dyn MemoryResource`).
    #[test]
    fn debug_names_the_upstream() {
        let mr = CheckedResourceAdaptor::new(Arc::new(SystemMemoryResource::new()));
        assert_eq!(
            format!("{mr:?}"),
            format!(
                "CheckedResourceAdaptor {{ upstream: \"system\", live: {:?} }}",
                mr.live()
            )
        );
    }

    #[test]
    fn bad_frees_are_logic_errors_and_the_resource_keeps_working() {
        assert_send_sync::<CheckedResourceAdaptor>();
        let mr = CheckedResourceAdaptor::new(Arc::new(SystemMemoryResource::new()));
        let p = mr.allocate(1000, Stream::DEFAULT).unwrap();
        // SAFETY: the adaptor checks 1 and 2; default stream, no work.
        let bogus = unsafe { mr.deallocate(0x1000, 8, Stream::DEFAULT) }.unwrap_err();
        assert!(
            matches!(&bogus, Error::Logic(m) if m.contains("0x1000")),
            "{bogus}"
        );
        // SAFETY: as above.
        let wrong = unsafe { mr.deallocate(p, 8, Stream::DEFAULT) }.unwrap_err();
        assert!(
            matches!(&wrong, Error::Logic(m) if m.contains("size 8") && m.contains("size 1000")),
            "{wrong}"
        );
        // SAFETY: `p` is live with 1000 bytes.
        unsafe { mr.deallocate(p, 1000, Stream::DEFAULT) }.unwrap();
        // SAFETY: the adaptor checks 1 and 2.
        let double = unsafe { mr.deallocate(p, 1000, Stream::DEFAULT) }.unwrap_err();
        assert!(matches!(double, Error::Logic(_)));
        assert!(mr.live().is_empty());
        let q = mr.allocate(64, Stream::DEFAULT).unwrap();
        assert_eq!(mr.live().size_of(q), Some(64));
        // SAFETY: `q` is live with 64 bytes.
        unsafe { mr.deallocate(q, 64, Stream::DEFAULT) }.unwrap();
        assert_eq!(mr.name(), "system");
    }

    #[test]
    fn upstream_errors_keep_the_record() {
        let up = simulated();
        let mr = CheckedResourceAdaptor::new(up.clone());
        let p = mr.allocate(256, Stream::DEFAULT).unwrap();
        // Free it behind the adaptor's back: the adaptor's free then fails upstream.
        // SAFETY: simulated memory checks its frees.
        unsafe { up.deallocate(p, 256, Stream::DEFAULT) }.unwrap();
        // SAFETY: as above; the adaptor forwards a pointer it knows.
        assert!(unsafe { mr.deallocate(p, 256, Stream::DEFAULT) }.is_err());
        assert_eq!(mr.live().size_of(p), Some(256));
    }

    #[test]
    fn zero_bytes_is_the_null_pointer_and_not_recorded() {
        let mr = CheckedResourceAdaptor::new(simulated());
        assert_eq!(mr.allocate(0, Stream::DEFAULT).unwrap(), 0);
        // SAFETY: null is a no-op.
        unsafe { mr.deallocate(0, 0, Stream::DEFAULT) }.unwrap();
        assert!(mr.live().is_empty());
    }
}
