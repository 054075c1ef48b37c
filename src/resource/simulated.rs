//! A pretend device: address ranges with no memory behind them.

use super::{align_up, Footprint, MemoryKind, MemoryResource, ALLOCATION_ALIGNMENT};
use crate::cuda::Stream;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};

/// First address handed out: non-null, far from real allocations, 2 MiB aligned.
const BASE_ADDRESS: usize = 0x7a00_0000_0000;

/// Hands out 256-byte-aligned address ranges of a pretend device of `size` bytes, with best-fit
/// placement and coalescing (like `cudaMalloc`), so replays and suballocator tests run at any
/// GPU size on a machine without one. The pointers must never be dereferenced.
#[derive(Debug)]
pub struct SimulatedMemoryResource {
    size: usize,
    state: Mutex<SimulatedState>,
}

#[derive(Debug, Default)]
struct SimulatedState {
    /// Free ranges by address: start -> length.
    free_by_address: BTreeMap<usize, usize>,
    /// Free ranges by (length, start), for best fit.
    free_by_size: BTreeSet<(usize, usize)>,
    /// Live allocations: start -> rounded length.
    live: BTreeMap<usize, usize>,
    in_use: usize,
    peak: usize,
}

impl SimulatedMemoryResource {
    /// A pretend device of `size` bytes (rounded down to 256).
    pub fn new(size: usize) -> Self {
        let size = size & !(ALLOCATION_ALIGNMENT - 1);
        let mut state = SimulatedState::default();
        if size > 0 {
            state.free_by_address.insert(BASE_ADDRESS, size);
            state.free_by_size.insert((size, BASE_ADDRESS));
        }
        SimulatedMemoryResource {
            size,
            state: Mutex::new(state),
        }
    }

    /// The pretend device's size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes currently allocated (rounded to 256 per allocation).
    pub fn bytes_in_use(&self) -> usize {
        self.state.lock().in_use
    }

    /// The most bytes ever allocated at once.
    pub fn peak_bytes_in_use(&self) -> usize {
        self.state.lock().peak
    }

    /// Number of live allocations.
    pub fn live_allocations(&self) -> usize {
        self.state.lock().live.len()
    }

    /// The pretend addresses this device hands out (empty for a device of size 0).
    pub fn address_range(&self) -> std::ops::Range<usize> {
        BASE_ADDRESS..BASE_ADDRESS + self.size
    }
}

impl MemoryResource for SimulatedMemoryResource {
    fn allocate(&self, bytes: usize, _stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        let rounded = align_up(bytes, ALLOCATION_ALIGNMENT)
            .ok_or_else(|| Error::out_of_memory(bytes, "simulated device: size overflows"))?;
        let mut s = self.state.lock();
        let Some(&(len, start)) = s.free_by_size.range((rounded, 0)..).next() else {
            return Err(Error::out_of_memory(
                bytes,
                format!(
                    "simulated device of {} bytes has no free range that large ({} bytes in use)",
                    self.size, s.in_use
                ),
            ));
        };
        s.free_by_size.remove(&(len, start));
        s.free_by_address.remove(&start);
        if len > rounded {
            s.free_by_address.insert(start + rounded, len - rounded);
            s.free_by_size.insert((len - rounded, start + rounded));
        }
        s.live.insert(start, rounded);
        s.in_use += rounded;
        s.peak = s.peak.max(s.in_use);
        Ok(start)
    }

    unsafe fn deallocate(&self, ptr: usize, _bytes: usize, _stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let mut s = self.state.lock();
        let Some(len) = s.live.remove(&ptr) else {
            return Err(Error::Logic(format!(
                "simulated device: deallocate of {ptr:#x}, which is not allocated"
            )));
        };
        s.in_use -= len;
        let (mut start, mut len) = (ptr, len);
        if let Some((&prev, &prev_len)) = s.free_by_address.range(..start).next_back() {
            if prev + prev_len == start {
                s.free_by_address.remove(&prev);
                s.free_by_size.remove(&(prev_len, prev));
                start = prev;
                len += prev_len;
            }
        }
        if let Some(&next_len) = s.free_by_address.get(&(start + len)) {
            let next = start + len;
            s.free_by_address.remove(&next);
            s.free_by_size.remove(&(next_len, next));
            len += next_len;
        }
        s.free_by_address.insert(start, len);
        s.free_by_size.insert((len, start));
        Ok(())
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Simulated
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        Some((self.size - self.state.lock().in_use, self.size))
    }

    fn footprint(&self) -> Option<Footprint> {
        let s = self.state.lock();
        Some(Footprint {
            held_bytes: s.in_use,
            free_bytes: self.size - s.in_use,
            largest_free_block: s.free_by_size.iter().next_back().map_or(0, |&(len, _)| len),
            free_blocks: s.free_by_size.len(),
        })
    }

    fn call_profile(&self) -> super::CallProfile {
        // Bookkeeping only.
        super::CallProfile::QUICK
    }

    fn name(&self) -> &'static str {
        "simulated"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_disjoint_and_coalesce() {
        let mr = SimulatedMemoryResource::new(1 << 20);
        let a = mr.allocate(1, Stream::DEFAULT).unwrap();
        let b = mr.allocate(300, Stream::DEFAULT).unwrap();
        assert_eq!(a % 256, 0);
        assert_eq!(b, a + 256);
        assert_eq!(mr.bytes_in_use(), 256 + 512);
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(a, 1, Stream::DEFAULT) }.unwrap();
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(b, 300, Stream::DEFAULT) }.unwrap();
        assert_eq!(mr.bytes_in_use(), 0);
        assert_eq!(mr.allocate(1 << 20, Stream::DEFAULT).unwrap(), a);
    }

    #[test]
    fn out_of_memory_and_bad_free_are_errors() {
        let mr = SimulatedMemoryResource::new(1024);
        assert!(mr
            .allocate(2048, Stream::DEFAULT)
            .unwrap_err()
            .is_out_of_memory());
        // SAFETY: simulated memory checks every free (documented), so a bogus pointer is
        // reported and never dereferenced.
        assert!(unsafe { mr.deallocate(0x1234, 8, Stream::DEFAULT) }.is_err());
        assert_eq!(mr.allocate(0, Stream::DEFAULT).unwrap(), 0);
    }
}
