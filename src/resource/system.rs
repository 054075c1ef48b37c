//! Host memory from the system allocator (usable by the GPU on HMM/ATS systems).

use super::{align_up, MemoryKind, MemoryResource, ALLOCATION_ALIGNMENT};
use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::live::LiveAllocations;
use std::alloc::{alloc, dealloc, Layout};
use std::sync::Arc;

/// Pageable host memory from Rust's global allocator, 256-byte aligned. On systems with HMM or
/// ATS the GPU can use it directly.
///
/// Frees are checked: the resource records what it hands out (clones share the record), so a
/// pointer it never handed out, a double free or a wrong size is
/// [`Error::Logic`](crate::Error::Logic) rather than a corrupted heap.
#[derive(Debug, Clone, Default)]
pub struct SystemMemoryResource {
    live: Arc<LiveAllocations>,
}

impl SystemMemoryResource {
    /// The system resource.
    pub fn new() -> Self {
        SystemMemoryResource::default()
    }

    /// Number of allocations handed out and not freed.
    pub fn live_allocations(&self) -> usize {
        self.live.len()
    }

    /// The live allocation `(start, bytes)` of this resource (or of a clone of it) that contains
    /// `ptr`, if any.
    ///
    /// # Time Complexity
    /// O(live allocations).
    pub fn allocation_containing(&self, ptr: usize) -> Option<(usize, usize)> {
        self.live.containing(ptr)
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
        if let Err(e) = self.live.insert(ptr as usize, bytes) {
            // SAFETY: `ptr` was just allocated with `layout` and is not handed out.
            unsafe { dealloc(ptr, layout) };
            return Err(e);
        }
        Ok(ptr as usize)
    }

    /// Checks `ptr` and `bytes` against what this resource handed out, waits for `stream`,
    /// and frees.
    ///
    /// # Safety
    /// Preconditions 3 and 4 of [`MemoryResource::deallocate`]; 1 and 2 are checked.
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let layout = Self::layout(bytes)?;
        self.live.remove(ptr, bytes)?;
        if !stream.is_default() && crate::cuda::driver_available() {
            // Work on the stream may still read the memory.
            if let Err(e) = stream.synchronize() {
                let _ = self.live.insert(ptr, bytes);
                return Err(e);
            }
        }
        // SAFETY: the record shows `ptr` came from `allocate` with `bytes` (hence `layout`) and
        // was not freed since; taking the record makes this the only free.
        unsafe { dealloc(ptr as *mut u8, layout) };
        Ok(())
    }

    // Blocking: the system allocator (page faults, mmap) and the stream wait before a free.
    super::direct::blocking_source_info!(kind: MemoryKind::Host, name: "system");
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

    /// Issue 9: `SystemMemoryResource::new().deallocate(0x1000, 8, ..)` was a SIGSEGV.
    #[test]
    fn bogus_double_and_wrong_size_frees_are_logic_errors() {
        let mr = SystemMemoryResource::new();
        // SAFETY: the system resource checks 1 and 2 (documented); default stream.
        let bogus = unsafe { mr.deallocate(0x1000, 8, Stream::DEFAULT) }.unwrap_err();
        assert!(
            matches!(&bogus, Error::Logic(m) if m.contains("0x1000")),
            "{bogus}"
        );
        let p = mr.allocate(100, Stream::DEFAULT).unwrap();
        let clone = mr.clone();
        // SAFETY: as above.
        let wrong = unsafe { clone.deallocate(p, 4096, Stream::DEFAULT) }.unwrap_err();
        assert!(
            matches!(&wrong, Error::Logic(m) if m.contains("size 4096") && m.contains("size 100")),
            "{wrong}"
        );
        // SAFETY: `p` is live with 100 bytes; a clone shares the record.
        unsafe { clone.deallocate(p, 100, Stream::DEFAULT) }.unwrap();
        // SAFETY: checked, as above.
        let double = unsafe { mr.deallocate(p, 100, Stream::DEFAULT) };
        assert!(matches!(double, Err(Error::Logic(_))));
        // Still works.
        let q = mr.allocate(10, Stream::DEFAULT).unwrap();
        assert_eq!(mr.live_allocations(), 1);
        // SAFETY: `q` is live with 10 bytes.
        unsafe { mr.deallocate(q, 10, Stream::DEFAULT) }.unwrap();
        assert_eq!(mr.live_allocations(), 0);
    }
}
