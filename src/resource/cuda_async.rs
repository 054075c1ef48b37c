//! Stream-ordered allocation from a CUDA memory pool (`cuMemAllocFromPoolAsync`): a pool this
//! resource owns ([`CudaAsyncMemoryResource`]) or one owned elsewhere
//! ([`CudaAsyncViewMemoryResource`]). Both share one core, [`PoolAllocator`].

use super::{MemoryKind, MemoryResource};
use crate::cuda::{self, ContextGuard, MemPool, PoolExport, Stream};
use crate::error::{Error, Result};
use std::sync::Arc;

/// The common part of every pool-backed resource: a device and a pool (owned or not).
#[derive(Debug, Clone)]
pub(crate) struct PoolAllocator {
    device: usize,
    pool: Arc<DriverPool>,
}

/// The driver's pool, a cache of the device's memory: what it keeps beyond what is allocated
/// goes back on a relief (`cuMemPoolTrimTo`).
#[derive(Debug)]
struct DriverPool {
    device: usize,
    pool: MemPool,
}

impl std::ops::Deref for DriverPool {
    type Target = MemPool;

    fn deref(&self) -> &MemPool {
        &self.pool
    }
}

impl DriverPool {
    /// `(reserved, used)` with the device's context current; zeros when they cannot be read.
    fn figures(&self) -> (usize, usize) {
        ContextGuard::new(self.device)
            .and_then(|_ctx| self.pool.reserved_and_used())
            .unwrap_or((0, 0))
    }
}

impl crate::pressure::Relieve for DriverPool {
    fn relieve(&self) -> usize {
        let (before, _) = self.figures();
        let trimmed = ContextGuard::new(self.device).and_then(|_ctx| self.pool.trim_to(0));
        if trimmed.is_err() {
            return 0;
        }
        before.saturating_sub(self.figures().0)
    }

    fn cached(&self) -> usize {
        let (reserved, used) = self.figures();
        reserved.saturating_sub(used)
    }

    fn held(&self) -> usize {
        self.figures().0
    }
}

impl PoolAllocator {
    /// A core over `pool` on `device`; the pool registers as a cache of the device.
    pub(crate) fn new(device: usize, pool: MemPool) -> Self {
        let pool = Arc::new(DriverPool { device, pool });
        let cache: std::sync::Weak<dyn crate::pressure::Relieve> = Arc::downgrade(&pool) as _;
        crate::pressure::register(crate::pressure::Place::Device(device), cache);
        PoolAllocator { device, pool }
    }

    /// A core over a pool owned elsewhere, on the current device.
    ///
    /// # Safety
    /// 1. `handle` is a live `CUmemoryPool` of the current device.
    /// 2. Its owner keeps it live while this core, or memory allocated from it, is in use.
    pub(crate) unsafe fn view(handle: usize) -> Result<Self> {
        if handle == 0 {
            return Err(Error::invalid("pool_handle", "the pool handle is null"));
        }
        let device = cuda::current_device()?;
        // SAFETY: the caller's contract (a live pool kept live while this core is used).
        Ok(PoolAllocator::new(device, unsafe {
            MemPool::from_raw(handle)
        }))
    }

    /// The raw `CUmemoryPool` handle.
    pub(crate) fn pool_handle(&self) -> usize {
        self.pool.raw()
    }

    /// The device the pool allocates on.
    pub(crate) fn device(&self) -> usize {
        self.device
    }

    /// `cuMemAllocFromPoolAsync`. Any failure is an allocation failure, as RMM's
    /// `RMM_CUDA_TRY_ALLOC` makes it (`rmm::bad_alloc`, Python's `MemoryError`): a pool that was
    /// destroyed under a view answers `CUDA_ERROR_INVALID_VALUE`.
    pub(crate) fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        // Out of memory relieves the device's caches and tries once more.
        crate::pressure::retry_after_relief(
            crate::pressure::Place::Device(self.device),
            bytes,
            || {
                let _ctx = ContextGuard::new(self.device)?;
                self.pool.allocate(bytes, stream).map_err(|e| match e {
                    Error::Cuda {
                        call,
                        name,
                        description,
                        ..
                    } => Error::out_of_memory(
                        bytes,
                        format!("CUDA error at {call}: {name} {description}"),
                    ),
                    other => other,
                })
            },
        )
    }

    /// `cuMemFreeAsync`.
    ///
    /// # Safety
    /// 1. `ptr` came from [`allocate`](Self::allocate) of this core and is freed once.
    pub(crate) unsafe fn deallocate(&self, ptr: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let _ctx = ContextGuard::new(self.device)?;
        // SAFETY: the caller's contract (precondition 1).
        unsafe { cuda::mem_free_async(ptr, stream) }
    }

    /// Free and total memory of the device.
    pub(crate) fn memory_info(&self) -> Option<(usize, usize)> {
        let _ctx = ContextGuard::new(self.device).ok()?;
        cuda::mem_get_info().ok()
    }

    /// Primes the pool: allocates and frees `bytes` once on the default stream.
    fn prime(&self, bytes: usize) -> Result<()> {
        let ptr = self.allocate(bytes, Stream::DEFAULT)?;
        // SAFETY: `ptr` was just allocated from this pool and nothing uses it.
        unsafe { self.deallocate(ptr, Stream::DEFAULT)? };
        Stream::DEFAULT.synchronize()
    }
}

