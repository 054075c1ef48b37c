//! A pretend virtual memory range: addresses reserved, pages "mapped" against a physical
//! capacity, no memory behind them. The addresses are a window of the simulated address space
//! (above every host address: [`super::SIMULATED_ADDRESS_BASE`]) that no other live simulated
//! device or virtual memory holds.

use super::host_pages::registered::PageSpec;
use super::simulated::Window;
use super::virtual_memory::{round_up, VirtualMemory};
use super::{CallProfile, MemoryKind};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::BTreeMap;

/// The largest reservation: the whole simulated address space.
const MAX_RESERVATION: usize = super::simulated::SIMULATED_ADDRESS_SPACE;

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
    /// The reservation's addresses, its own while it lives.
    window: Window,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Mapped pages as runs: first page -> one past the last page (runs neither overlap nor
    /// touch), so the bookkeeping is proportional to the runs, not to the reservation.
    mapped: BTreeMap<usize, usize>,
    mapped_pages: usize,
    peak_pages: usize,
    /// Successful map and unmap calls.
    maps: usize,
    unmaps: usize,
}

impl State {
    /// The run holding `page`, if it is mapped.
    fn run_of(&self, page: usize) -> Option<(usize, usize)> {
        let (&start, &end) = self.mapped.range(..=page).next_back()?;
        (page < end).then_some((start, end))
    }

    fn is_mapped(&self, page: usize) -> bool {
        self.run_of(page).is_some()
    }

    /// The first mapped page in `span`, if any.
    fn first_mapped_in(&self, span: &std::ops::Range<usize>) -> Option<usize> {
        if self.is_mapped(span.start) {
            return Some(span.start);
        }
        self.mapped
            .range(span.clone())
            .next()
            .map(|(&start, _)| start)
    }

    /// Marks `span` (unmapped) as mapped, merging with the runs it touches.
    fn insert(&mut self, span: std::ops::Range<usize>) {
        let mut start = span.start;
        let mut end = span.end;
        if let Some((&s, &e)) = self.mapped.range(..start).next_back() {
            if e == start {
                self.mapped.remove(&s);
                start = s;
            }
        }
        if let Some(e) = self.mapped.remove(&end) {
            end = e;
        }
        self.mapped.insert(start, end);
    }

    /// Marks `span` (inside the mapped run `run`) as unmapped, splitting the run.
    fn remove(&mut self, run: (usize, usize), span: std::ops::Range<usize>) {
        self.mapped.remove(&run.0);
        if run.0 < span.start {
            self.mapped.insert(run.0, span.start);
        }
        if span.end < run.1 {
            self.mapped.insert(span.end, run.1);
        }
    }
}

