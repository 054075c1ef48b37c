//! The [`MemoryResource`] trait and the base resources, one per file.

mod callback;
mod cuda;
mod cuda_async;
mod cuda_async_managed;
mod direct;
mod managed;
mod pinned_host;
mod simulated;
mod system;

pub use callback::{AllocateFn, CallbackMemoryResource, DeallocateFn};
pub use cuda::{CudaMemoryResource, DeviceAlloc};
pub use cuda_async::{CudaAsyncMemoryResource, CudaAsyncViewMemoryResource};
pub use cuda_async_managed::CudaAsyncManagedMemoryResource;
pub use direct::{DirectAllocator, DirectMemoryResource};
pub use managed::{ManagedAlloc, ManagedMemoryResource};
pub use pinned_host::PinnedHostMemoryResource;
pub use simulated::{SimulatedMemoryResource, SIMULATED_PAGE_SIZE};
pub use system::SystemMemoryResource;

use crate::cuda::Stream;
use crate::error::Result;
use std::sync::Arc;

/// Alignment of every allocation rrmm hands out, in bytes (RMM's `CUDA_ALLOCATION_ALIGNMENT`).
pub const ALLOCATION_ALIGNMENT: usize = 256;

/// Rounds `bytes` up to a multiple of `alignment` (a power of two); `None` on overflow.
#[inline]
pub fn align_up(bytes: usize, alignment: usize) -> Option<usize> {
    debug_assert!(alignment.is_power_of_two());
    Some(bytes.checked_add(alignment - 1)? & !(alignment - 1))
}

/// What kind of memory a resource hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Device memory (`cuMemAlloc`, memory pools).
    Device,
    /// Managed (unified) memory.
    Managed,
    /// Pinned host memory.
    PinnedHost,
    /// Pageable host memory (system allocator, HMM/ATS).
    Host,
    /// Address ranges with no memory behind them: never dereference, never pass to CUDA.
    Simulated,
}

/// A stream-ordered source of memory. Thread-safe; shared as [`SharedResource`].
///
/// Contract: allocations are aligned to [`ALLOCATION_ALIGNMENT`]; zero bytes gives the null
/// pointer (0) and deallocating it is a no-op; memory allocated on `stream` is ready for work
/// enqueued later on `stream`; memory deallocated on `stream` may be reused at once by later work
/// on that stream and by other streams only after the proper event wait.
pub trait MemoryResource: Send + Sync {
    /// Allocates `bytes` bytes, ready for use on `stream`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the request cannot be met; CUDA
    /// errors otherwise.
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize>;

    /// Returns `ptr`, allocated from this resource with the same `bytes`, on `stream`.
    ///
    /// # Safety
    /// 1. `ptr` was returned by [`allocate`](MemoryResource::allocate) on this resource (or on a
    ///    resource that shares its memory, such as an `Arc` clone), with the same `bytes`.
    /// 2. `ptr` has not been deallocated since it was allocated (no double free).
    /// 3. No work reads or writes the memory after the free in `stream`'s order: work enqueued
    ///    on other streams has been made to complete before, or is ordered before, this call on
    ///    `stream`; the host no longer uses it.
    /// 4. `stream` is a default stream or names a live stream of the resource's device (see
    ///    [`Stream::from_raw`]).
    ///
    /// Resources that document checked frees (the pool and simulated memory today, and
    /// resources behind a checking wrapper) report a broken 1 or 2 as
    /// [`Error::Logic`](crate::Error::Logic) instead, so with them only 3 and 4 are required;
    /// with the others (CUDA's own frees, the system allocator) a broken 1 or 2 is undefined
    /// behaviour.
    ///
    /// # Errors
    /// CUDA errors from the underlying free, or a logic error for a pointer this resource does
    /// not know (where the resource can tell).
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()>;

    /// The kind of memory this resource hands out.
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }

    /// The device ordinal this resource allocates on, where it has one.
    fn device(&self) -> Option<usize> {
        None
    }

    /// Free and total bytes of the memory behind this resource, where known; suballocators use it
    /// to size their growth.
    fn memory_info(&self) -> Option<(usize, usize)> {
        None
    }

    /// Footprint and free-memory figures, for resources that hold memory (suballocators,
    /// simulated memory); `None` for resources that pass every call to CUDA.
    fn footprint(&self) -> Option<Footprint> {
        None
    }

    /// A short name for reports and logs, such as `"pool"`.
    fn name(&self) -> &'static str;
}

/// How much memory a resource holds and how fragmented its free part is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes held from the upstream (a pool's size; for simulated memory, the bytes in use).
    pub held_bytes: usize,
    /// Bytes held but free.
    pub free_bytes: usize,
    /// The largest free block, in bytes.
    pub largest_free_block: usize,
    /// Number of free blocks.
    pub free_blocks: usize,
}

impl Footprint {
    /// External fragmentation: `1 - largest_free_block / free_bytes` (0 when nothing is free).
    pub fn fragmentation(&self) -> f64 {
        if self.free_bytes == 0 {
            0.0
        } else {
            1.0 - self.largest_free_block as f64 / self.free_bytes as f64
        }
    }
}

/// A resource shared between owners (adaptors, buffers, the per-device table).
pub type SharedResource = Arc<dyn MemoryResource>;

impl<T: MemoryResource + ?Sized> MemoryResource for Arc<T> {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        (**self).allocate(bytes, stream)
    }
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract, forwarded unchanged to the shared resource.
        unsafe { (**self).deallocate(ptr, bytes, stream) }
    }
    fn kind(&self) -> MemoryKind {
        (**self).kind()
    }
    fn device(&self) -> Option<usize> {
        (**self).device()
    }
    fn memory_info(&self) -> Option<(usize, usize)> {
        (**self).memory_info()
    }
    fn footprint(&self) -> Option<Footprint> {
        (**self).footprint()
    }
    fn name(&self) -> &'static str {
        (**self).name()
    }
}