/// Implements [`MemoryResource`] for a newtype over [`PoolAllocator`] (its field `core`).
macro_rules! pool_resource {
    ($ty:ty, $name:literal, $kind:expr) => {
        impl MemoryResource for $ty {
            fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
                self.core.allocate(bytes, stream)
            }

            unsafe fn deallocate(&self, ptr: usize, _bytes: usize, stream: Stream) -> Result<()> {
                // SAFETY: `ptr` came from `allocate` of this resource and is freed once (the
                // trait's `# Safety` preconditions, which the caller upholds).
                unsafe { self.core.deallocate(ptr, stream) }
            }

            fn kind(&self) -> MemoryKind {
                $kind
            }

            fn device(&self) -> Option<usize> {
                Some(self.core.device())
            }

            fn memory_info(&self) -> Option<(usize, usize)> {
                self.core.memory_info()
            }

            /// A source whose calls are driver calls that may wait (pool growth, trimming,
            /// the driver's locks).
            fn link(&self) -> $crate::resource::Link {
                $crate::resource::Link::blocking_source(self)
            }

            fn name(&self) -> &'static str {
                $name
            }
        }
    };
}
pub(crate) use pool_resource;

/// Allocates with `cuMemAllocFromPoolAsync` from a memory pool that this resource owns.
#[derive(Debug, Clone)]
pub struct CudaAsyncMemoryResource {
    core: PoolAllocator,
}

impl CudaAsyncMemoryResource {
    /// Creates the pool on the current device. `initial_pool_size` bytes are allocated and freed
    /// once to prime the pool; `release_threshold` (default: keep everything) is the memory the
    /// pool holds on to when idle.
    ///
    /// # Errors
    /// No driver, a CUDA error, or out of memory while priming.
    pub fn new(
        initial_pool_size: Option<usize>,
        release_threshold: Option<u64>,
        export: PoolExport,
    ) -> Result<Self> {
        let device = cuda::current_device()?;
        let _ctx = ContextGuard::new(device)?;
        let pool = MemPool::new(device, release_threshold.unwrap_or(u64::MAX), export)?;
        let this = CudaAsyncMemoryResource {
            core: PoolAllocator::new(device, pool),
        };
        if let Some(initial) = initial_pool_size.filter(|&b| b > 0) {
            this.core.prime(initial)?;
        }
        Ok(this)
    }

    /// The raw `CUmemoryPool` handle.
    pub fn pool_handle(&self) -> usize {
        self.core.pool_handle()
    }
}

pool_resource!(CudaAsyncMemoryResource, "cuda_async", MemoryKind::Device);

/// Allocates from a memory pool owned by someone else (given as a raw `CUmemoryPool`).
#[derive(Debug, Clone)]
pub struct CudaAsyncViewMemoryResource {
    core: PoolAllocator,
}

impl CudaAsyncViewMemoryResource {
    /// Wraps the pool `handle`, on the current device.
    ///
    /// # Errors
    /// A null handle, or no driver.
    ///
    /// # Safety
    /// 1. `handle` is a live `CUmemoryPool` of the current device.
    /// 2. Its owner keeps it live while this resource, or memory allocated from it, is in use.
    pub unsafe fn new(handle: usize) -> Result<Self> {
        Ok(CudaAsyncViewMemoryResource {
            // SAFETY: the caller's contract, passed on.
            core: unsafe { PoolAllocator::view(handle)? },
        })
    }

    /// The raw `CUmemoryPool` handle.
    pub fn pool_handle(&self) -> usize {
        self.core.pool_handle()
    }
}

pool_resource!(
    CudaAsyncViewMemoryResource,
    "cuda_async_view",
    MemoryKind::Device
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_null_pool_handle_is_an_invalid_argument() {
        // SAFETY: a null handle is refused before it is used.
        let err = unsafe { CudaAsyncViewMemoryResource::new(0) }.unwrap_err();
        assert!(matches!(
            err,
            Error::InvalidArgument {
                argument: "pool_handle",
                ..
            }
        ));
    }

    #[test]
    fn without_a_driver_the_owned_pool_fails_cleanly() {
        if cuda::driver_available() {
            return; // covered by the GPU tests
        }
        let err = CudaAsyncMemoryResource::new(None, None, PoolExport::default()).unwrap_err();
        assert!(matches!(err, Error::NoDriver(_)), "{err}");
    }
}
