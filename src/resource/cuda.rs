//! `cuMemAlloc`/`cuMemFree` on one device.

use super::MemoryResource;
use crate::cuda::{self, ContextGuard, Stream};
use crate::error::Result;

/// Device memory straight from `cuMemAlloc`; every call synchronises the device. The baseline
/// that suballocators are measured against.
#[derive(Debug, Clone)]
pub struct CudaMemoryResource {
    device: usize,
}

impl CudaMemoryResource {
    /// A resource on the current device.
    ///
    /// # Errors
    /// [`Error::NoDriver`](crate::Error::NoDriver) where there is no CUDA driver.
    pub fn new() -> Result<Self> {
        Self::on_device(cuda::current_device()?)
    }

    /// A resource on device `ordinal`.
    pub fn on_device(ordinal: usize) -> Result<Self> {
        let _ctx = ContextGuard::new(ordinal)?;
        Ok(CudaMemoryResource { device: ordinal })
    }
}

impl MemoryResource for CudaMemoryResource {
    fn allocate(&self, bytes: usize, _stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        let _ctx = ContextGuard::new(self.device)?;
        cuda::mem_alloc(bytes)
    }

    unsafe fn deallocate(&self, ptr: usize, _bytes: usize, _stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let _ctx = ContextGuard::new(self.device)?;
        // SAFETY: `ptr` came from `allocate` of this resource (the trait's contract).
        unsafe { cuda::mem_free(ptr) }
    }

    fn device(&self) -> Option<usize> {
        Some(self.device)
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        let _ctx = ContextGuard::new(self.device).ok()?;
        cuda::mem_get_info().ok()
    }

    fn name(&self) -> &'static str {
        "cuda"
    }
}
