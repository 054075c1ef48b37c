//! An adaptor that prefetches managed memory to the device after allocating it.

use crate::cuda::{self, Stream};
use crate::error::Result;
use crate::resource::{MemoryKind, MemoryResource, SharedResource};

/// After each allocation, prefetches the memory to the device on the allocation's stream
/// (`cuMemPrefetchAsync`, RMM's `prefetch_resource_adaptor`), so that first use does not page
/// fault. Only managed memory can be prefetched; for other kinds the adaptor passes through.
pub struct PrefetchResourceAdaptor {
    upstream: SharedResource,
}

impl PrefetchResourceAdaptor {
    /// An adaptor over `upstream`.
    pub fn new(upstream: SharedResource) -> Self {
        PrefetchResourceAdaptor { upstream }
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }
}

impl MemoryResource for PrefetchResourceAdaptor {
    /// # Errors
    /// The upstream's errors; a failed prefetch frees the allocation and returns the CUDA error.
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let ptr = self.upstream.allocate(bytes, stream)?;
        if ptr == 0 || self.upstream.kind() != MemoryKind::Managed {
            return Ok(ptr);
        }
        let device = match self.upstream.device() {
            Some(d) => Ok(d),
            None => cuda::current_device(),
        };
        // SAFETY: `ptr` is managed memory (the upstream's kind) just allocated for `bytes` bytes
        // and not yet freed.
        let prefetched =
            device.and_then(|d| unsafe { cuda::mem_prefetch_async(ptr, bytes, d, stream) });
        match prefetched {
            Ok(()) => Ok(ptr),
            Err(e) => {
                // The allocation is unusable to the caller; give it back, keep the first error.
                // SAFETY: `ptr` was just allocated from the upstream with `bytes` on `stream`
                // and is not handed out; the failed prefetch enqueued no work on it.
                let _ = unsafe { self.upstream.deallocate(ptr, bytes, stream) };
                Err(e)
            }
        }
    }

    pass_through_deallocate!();

    // cuMemPrefetchAsync and the driver.
    forward_upstream_info!(and BLOCKING);

    fn name(&self) -> &'static str {
        "prefetch"
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_send_sync, simulated};
    use super::*;

    #[test]
    fn passes_through_non_managed_memory() {
        assert_send_sync::<PrefetchResourceAdaptor>();
        let mr = PrefetchResourceAdaptor::new(simulated());
        let p = mr.allocate(1000, Stream::DEFAULT).unwrap();
        assert_eq!(mr.report().unwrap().footprint().held_bytes, 1024);
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(p, 1000, Stream::DEFAULT) }.unwrap();
        assert_eq!(mr.upstream().name(), "simulated");
    }
}

#[cfg(test)]
mod gpu_tests {
    use super::*;
    use crate::resource::UncachedManagedMemoryResource;
    use std::sync::Arc;

    /// The allocation is prefetched to the resource's device: the driver reports it as the
    /// range's last prefetch location.
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn prefetches_managed_memory_on_the_gpu() {
        let managed = UncachedManagedMemoryResource::new().unwrap();
        let device = managed.device().unwrap();
        let managed: SharedResource = Arc::new(managed);
        let mr = PrefetchResourceAdaptor::new(managed);
        let stream = crate::OwnedStream::new(true).unwrap();
        let p = mr.allocate(1 << 20, stream.stream()).unwrap();
        stream.synchronize().unwrap();
        assert!(crate::cuda::is_managed(p));
        // SAFETY: `p` is managed memory of 1 MiB, live.
        let location = unsafe { crate::cuda::mem_last_prefetch_location(p, 1 << 20) }.unwrap();
        assert_eq!(location, device as i32, "prefetched to the device");
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(p, 1 << 20, stream.stream()) }.unwrap();
        assert_eq!(mr.kind(), MemoryKind::Managed);
    }
}
