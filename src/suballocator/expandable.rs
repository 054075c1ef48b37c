//! `ExpandableMemoryResource`: a stream-ordered pool over one virtual address range that grows
//! by mapping physical pages and shrinks by unmapping free pages anywhere in it.
//!
//! The pool (`PoolMemoryResource`) grows in separate upstream chunks that never coalesce and
//! gives back only chunks that are wholly free; this one reserves one large address range per
//! device (addresses are cheap) and backs it page by page through a [`VirtualMemory`]. A growth
//! step maps pages right after a mapped run that ends in a free fresh block, so the new pages
//! and that block become one block; free blocks coalesce across growth steps because the free
//! lists ([`AddressFreeLists`]) have no chunk boundaries. `trim` unmaps every page that lies
//! wholly inside a free block. When mapping fails, the core synchronizes, merges every stream's
//! free blocks, trims, and maps again before reporting out of memory.

use super::address_free_list::AddressFreeLists;
use super::stream_events::StreamEvents;
use super::stream_ordered::{
    default_events, BlockLists, FreeList, Growth, ListId, StreamOrderedCore,
};
use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::resource::{
    align_up, CudaVirtualMemory, Footprint, MemoryKind, MemoryResource, SharedResource,
    VirtualMemory, ALLOCATION_ALIGNMENT,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Default address reservation, as a multiple of the device's memory.
pub const DEFAULT_RESERVE_FACTOR: usize = 4;

/// A stream-ordered, coalescing pool on one virtual address range whose physical pages are
/// mapped as it grows and unmapped by [`trim`](ExpandableMemoryResource::trim) (PyTorch's
/// `expandable_segments` for every library).
///
/// Named for PyTorch's option, which its users know: the pool's one segment expands in place.
/// Cheap to clone (clones share the pool); the pages are unmapped and the addresses freed when
/// the last clone drops.
///
/// # Figures
/// [`mapped_bytes`](Self::mapped_bytes) (physical memory held), [`reserved_bytes`](Self::reserved_bytes)
/// (addresses), [`free_bytes`](Self::free_bytes), [`largest_free_block`](Self::largest_free_block).
#[derive(Clone, Debug)]
pub struct ExpandableMemoryResource {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    core: StreamOrderedCore<ExpandableStrategy>,
    vm: Arc<dyn VirtualMemory>,
    maximum_pool_size: Option<usize>,
    release_threshold: Option<usize>,
}

impl ExpandableMemoryResource {
    /// An expandable pool on device `device`: `reserve_size` bytes of addresses (default
    /// [`DEFAULT_RESERVE_FACTOR`] times the device's memory), pages of `page_size` bytes (default
    /// the allocation granularity, 2 MiB), `initial_pool_size` bytes mapped at once (default 0),
    /// at most `maximum_pool_size` bytes mapped, and free memory above `release_threshold` bytes
    /// unmapped after a free (default: kept until [`trim`](Self::trim)).
    ///
    /// # Errors
    /// No driver, a bad device, a device without virtual memory management, the CUDA error of
    /// the reservation, or out of memory for the initial size.
    pub fn on_device(
        device: usize,
        reserve_size: Option<usize>,
        page_size: Option<usize>,
        initial_pool_size: Option<usize>,
        maximum_pool_size: Option<usize>,
        release_threshold: Option<usize>,
    ) -> Result<Self> {
        let reserve = match reserve_size {
            Some(r) => r,
            None => {
                let _ctx = crate::cuda::ContextGuard::new(device)?;
                let (_, total) = crate::cuda::mem_get_info()?;
                total.saturating_mul(DEFAULT_RESERVE_FACTOR)
            }
        };
        let vm: Arc<dyn VirtualMemory> =
            Arc::new(CudaVirtualMemory::new(device, reserve, page_size)?);
        Self::new(vm, initial_pool_size, maximum_pool_size, release_threshold)
    }

    /// An expandable pool over `vm` (see [`on_device`](Self::on_device) for the sizes).
    ///
    /// # Errors
    /// [`Error::Logic`] when a size is not a multiple of 256 or the initial size exceeds the
    /// maximum; out of memory when the initial size cannot be mapped.
    pub fn new(
        vm: Arc<dyn VirtualMemory>,
        initial_pool_size: Option<usize>,
        maximum_pool_size: Option<usize>,
        release_threshold: Option<usize>,
    ) -> Result<Self> {
        let info: SharedResource = Arc::new(VirtualMemoryInfo { vm: vm.clone() });
        let events = default_events(&info);
        Self::with_events(
            vm,
            info,
            initial_pool_size,
            maximum_pool_size,
            release_threshold,
            events,
        )
    }

    /// As [`new`](Self::new), with explicit cross-stream ordering (tests use a recording fake).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_stream_events(
        vm: Arc<dyn VirtualMemory>,
        initial_pool_size: Option<usize>,
        maximum_pool_size: Option<usize>,
        events: Arc<dyn StreamEvents>,
    ) -> Result<Self> {
        let info: SharedResource = Arc::new(VirtualMemoryInfo { vm: vm.clone() });
        Self::with_events(vm, info, initial_pool_size, maximum_pool_size, None, events)
    }

    fn with_events(
        vm: Arc<dyn VirtualMemory>,
        info: SharedResource,
        initial_pool_size: Option<usize>,
        maximum_pool_size: Option<usize>,
        release_threshold: Option<usize>,
        events: Arc<dyn StreamEvents>,
    ) -> Result<Self> {
        for (name, size) in [
            ("Initial", initial_pool_size),
            ("Maximum", maximum_pool_size),
        ] {
            if size.is_some_and(|s| s % ALLOCATION_ALIGNMENT != 0) {
                return Err(Error::Logic(format!(
                    "Error, {name} pool size required to be a multiple of 256 bytes"
                )));
            }
        }
        let initial = initial_pool_size.unwrap_or(0);
        if initial > maximum_pool_size.unwrap_or(usize::MAX) {
            return Err(Error::Logic(
                "Initial pool size exceeds the maximum pool size!".into(),
            ));
        }
        if matches!(vm.kind(), MemoryKind::Managed) {
            return Err(Error::invalid(
                "upstream",
                "managed memory cannot be mapped into a virtual address range; \
                 use the pool over managed memory",
            ));
        }
        let strategy = ExpandableStrategy::new(vm.clone(), maximum_pool_size);
        let core = StreamOrderedCore::new(
            info,
            events,
            Growth::Geometric {
                maximum: maximum_pool_size,
            },
            strategy,
            "expandable",
        );
        core.preallocate(initial)?;
        Ok(ExpandableMemoryResource {
            inner: Arc::new(Inner {
                core,
                vm,
                maximum_pool_size,
                release_threshold,
            }),
        })
    }

    /// Bytes of physical memory mapped, free and allocated.
    pub fn mapped_bytes(&self) -> usize {
        self.inner.vm.mapped_bytes()
    }

    /// Bytes of addresses reserved.
    pub fn reserved_bytes(&self) -> usize {
        self.inner.vm.reserved_bytes()
    }

    /// Bytes of one page, the unit of mapping.
    pub fn page_size(&self) -> usize {
        self.inner.vm.page_size()
    }

    /// The maximum of mapped bytes, if one was set.
    pub fn maximum_pool_size(&self) -> Option<usize> {
        self.inner.maximum_pool_size
    }

    /// Free bytes after a free above which free pages are unmapped at once, if set.
    pub fn release_threshold(&self) -> Option<usize> {
        self.inner.release_threshold
    }

    /// Free bytes in the pool (mapped and not allocated), over all streams.
    pub fn free_bytes(&self) -> usize {
        self.inner.core.free_bytes()
    }

    /// The largest free block, in bytes.
    pub fn largest_free_block(&self) -> usize {
        self.inner.core.footprint().largest_free_block
    }

    /// Number of free blocks, over all streams.
    pub fn free_block_count(&self) -> usize {
        self.inner.core.free_blocks()
    }

    /// Synchronizes every stream, merges the free lists, and unmaps free pages (any page wholly
    /// inside a free block, anywhere in the range) until at most `target` bytes stay mapped or no
    /// free page is left; returns the bytes unmapped.
    ///
    /// # Errors
    /// CUDA errors from the synchronization or the unmapping.
    ///
    /// # Time Complexity
    /// O(free blocks · log(free blocks)) plus one unmap per page.
    pub fn trim(&self, target: usize) -> Result<usize> {
        self.inner.core.trim(target)
    }

    /// The virtual memory the pool maps into.
    pub fn virtual_memory(&self) -> &Arc<dyn VirtualMemory> {
        &self.inner.vm
    }
}

