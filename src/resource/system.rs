//! Host memory from the system allocator (usable by the GPU on HMM/ATS systems).

use super::{align_up, MemoryKind, MemoryResource, ALLOCATION_ALIGNMENT};
use crate::cuda::Stream;
use crate::error::{Error, Result};
use std::alloc::{alloc, dealloc, Layout};

/// Pageable host memory from Rust's global allocator, 256-byte aligned. On systems with HMM or
/// ATS the GPU can use it directly.
#[derive(Debug, Clone, Default)]
pub struct SystemMemoryResource;

impl SystemMemoryResource {
    /// The system resource.
    pub fn new() -> Self {
        SystemMemoryResource
    }

    fn layout(bytes: usize) -> Result<Layout> {
        let size = align_up(bytes, ALLOCATION_ALIGNMENT)
            .ok_or_else(|| Error::out_of_memory(bytes, "size overflows"))?;
        Layout::from_size_align(size, ALLOCATION_ALIGNMENT)
            .map_err(|_| Error::out_of_memory(bytes, "size too large for the host"))
    }
}

impl MemoryResource for SystemMemoryResource {
    fn allocate(&self, bytes: usize, _stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        let layout = Self::layout(bytes)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc(layout) };
        if ptr.is_null() {
            return Err(Error::out_of_memory(bytes, "the system allocator failed"));
        }
        Ok(ptr as usize)
    }

    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        if !stream.is_default() && crate::cuda::driver_available() {
            // Work on the stream may still read the memory.
            stream.synchronize()?;
        }
        let layout = Self::layout(bytes)?;
        // SAFETY: `ptr` came from `allocate` with the same size (the trait's contract), hence
        // the same layout.
        unsafe { dealloc(ptr as *mut u8, layout) };
        Ok(())
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn name(&self) -> &'static str {
        "system"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_writes_real_memory() {
        let mr = SystemMemoryResource::new();
        let p = mr.allocate(1000, Stream::DEFAULT).unwrap();
        assert_eq!(p % 256, 0);
        // SAFETY: 1000 bytes were just allocated at `p`.
        unsafe { std::ptr::write_bytes(p as *mut u8, 7, 1000) };
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(p, 1000, Stream::DEFAULT) }.unwrap();
    }
}