impl SimulatedVirtualMemory {
    /// A device of `capacity` physical bytes (rounded down to pages) with `reserve_size` bytes
    /// of addresses (rounded up to pages) mapped in pages of `page_size` bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a page size that is zero, not a multiple of 256 or larger
    /// than the capacity, or a reservation larger than the simulated address space
    /// ([`SIMULATED_ADDRESS_SPACE`](super::SIMULATED_ADDRESS_SPACE)); [`Error::OutOfMemory`]
    /// when the live simulated devices and virtual memories leave no window of that size.
    pub fn new(capacity: usize, reserve_size: usize, page_size: usize) -> Result<Self> {
        if page_size == 0 || page_size % super::ALLOCATION_ALIGNMENT != 0 {
            return Err(Error::invalid(
                "page_size",
                format!("{page_size} is not a positive multiple of 256"),
            ));
        }
        if page_size > capacity {
            return Err(Error::invalid(
                "page_size",
                format!(
                    "{page_size} bytes is more than the capacity ({capacity} bytes): not one page \
                     could be mapped"
                ),
            ));
        }
        let reserved = round_up(reserve_size.max(page_size), page_size)?;
        if reserved > MAX_RESERVATION {
            return Err(Error::invalid(
                "reserve_size",
                format!("{reserve_size} bytes is more than the simulated address space holds"),
            ));
        }
        let window = Window::take(reserved, "simulated virtual memory")?;
        Ok(SimulatedVirtualMemory {
            capacity: capacity / page_size * page_size,
            page_size,
            reserved,
            window,
            state: Mutex::new(State::default()),
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
        match addr.checked_sub(self.window.base()) {
            Some(offset) if offset < self.reserved => {
                self.state.lock().is_mapped(offset / self.page_size)
            }
            _ => false,
        }
    }

    /// The page indices of `addr .. addr + bytes`, checked to be whole pages of the reservation.
    fn pages(&self, addr: usize, bytes: usize) -> Result<std::ops::Range<usize>> {
        let base = self.window.base();
        let offset = addr.wrapping_sub(base);
        let in_range = addr >= base
            && offset
                .checked_add(bytes)
                .is_some_and(|end| end <= self.reserved);
        // An empty range is refused too: marked as a run it would make its page look mapped.
        if !in_range || bytes == 0 || offset % self.page_size != 0 || bytes % self.page_size != 0 {
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
        self.window.base()
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
        if let Some(page) = s.first_mapped_in(&span) {
            return Err(Error::Logic(format!(
                "simulated virtual memory: page {page} is already mapped"
            )));
        }
        let used = s.mapped_pages * self.page_size;
        if used
            .checked_add(bytes)
            .map_or(true, |total| total > self.capacity)
        {
            return Err(Error::out_of_memory(
                bytes,
                format!(
                    "simulated device of {} bytes has {} bytes mapped",
                    self.capacity, used
                ),
            ));
        }
        s.mapped_pages += span.len();
        s.insert(span);
        s.peak_pages = s.peak_pages.max(s.mapped_pages);
        s.maps += 1;
        Ok(())
    }

    unsafe fn unmap(&self, addr: usize, bytes: usize) -> Result<()> {
        let span = self.pages(addr, bytes)?;
        let mut s = self.state.lock();
        let run = match s.run_of(span.start) {
            Some(run) if run.1 >= span.end => run,
            Some(run) => {
                return Err(Error::Logic(format!(
                    "simulated virtual memory: page {} is not mapped",
                    run.1
                )))
            }
            None => {
                return Err(Error::Logic(format!(
                    "simulated virtual memory: page {} is not mapped",
                    span.start
                )))
            }
        };
        s.mapped_pages -= span.len();
        s.remove(run, span);
        s.unmaps += 1;
        Ok(())
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        Some((self.capacity - self.mapped_bytes(), self.capacity))
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Simulated
    }

    fn call_profile(&self) -> CallProfile {
        // Host bookkeeping that returns at once.
        CallProfile::QUICK
    }

    /// No host memory: simulated pages have no bytes to keep.
    fn host_pages(&self) -> Result<Option<PageSpec>> {
        Ok(None)
    }

    unsafe fn copy_out(&self, _addr: usize, _dst: usize, _bytes: usize) -> Result<()> {
        Ok(())
    }

    unsafe fn copy_in(&self, _addr: usize, _src: usize, _bytes: usize) -> Result<()> {
        Ok(())
    }

    unsafe fn fill_zero(&self, _addr: usize, _bytes: usize) -> Result<()> {
        Ok(())
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
        assert!(
            matches!(vm.map(base + P, 0), Err(Error::InvalidArgument { .. })),
            "an empty range is no mapping"
        );
        vm.map(base + P, P).unwrap();
        // SAFETY: simulated pages; nothing uses them.
        unsafe { vm.unmap(base + P, P) }.unwrap();
        // SAFETY: simulated pages; nothing uses them.
        let unmapped = unsafe { vm.unmap(base, 2 * P) };
        assert!(matches!(unmapped, Err(Error::Logic(_))));
        assert_eq!(vm.mapped_bytes(), P);
        assert!(SimulatedVirtualMemory::new(P, P, 100).is_err());
        assert!(SimulatedVirtualMemory::new(P, usize::MAX - 4 * P, P).is_err());
    }

    #[test]
    fn huge_reservations_cost_nothing_and_runs_merge_and_split() {
        // 2^61 bytes of addresses: bookkeeping is per run, not per page.
        let vm = SimulatedVirtualMemory::new(1 << 40, 1 << 61, P).unwrap();
        let base = vm.base();
        let far = base + (1 << 60);
        vm.map(far, 4 * P).unwrap();
        vm.map(far + 4 * P, 2 * P).unwrap();
        vm.map(far - P, P).unwrap();
        assert_eq!(vm.state.lock().mapped.len(), 1, "touching runs merge");
        // SAFETY: simulated pages; nothing uses them.
        unsafe { vm.unmap(far + P, 2 * P) }.unwrap();
        assert_eq!(
            vm.state.lock().mapped.len(),
            2,
            "an unmap in the middle splits"
        );
        assert!(vm.is_mapped(far) && !vm.is_mapped(far + P) && vm.is_mapped(far + 3 * P));
        // SAFETY: as above.
        let half_mapped = unsafe { vm.unmap(far, 2 * P) };
        assert!(matches!(half_mapped, Err(Error::Logic(_))));
        assert!(matches!(vm.map(far + 5 * P, 2 * P), Err(Error::Logic(_))));
        assert_eq!(vm.mapped_bytes(), 5 * P);
    }
}