impl MemoryResource for ExpandableMemoryResource {
    #[inline]
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        self.inner.core.allocate(bytes, stream)
    }

    #[inline]
    // The trait's method is unsafe; this body checks the pointer against the blocks it handed
    // out and relies only on the stream-ordering part of the contract.
    #[allow(unsafe_code)]
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        self.inner.core.deallocate(ptr, bytes, stream)?;
        if let Some(threshold) = self.inner.release_threshold {
            let free = self.inner.core.free_bytes();
            if free > threshold {
                let target = self.mapped_bytes() - (free - threshold);
                self.inner.core.trim(target)?;
            }
        }
        Ok(())
    }

    fn kind(&self) -> MemoryKind {
        self.inner.vm.kind()
    }

    fn device(&self) -> Option<usize> {
        self.inner.vm.device()
    }

    /// Free: the pool's free bytes plus what it could still map; total: the device's total,
    /// capped by the maximum.
    fn memory_info(&self) -> Option<(usize, usize)> {
        let (up_free, up_total) = self.inner.vm.memory_info()?;
        let max = self.inner.maximum_pool_size.unwrap_or(usize::MAX);
        let room = max.saturating_sub(self.mapped_bytes()).min(up_free);
        Some((self.free_bytes() + room, up_total.min(max)))
    }

    fn footprint(&self) -> Option<Footprint> {
        Some(self.inner.core.footprint())
    }

    fn name(&self) -> &'static str {
        "expandable"
    }

    fn memory_stats(&self) -> Option<super::MemoryStats> {
        Some(self.inner.core.memory_stats())
    }

    fn reset_peak_memory_stats(&self) -> bool {
        self.inner.core.reset_peak_memory_stats();
        true
    }

    fn memory_snapshot(&self) -> Option<Vec<super::SegmentInfo>> {
        let mut segments = self.inner.core.snapshot();
        for s in &mut segments {
            s.expandable = true;
        }
        Some(segments)
    }
}

