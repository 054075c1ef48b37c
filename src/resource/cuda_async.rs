//! Stream-ordered allocation from a CUDA memory pool (`cuMemAllocFromPoolAsync`).

use super::MemoryResource;
use crate::cuda::{self, ContextGuard, MemPool, PoolExport, Stream};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Allocates with `cuMemAllocFromPoolAsync` from a memory pool that this resource owns.
#[derive(Debug, Clone)]
pub struct CudaAsyncMemoryResource {
    device: usize,
    pool: Arc<MemPool>,
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
            device,
            pool: Arc::new(pool),
        };
        if let Some(initial) = initial_pool_size.filter(|&b| b > 0) {
            let ptr = this.pool.allocate(initial, Stream::DEFAULT)?;
            // SAFETY: `ptr` was just allocated from this pool and nothing uses it.
            unsafe { cuda::mem_free_async(ptr, Stream::DEFAULT)? };
            Stream::DEFAULT.synchronize()?;
        }
        Ok(this)
    }

    /// The raw `CUmemoryPool` handle.
    pub fn pool_handle(&self) -> usize {
        self.pool.raw()
    }
}

impl MemoryResource for CudaAsyncMemoryResource {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        let _ctx = ContextGuard::new(self.device)?;
        self.pool.allocate(bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: usize, _bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let _ctx = ContextGuard::new(self.device)?;
        // SAFETY: `ptr` came from `allocate` of this pool (the trait's contract).
        unsafe { cuda::mem_free_async(ptr, stream) }
    }

    fn device(&self) -> Option<usize> {
        Some(self.device)
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        let _ctx = ContextGuard::new(self.device).ok()?;
        cuda::mem_get_info().ok()
    }

    fn name(&self) -> &'static str {
        "cuda_async"
    }
}

/// Allocates from a memory pool owned by someone else (given as a raw `CUmemoryPool`).
#[derive(Debug, Clone)]
pub struct CudaAsyncViewMemoryResource {
    device: usize,
    pool: Arc<MemPool>,
}

impl CudaAsyncViewMemoryResource {
    /// Wraps the pool `handle`, on the current device.
    ///
    /// # Safety
    /// 1. `handle` is a live `CUmemoryPool` of the current device.
    /// 2. Its owner keeps it live while this resource, or memory allocated from it, is in use.
    pub unsafe fn new(handle: usize) -> Result<Self> {
        if handle == 0 {
            return Err(Error::invalid("pool_handle", "the pool handle is null"));
        }
        Ok(CudaAsyncViewMemoryResource {
            device: cuda::current_device()?,
            // SAFETY: the caller's contract (a live pool kept live while this resource is used).
            pool: Arc::new(unsafe { MemPool::from_raw(handle) }),
        })
    }

    /// The raw `CUmemoryPool` handle.
    pub fn pool_handle(&self) -> usize {
        self.pool.raw()
    }
}

impl MemoryResource for CudaAsyncViewMemoryResource {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        let _ctx = ContextGuard::new(self.device)?;
        self.pool.allocate(bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: usize, _bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let _ctx = ContextGuard::new(self.device)?;
        // SAFETY: `ptr` came from `allocate` of this pool (the trait's contract).
        unsafe { cuda::mem_free_async(ptr, stream) }
    }

    fn device(&self) -> Option<usize> {
        Some(self.device)
    }

    fn name(&self) -> &'static str {
        "cuda_async_view"
    }
}
