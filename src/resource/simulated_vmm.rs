//! A pretend virtual memory range: addresses reserved, pages "mapped" against a physical
//! capacity, no memory behind them.

use super::virtual_memory::{round_up, VirtualMemory};
use super::{CallProfile, MemoryKind};
use crate::error::{Error, Result};
use parking_lot::Mutex;

/// First reserved address: non-null, apart from [`SimulatedMemoryResource`]'s addresses,
/// 2 MiB aligned.
///
/// [`SimulatedMemoryResource`]: super::SimulatedMemoryResource
const BASE_ADDRESS: usize = 0x7c00_0000_0000;

/// Default page size: the allocation granularity of current NVIDIA GPUs.
pub const DEFAULT_PAGE_SIZE: usize = 2 << 20;

/// A simulated [`VirtualMemory`]: a reservation of any size whose pages count against a physical
/// `capacity`, failing with out-of-memory only when the capacity runs out (as `cuMemCreate`
/// does). For replays at any GPU size and for CPU tests; never dereference its addresses.
#[derive(Debug)]
pub struct SimulatedVirtualMemory {
    capacity: usize,
    page_size: usize,
    reserved: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// One bit per page: mapped or not.
    mapped: Vec<u64>,
    mapped_pages: usize,
    peak_pages: usize,
    /// Successful map and unmap calls.
    maps: usize,
    unmaps: usize,
}

impl State {
    fn is_mapped(&self, page: usize) -> bool {
        self.mapped[page / 64] & (1 << (page % 64)) != 0
    }

    fn flip(&mut self, page: usize) {
        self.mapped[page / 64] ^= 1 << (page % 64);
    }
}

impl SimulatedVirtualMemory {
    /// A device of `capacity` physical bytes (rounded down to pages) with `reserve_size` bytes
    /// of addresses (rounded up to pages) mapped in pages of `page_size` bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a page size that is zero or not a multiple of 256.
    pub fn new(capacity: usize, reserve_size: usize, page_size: usize) -> Result<Self> {
        if page_size == 0 || page_size % super::ALLOCATION_ALIGNMENT != 0 {
            return Err(Error::invalid(
                "page_size",
                format!("{page_size} is not a positive multiple of 256"),
            ));
        }
        let reserved = round_up(reserve_size.max(page_size), page_size)?;
        let pages = reserved / page_size;
        Ok(SimulatedVirtualMemory {
            capacity: capacity / page_size * page_size,
            page_size,
            reserved,
            state: Mutex::new(State {
                mapped: vec![0; pages.div_ceil(64)],
                ..State::default()
            }),
        })
    }

    /// Physical bytes of the pretend device.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The most bytes ever mapped at once.
    pub fn peak_mapped_bytes(&self) -> usize {
        self.state.lock().peak_pages * self.page_size
    }

    /// Successful (map, unmap) calls so far.
    pub fn call_counts(&self) -> (usize, usize) {
        let s = self.state.lock();
        (s.maps, s.unmaps)
    }

    /// Whether the page holding `addr` is mapped (false outside the reservation).
    pub fn is_mapped(&self, addr: usize) -> bool {
        match addr.checked_sub(BASE_ADDRESS) {
            Some(offset) if offset < self.reserved => {
                self.state.lock().is_mapped(offset / self.page_size)
            }
            _ => false,
        }
    }

    /// The page indices of `addr .. addr + bytes`, checked to be whole pages of the reservation.
    fn pages(&self, addr: usize, bytes: usize) -> Result<std::ops::Range<usize>> {
        let offset = addr.wrapping_sub(BASE_ADDRESS);
        let in_range = addr >= BASE_ADDRESS
            && offset
                .checked_add(bytes)
                .is_some_and(|end| end <= self.reserved);
        if !in_range || offset % self.page_size != 0 || bytes % self.page_size != 0 {
            return Err(Error::invalid(
                "range",
                format!(
                    "{addr:#x}+{bytes:#x} is not whole pages of {} inside the reservation",
                    self.page_size
                ),
            ));
        }
        Ok(offset / self.page_size..(offset + bytes) / self.page_size)
    }
}