/// The core's "upstream": describes the virtual memory (kind, device, free memory) and hands
/// out nothing; the strategy grows by mapping.
#[derive(Debug)]
struct VirtualMemoryInfo {
    vm: Arc<dyn VirtualMemory>,
}

impl MemoryResource for VirtualMemoryInfo {
    fn allocate(&self, bytes: usize, _stream: Stream) -> Result<usize> {
        Err(Error::out_of_memory(
            bytes,
            "expandable: grows by mapping pages, not from an upstream",
        ))
    }

    // Hands out nothing, so every free is refused; nothing unsafe happens here.
    #[allow(unsafe_code)]
    unsafe fn deallocate(&self, ptr: usize, _bytes: usize, _stream: Stream) -> Result<()> {
        Err(Error::Logic(format!(
            "expandable: {ptr:#x} was not allocated from an upstream"
        )))
    }

    fn kind(&self) -> MemoryKind {
        self.vm.kind()
    }

    fn device(&self) -> Option<usize> {
        self.vm.device()
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.vm.memory_info()
    }

    fn name(&self) -> &'static str {
        "virtual_memory"
    }
}

/// The expandable pool's strategy: address-ordered free lists over the reservation, the runs of
/// mapped pages, and the growth and trim policy.
#[derive(Debug)]
pub(crate) struct ExpandableStrategy {
    lists: AddressFreeLists,
    vm: Arc<dyn VirtualMemory>,
    page: usize,
    base: usize,
    end: usize,
    /// Runs of mapped pages: start -> end.
    runs: BTreeMap<usize, usize>,
    mapped: usize,
    maximum: Option<usize>,
}

impl ExpandableStrategy {
    fn new(vm: Arc<dyn VirtualMemory>, maximum: Option<usize>) -> Self {
        let (page, base) = (vm.page_size(), vm.base());
        ExpandableStrategy {
            lists: AddressFreeLists::new(),
            page,
            base,
            end: base + vm.reserved_bytes(),
            vm,
            runs: BTreeMap::new(),
            mapped: 0,
            maximum,
        }
    }

