//! Stream-ordered managed memory from the device's default managed pool (CUDA 13's
//! `cuMemGetDefaultMemPool(.., CU_MEM_ALLOCATION_TYPE_MANAGED)`), RMM's
//! `cuda_async_managed_memory_resource`.

use super::cuda_async::{pool_resource, PoolAllocator};
use super::{MemoryKind, MemoryResource};
use crate::cuda::{self, Stream};
use crate::error::Result;

/// Allocates managed memory with `cuMemAllocFromPoolAsync` from the current device's default
/// managed memory pool (owned by the driver; its properties are left as they are).
#[derive(Debug, Clone)]
pub struct CudaAsyncManagedMemoryResource {
    core: PoolAllocator,
}

impl CudaAsyncManagedMemoryResource {
    /// Uses the default managed pool of the current device.
    ///
    /// # Errors
    /// No driver; [`Error::Logic`](crate::Error::Logic) with RMM's message on a driver older than
    /// CUDA 13.0; a CUDA error.
    pub fn new() -> Result<Self> {
        let device = cuda::current_device()?;
        let handle = cuda::default_managed_pool(device)?;
        Ok(CudaAsyncManagedMemoryResource {
            // SAFETY: the driver owns the default managed pool of a device and keeps it live for
            // the life of the process; `handle` was just returned by the driver for `device`.
            core: PoolAllocator::new(device, unsafe { cuda::MemPool::from_raw(handle) }),
        })
    }

    /// The raw `CUmemoryPool` handle.
    pub fn pool_handle(&self) -> usize {
        self.core.pool_handle()
    }
}

pool_resource!(
    CudaAsyncManagedMemoryResource,
    "cuda_async_managed",
    MemoryKind::Managed
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[test]
    fn without_a_driver_it_fails_cleanly() {
        if cuda::driver_available() {
            return; // covered by the GPU tests
        }
        let err = CudaAsyncManagedMemoryResource::new().unwrap_err();
        assert!(matches!(err, Error::NoDriver(_)), "{err}");
    }
}