impl VirtualMemory for SimulatedVirtualMemory {
    fn page_size(&self) -> usize {
        self.page_size
    }

    fn base(&self) -> usize {
        BASE_ADDRESS
    }

    fn reserved_bytes(&self) -> usize {
        self.reserved
    }

    fn mapped_bytes(&self) -> usize {
        self.state.lock().mapped_pages * self.page_size
    }

    fn map(&self, addr: usize, bytes: usize) -> Result<()> {
        let span = self.pages(addr, bytes)?;
        let mut s = self.state.lock();
        if let Some(page) = span.clone().find(|&p| s.is_mapped(p)) {
            return Err(Error::Logic(format!(
                "simulated virtual memory: page {page} is already mapped"
            )));
        }
        let used = s.mapped_pages * self.page_size;
        if used + bytes > self.capacity {
            return Err(Error::out_of_memory(
                bytes,
                format!(
                    "simulated device of {} bytes has {} bytes mapped",
                    self.capacity, used
                ),
            ));
        }
        for page in span.clone() {
            s.flip(page);
        }
        s.mapped_pages += span.len();
        s.peak_pages = s.peak_pages.max(s.mapped_pages);
        s.maps += 1;
        Ok(())
    }

    unsafe fn unmap(&self, addr: usize, bytes: usize) -> Result<()> {
        let span = self.pages(addr, bytes)?;
        let mut s = self.state.lock();
        if let Some(page) = span.clone().find(|&p| !s.is_mapped(p)) {
            return Err(Error::Logic(format!(
                "simulated virtual memory: page {page} is not mapped"
            )));
        }
        for page in span.clone() {
            s.flip(page);
        }
        s.mapped_pages -= span.len();
        s.unmaps += 1;
        Ok(())
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        Some((self.capacity - self.mapped_bytes(), self.capacity))
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Simulated
    }

    fn device(&self) -> Option<usize> {
        None
    }

    fn call_profile(&self) -> CallProfile {
        // Host bookkeeping that returns at once.
        CallProfile::QUICK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = DEFAULT_PAGE_SIZE;

    #[test]
    fn maps_count_against_the_capacity_all_or_nothing() {
        let vm = SimulatedVirtualMemory::new(4 * P, 16 * P, P).unwrap();
        assert_eq!(vm.reserved_bytes(), 16 * P);
        let base = vm.base();
        vm.map(base, 3 * P).unwrap();
        assert_eq!(vm.mapped_bytes(), 3 * P);
        let e = vm.map(base + 8 * P, 2 * P).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert!(!vm.is_mapped(base + 8 * P), "a failed map maps nothing");
        vm.map(base + 8 * P, P).unwrap();
        assert_eq!(vm.memory_info(), Some((0, 4 * P)));
        // SAFETY: simulated pages; nothing uses them.
        unsafe { vm.unmap(base + P, P) }.unwrap();
        assert!(vm.is_mapped(base) && !vm.is_mapped(base + P) && vm.is_mapped(base + 2 * P));
        assert_eq!(vm.mapped_bytes(), 3 * P);
        assert_eq!(vm.peak_mapped_bytes(), 4 * P);
        assert_eq!(vm.call_counts(), (2, 1));
    }

    #[test]
    fn bad_ranges_are_errors_that_change_nothing() {
        let vm = SimulatedVirtualMemory::new(8 * P, 4 * P, P).unwrap();
        let base = vm.base();
        vm.map(base, P).unwrap();
        assert!(matches!(vm.map(base, 2 * P), Err(Error::Logic(_))));
        assert!(matches!(
            vm.map(base + 256, P),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(vm.map(base + 3 * P, 2 * P).is_err(), "past the reservation");
        assert!(vm.map(base - P, P).is_err(), "below the reservation");
        // SAFETY: simulated pages; nothing uses them.
        let unmapped = unsafe { vm.unmap(base, 2 * P) };
        assert!(matches!(unmapped, Err(Error::Logic(_))));
        assert_eq!(vm.mapped_bytes(), P);
        assert!(SimulatedVirtualMemory::new(P, P, 100).is_err());
    }
}