    fn pages_for(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.page) * self.page
    }

    /// Where to map for a block of `size` bytes: after a run ending in a fresh block (fewest new
    /// pages), else the lowest unmapped gap that holds the block.
    fn placement(&self, size: usize) -> Option<(usize, usize)> {
        let gap_after = |end: usize| {
            self.runs
                .range(end..)
                .next()
                .map_or(self.end, |(&start, _)| start)
                - end
        };
        let mut best: Option<(usize, usize)> = None;
        for &end in self.runs.values() {
            let Some(tail) = self.lists.fresh_ending_at(end) else {
                continue;
            };
            let need = self.pages_for(size.saturating_sub(tail));
            if need > 0 && need <= gap_after(end) && best.map_or(true, |(_, n)| need < n) {
                best = Some((end, need));
            }
        }
        if best.is_some() {
            return best;
        }
        let need = self.pages_for(size);
        let mut at = self.base;
        for (&start, &end) in &self.runs {
            if start - at >= need {
                return Some((at, need));
            }
            at = end;
        }
        (self.end - at >= need).then_some((at, need))
    }

    fn add_run(&mut self, addr: usize, len: usize) {
        let (mut start, mut end) = (addr, addr + len);
        if let Some((&s, &e)) = self.runs.range(..addr).next_back() {
            if e == addr {
                self.runs.remove(&s);
                start = s;
            }
        }
        if let Some(e) = self.runs.remove(&end) {
            end = e;
        }
        self.runs.insert(start, end);
    }

    fn remove_run_part(&mut self, addr: usize, len: usize) {
        let Some((&s, &e)) = self.runs.range(..=addr).next_back() else {
            return;
        };
        self.runs.remove(&s);
        if s < addr {
            self.runs.insert(s, addr);
        }
        if addr + len < e {
            self.runs.insert(addr + len, e);
        }
    }

    fn grow_for(&mut self, bytes: usize, size: usize) -> Result<usize> {
        let Some((addr, len)) = self.placement(size) else {
            return Err(Error::out_of_memory(
                bytes,
                format!(
                    "expandable: no room in the reserved {} bytes",
                    self.end - self.base
                ),
            ));
        };
        if let Some(max) = self.maximum {
            if self.mapped + len > max {
                return Err(Error::out_of_memory(
                    bytes,
                    format!(
                        "Maximum pool size exceeded: not enough room to grow, \
                         current/max/try size = {}, {}, {}",
                        self.mapped, max, len
                    ),
                ));
            }
        }
        self.vm.map(addr, len).map_err(|e| match e {
            Error::OutOfMemory { .. } => {
                let text = e.to_string();
                let inner = text
                    .strip_prefix("std::bad_alloc: out_of_memory: ")
                    .unwrap_or(&text)
                    .to_owned();
                Error::out_of_memory(
                    bytes,
                    format!("expandable: mapping {len} bytes failed: {inner}"),
                )
            }
            other => other,
        })?;
        self.mapped += len;
        self.add_run(addr, len);
        self.lists.add_range(addr, len);
        Ok(len)
    }

    // The one unsafe call of the suballocators: unmapping pages (see the SAFETY line).
    #[allow(unsafe_code)]
    fn trim_to(&mut self, target: usize) -> Result<usize> {
        let mut released = 0;
        for (addr, size) in self.lists.free_blocks_by_address() {
            if self.mapped <= target {
                break;
            }
            let lo = self.pages_for(addr - self.base) + self.base;
            let hi = (addr + size - self.base) / self.page * self.page + self.base;
            if hi <= lo {
                continue;
            }
            let len = (hi - lo).min(self.pages_for(self.mapped - target));
            let at = hi - len;
            self.lists.carve(at, len)?;
            // SAFETY: the core calls `trim` only after synchronizing every stream (FreeList::trim
            // contract), and the pages lie inside a free block, which no live allocation covers.
            if let Err(e) = unsafe { self.vm.unmap(at, len) } {
                self.lists.add_range(at, len);
                return Err(e);
            }
            self.remove_run_part(at, len);
            self.mapped -= len;
            released += len;
        }
        Ok(released)
    }
}

impl FreeList for ExpandableStrategy {
    fn block_size_for(&self, bytes: usize) -> Result<usize> {
        align_up(bytes, ALLOCATION_ALIGNMENT)
            .ok_or_else(|| Error::out_of_memory(bytes, "request size overflows"))
    }

    fn add_list(&mut self) -> ListId {
        self.lists.add_list()
    }

    fn can_take(&self, list: ListId, size: usize) -> bool {
        self.lists.can_take(list, size)
    }

    fn take(&mut self, list: ListId, size: usize) -> Option<usize> {
        self.lists.take(list, size)
    }

    fn give_back(&mut self, list: ListId, addr: usize, _size: usize) -> Result<()> {
        self.lists.give_back(list, addr)
    }

    fn add_chunk(&mut self, addr: usize, size: usize) {
        self.lists.add_range(addr, size);
    }

    fn absorb_fresh_neighbours(&mut self, list: ListId) -> bool {
        self.lists.absorb_fresh_neighbours(list)
    }

    fn merge_all_into_fresh(&mut self) {
        self.lists.merge_all_into_fresh();
    }

    fn remove_free_chunks(&mut self) -> Vec<(usize, usize)> {
        Vec::new()
    }

    fn free_bytes(&self) -> usize {
        self.lists.free_bytes()
    }

    fn free_blocks(&self) -> usize {
        self.lists.free_count()
    }

    fn largest_free_block(&self) -> usize {
        self.lists.largest_free_block()
    }

    fn grow(&mut self, bytes: usize, size: usize) -> Option<Result<usize>> {
        Some(self.grow_for(bytes, size))
    }

    fn trim(&mut self, target: usize) -> Option<Result<usize>> {
        Some(self.trim_to(target))
    }

    fn segments(&self) -> Option<Vec<(usize, usize)>> {
        Some(self.runs.iter().map(|(&s, &e)| (s, e - s)).collect())
    }

    fn blocks(&self) -> BlockLists {
        (
            self.lists.allocated_blocks(),
            self.lists.free_blocks_by_address(),
        )
    }
}

#[cfg(test)]
mod tests;
