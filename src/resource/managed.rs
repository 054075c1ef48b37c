//! `cuMemAllocManaged`: unified memory that can exceed the device.

use super::{MemoryKind, MemoryResource};
use crate::cuda::{self, ContextGuard, Stream};
use crate::error::Result;

/// Managed (unified) memory from `cuMemAllocManaged`, attached globally.
#[derive(Debug, Clone)]
pub struct ManagedMemoryResource {
    device: usize,
}

impl ManagedMemoryResource {
    /// A resource on the current device.
    pub fn new() -> Result<Self> {
        Self::on_device(cuda::current_device()?)
    }

    /// A resource on device `ordinal`.
    pub fn on_device(ordinal: usize) -> Result<Self> {
        let _ctx = ContextGuard::new(ordinal)?;
        Ok(ManagedMemoryResource { device: ordinal })
    }
}

impl MemoryResource for ManagedMemoryResource {
    fn allocate(&self, bytes: usize, _stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        let _ctx = ContextGuard::new(self.device)?;
        cuda::mem_alloc_managed(bytes)
    }

    unsafe fn deallocate(&self, ptr: usize, _bytes: usize, _stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let _ctx = ContextGuard::new(self.device)?;
        // SAFETY: `ptr` came from `allocate` of this resource (the trait's contract).
        unsafe { cuda::mem_free(ptr) }
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Managed
    }

    fn device(&self) -> Option<usize> {
        Some(self.device)
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        let _ctx = ContextGuard::new(self.device).ok()?;
        cuda::mem_get_info().ok()
    }

    fn name(&self) -> &'static str {
        "managed"
    }
}
