//! Pinned (page-locked) host memory from `cuMemHostAlloc`.

use super::{MemoryKind, MemoryResource};
use crate::cuda::{self, ContextGuard, Stream};
use crate::error::Result;

/// Pinned host memory, portable across contexts; fast for host-device copies.
#[derive(Debug, Clone)]
pub struct PinnedHostMemoryResource {
    device: usize,
}

impl PinnedHostMemoryResource {
    /// A pinned-host resource (allocations are made with the current device's context current).
    pub fn new() -> Result<Self> {
        Ok(PinnedHostMemoryResource {
            device: cuda::current_device()?,
        })
    }
}

impl MemoryResource for PinnedHostMemoryResource {
    fn allocate(&self, bytes: usize, _stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        let _ctx = ContextGuard::new(self.device)?;
        cuda::mem_alloc_host(bytes)
    }

    unsafe fn deallocate(&self, ptr: usize, _bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let _ctx = ContextGuard::new(self.device)?;
        stream.synchronize()?;
        // SAFETY: `ptr` came from `allocate` of this resource (the trait's contract).
        unsafe { cuda::mem_free_host(ptr) }
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::PinnedHost
    }

    fn name(&self) -> &'static str {
        "pinned_host"
    }
}
