//! `ExpandableMemoryResource`: a stream-ordered pool over one virtual address range that grows
//! by mapping physical pages and shrinks by unmapping free pages anywhere in it.
//!
//! The pool (`PoolMemoryResource`) grows in separate upstream chunks that never coalesce and
//! gives back only chunks that are wholly free; this one reserves one large address range per
//! device (addresses are cheap) and backs it page by page through a [`VirtualMemory`]. A growth
//! step maps pages right after a mapped run that ends in a free fresh block, so the new pages
//! and that block become one block; free blocks coalesce across growth steps because every
//! extension is one growth region of the core (see `core/growth.rs`). `trim` unmaps every page that
//! lies wholly inside a free block. When mapping fails, the core synchronizes, merges every
//! stream's free blocks, trims, and maps again before reporting out of memory.
//!
//! # Growth step
//! At least half of what is mapped (so a growing workload makes few, large mapping calls, like
//! the pool's doubling), capped by the unmapped gap, the maximum and the device's free memory;
//! when that mapping fails, exactly the pages the request needs.
//!
//! # Locking
//! The growth policy's record of mapped runs has its own mutex, taken only under the core's
//! shared lock (growth, trim, snapshots); the virtual memory's lock comes after it.

use super::core::{
    default_events_for, Block, FreeRanges, GrowRequest, Growth, Keeps, StreamEvents,
    StreamOrderedCore,
};
use super::free_lists::CoalescingFreeList;
use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::resource::{
    CallProfile, CudaVirtualMemory, HostVirtualMemory, MemoryKind, MemoryResource, PoolReport,
    SimulatedVirtualMemory, VirtualMemory, DEFAULT_PAGE_SIZE,
};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Default address reservation, as a multiple of the device's memory.
pub const DEFAULT_RESERVE_FACTOR: usize = 4;

/// Default page of the expandable pool on a device: 32 MiB (rounded up to the device's
/// allocation granularity). Each page is one `cuMemCreate` and one `cuMemMap`; at the 2 MiB
/// granularity a pool growing to 72 GB made 36,000 of each and took 1.75 s against the device
/// pool's 0.12 (H100, W11 at 0.9x); PyTorch's expandable segments map 20 MiB pages for large
/// blocks. `trim` gives memory back in whole pages.
pub const DEFAULT_DEVICE_PAGE_SIZE: usize = 32 << 20;

/// Default page of a shareable expandable pool on a device: 128 MiB. Each page an importer
/// needs costs it one import and one map, about 0.2 ms on an H200 (60 GB in 10,000 arrays on
/// 32 MiB pages: 1,788 pages resolved in 0.37 s of the attach's 0.43,
/// `benches/results/2026-12-02-h200-issue49/`); 128 MiB pages are a quarter of the calls, and
/// the device makes them faster too (128 MiB: 1,800 GB/s, 32 MiB: 540).
pub const SHAREABLE_DEVICE_PAGE_SIZE: usize = 128 << 20;

/// An expandable pool's own sizes, whatever memory it maps ([`new`](ExpandableMemoryResource::new));
/// `None`, and [`Default`], is each one's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpandableSizes {
    /// Bytes mapped at once (default 0).
    pub initial_pool_size: Option<usize>,
    /// The most bytes mapped (default: as much as the memory holds).
    pub maximum_pool_size: Option<usize>,
    /// Free bytes above which a free unmaps free pages at once (default: they stay mapped until
    /// [`trim`](ExpandableMemoryResource::trim)).
    pub release_threshold: Option<usize>,
}

/// An expandable pool's sizes and those of the memory its constructors make for it
/// ([`on_device`], [`on_pinned_host`], [`on_simulated`]); `None`, and [`Default`], is each one's
/// default.
///
/// [`on_device`]: ExpandableMemoryResource::on_device
/// [`on_pinned_host`]: ExpandableMemoryResource::on_pinned_host
/// [`on_simulated`]: ExpandableMemoryResource::on_simulated
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpandableOptions {
    /// The pool's sizes.
    pub sizes: ExpandableSizes,
    /// Bytes of addresses reserved (default: [`DEFAULT_RESERVE_FACTOR`] times the device's
    /// memory).
    pub reserve_size: Option<usize>,
    /// Bytes per mapping (default on a device: `DEFAULT_DEVICE_PAGE_SIZE`, rounded up to its
    /// granularity).
    pub page_size: Option<usize>,
    /// On a device: when it is full, spill to at most this many bytes of host pages (see
    /// [`CudaVirtualMemory::with_host_spill`]; default: it never spills).
    pub spill_to_host: Option<usize>,
    /// Make every page so that other processes can map it ([`CudaVirtualMemory::shareable`]):
    /// the pool can then be [`publish`](ExpandableMemoryResource::publish)ed (default: off;
    /// refused with a spill to host pages, on pinned host memory and on simulated memory).
    pub shareable: bool,
}

impl ExpandableOptions {
    /// Bytes of host addresses to reserve: [`reserve_size`](Self::reserve_size), else the
    /// maximum, else the host's memory.
    ///
    /// # Errors
    /// [`Error::Logic`] when neither is given and the host's memory size is unknown.
    pub fn host_reserve(&self) -> Result<usize> {
        match self.reserve_size.or(self.sizes.maximum_pool_size) {
            Some(r) => Ok(r),
            None => Ok(crate::os::host_pages::host_memory_info()
                .ok_or_else(|| Error::Logic("the host's memory size is unknown".into()))?
                .1),
        }
    }
}

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
///
/// # Sleep and wake
/// [`offload`](Self::offload) copies the live allocations to host memory and gives every page
/// back, keeping every address; [`restore`](Self::restore) maps them again and copies back
/// (tags: [`tag`](Self::tag); figures: [`sleep_estimate`](Self::sleep_estimate),
/// [`last_sleep`](Self::last_sleep); any stack: [`crate::suballocator::sleep`]).
#[derive(Clone, Debug)]
pub struct ExpandableMemoryResource {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    core: StreamOrderedCore<CoalescingFreeList>,
    vm: Arc<dyn VirtualMemory>,
    /// The core's stream events (offload synchronizes every stream through them).
    events: Arc<dyn StreamEvents>,
    /// The movement state (`expandable/movement.rs`): the phase allocations read, the
    /// transition lock and the sleep record, the tags and tenants.
    sleep: movement::MovementState,
    /// This pool, for the handles its movers make (the index of sleeping pools, the links
    /// above hold it weakly or through the pool's own `Arc`).
    me: std::sync::Weak<Inner>,
    maximum_pool_size: Option<usize>,
    release_threshold: Option<usize>,
    /// The next sleep's host pages kept ready as the pool grows (shared with the growth policy).
    ready_ahead: Arc<ReadyAhead>,
    /// What the pool shares with other processes, where its memory is shareable (shared with
    /// the growth policy, whose trim keeps exported pages).
    share: Option<Arc<share::PoolShare>>,
}

super::core::relieve_by_core!(Inner, held: |inner| inner.vm.mapped_bytes());

impl ExpandableMemoryResource {
    /// An expandable pool on device `device` with the sizes of `options`; it spills to host
    /// pages when the device is full where [`ExpandableOptions::spill_to_host`] is given
    /// ([`promote`](Self::promote) moves them back).
    ///
    /// # Errors
    /// No driver, a bad device, a device without virtual memory management, the CUDA error of
    /// the reservation, or out of memory for the initial size.
    pub fn on_device(device: usize, options: ExpandableOptions) -> Result<Self> {
        let page_size = options
            .page_size
            .or(options.shareable.then_some(SHAREABLE_DEVICE_PAGE_SIZE));
        let mut vm = device_memory(device, options.reserve_size, page_size)?;
        if let Some(limit) = options.spill_to_host {
            vm = vm.with_host_spill(limit);
        }
        if options.shareable {
            vm = vm.shareable()?;
        }
        Self::new(Arc::new(vm), options.sizes)
    }

    /// An expandable pool on pinned host memory for device `device` ([`HostVirtualMemory`]
    /// registered with CUDA, pages on the device's host NUMA node), with the sizes of `options`
    /// (its defaults on the host: addresses for [`ExpandableOptions::host_reserve`], pages of
    /// [`HOST_PAGE_SIZE`](crate::resource::HOST_PAGE_SIZE); it never spills).
    ///
    /// # Errors
    /// No driver, the host's memory size unknown, out of addresses or memory.
    pub fn on_pinned_host(device: usize, options: ExpandableOptions) -> Result<Self> {
        refuse_shareable(
            &options,
            "pinned host memory is registered as this process's pages",
        )?;
        let vm = HostVirtualMemory::pinned(device, options.host_reserve()?, options.page_size)?;
        Self::new(Arc::new(vm), options.sizes)
    }

    /// An expandable pool on simulated virtual memory of `capacity` bytes (addresses only, for
    /// CPU tests and sizing), with the sizes of `options` (its defaults there: addresses for
    /// [`DEFAULT_RESERVE_FACTOR`] times the capacity, pages of
    /// [`DEFAULT_PAGE_SIZE`](crate::resource::DEFAULT_PAGE_SIZE); it never spills).
    ///
    /// # Errors
    /// As [`SimulatedVirtualMemory::new`](crate::resource::SimulatedVirtualMemory::new) and
    /// [`new`](Self::new).
    pub fn on_simulated(capacity: usize, options: ExpandableOptions) -> Result<Self> {
        refuse_shareable(
            &options,
            "simulated memory has addresses only, no bytes to share",
        )?;
        let vm = SimulatedVirtualMemory::new(
            capacity,
            options
                .reserve_size
                .unwrap_or(capacity.saturating_mul(DEFAULT_RESERVE_FACTOR)),
            options.page_size.unwrap_or(DEFAULT_PAGE_SIZE),
        )?;
        Self::new(Arc::new(vm), options.sizes)
    }

    /// An expandable pool over `vm` with `sizes`.
    ///
    /// # Errors
    /// [`Error::Logic`] when a size is not a multiple of 256 or the initial size exceeds the
    /// maximum; out of memory when the initial size cannot be mapped.
    pub fn new(vm: Arc<dyn VirtualMemory>, sizes: ExpandableSizes) -> Result<Self> {
        let events = default_events_for(vm.kind(), vm.device());
        Self::with_stream_events(vm, sizes, events)
    }

    /// As [`new`](Self::new), with explicit cross-stream ordering (tests use a recording fake).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_stream_events(
        vm: Arc<dyn VirtualMemory>,
        sizes: ExpandableSizes,
        events: Arc<dyn StreamEvents>,
    ) -> Result<Self> {
        let ExpandableSizes {
            initial_pool_size,
            maximum_pool_size,
            release_threshold,
        } = sizes;
        super::pool::check_pool_sizes(initial_pool_size, maximum_pool_size)?;
        if let Some(maximum) = maximum_pool_size.filter(|&m| m < vm.page_size()) {
            return Err(Error::invalid(
                "maximum_pool_size",
                format!(
                    "{maximum} bytes is less than one page ({} bytes): no allocation could \
                     ever be mapped",
                    vm.page_size()
                ),
            ));
        }
        let initial = initial_pool_size.unwrap_or(0);
        if matches!(vm.kind(), MemoryKind::Managed) {
            return Err(Error::invalid(
                "upstream",
                "managed memory cannot be mapped into a virtual address range; \
                 use the pool over managed memory",
            ));
        }
        let sleep = movement::MovementState::default();
        let ready_ahead = Arc::new(ReadyAhead::default());
        let share = vm
            .shareable()
            .then(|| Arc::new(share::PoolShare::default()));
        let pool = ExpandableMemoryResource {
            inner: Arc::new_cyclic(|me: &std::sync::Weak<Inner>| {
                let growth = ExpandableGrowth {
                    phase: sleep.phase.clone(),
                    vm: vm.clone(),
                    maximum: maximum_pool_size,
                    mapped: Mutex::new(BTreeMap::new()),
                    ready_ahead: ready_ahead.clone(),
                    identity: me.as_ptr() as usize,
                    share: share.clone(),
                };
                Inner {
                    core: StreamOrderedCore::<CoalescingFreeList>::new(
                        events.clone(),
                        Box::new(growth),
                        (),
                        "expandable",
                        Keeps::Relievable(me.clone()),
                    ),
                    vm,
                    events,
                    sleep,
                    me: me.clone(),
                    maximum_pool_size,
                    release_threshold,
                    ready_ahead,
                    share,
                }
            }),
        };
        pool.inner.core.preallocate(initial)?;
        Ok(pool)
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

    super::core::free_figures!("mapped");

    /// Synchronizes every stream, merges the free lists, and unmaps free pages (any page wholly
    /// inside a free block, anywhere in the range) until at most `target` bytes stay mapped or no
    /// free page is left; returns the bytes unmapped.
    ///
    /// While asleep nothing is mapped: returns 0 and does nothing (it waits for an offload or
    /// restore under way).
    ///
    /// # Errors
    /// CUDA errors from the synchronization or the unmapping.
    ///
    /// # Time Complexity
    /// O(free blocks · log(free blocks)) plus one unmap per page.
    pub fn trim(&self, target: usize) -> Result<usize> {
        let _sleep = self.inner.sleep.hold();
        if self.inner.sleep.asleep() {
            return Ok(0);
        }
        self.inner.core.release(target)
    }

    /// The opposite of [`trim`](Self::trim): maps free pages (as the pool grows) until at least
    /// `target` bytes are mapped, or the pool's maximum; returns the bytes mapped now. Nothing
    /// is allocated or counted as allocated. While asleep it does nothing and returns 0.
    ///
    /// # Errors
    /// Out of memory when the device has no room; CUDA errors.
    pub fn map_to(&self, target: usize) -> Result<usize> {
        let _sleep = self.inner.sleep.hold();
        if self.inner.sleep.asleep() {
            return Ok(0);
        }
        let before = self.mapped_bytes();
        let page = self.page_size();
        let cap = self
            .maximum_pool_size()
            .map_or(usize::MAX, |m| m / page * page);
        let target = target.div_ceil(page).saturating_mul(page).min(cap);
        // Each step maps at most what is missing (the block's need beside free memory), so
        // the pool never maps past the target; a step that maps nothing ends it.
        loop {
            let now = self.mapped_bytes();
            if now >= target {
                break;
            }
            self.inner.core.grow_exactly(target - now)?;
            if self.mapped_bytes() == now {
                break;
            }
        }
        Ok(self.mapped_bytes().saturating_sub(before))
    }

    /// The virtual memory the pool maps into.
    pub fn virtual_memory(&self) -> &Arc<dyn VirtualMemory> {
        &self.inner.vm
    }
}

impl MemoryResource for ExpandableMemoryResource {
    #[inline]
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        // Two loads of the sleep flag, no lock (see `expandable/sleep.rs`); a pool that sleeps
        // until used wakes here.
        for _ in 0..8 {
            if self.inner.sleep.asleep() && !self.wake_for_use() {
                return Err(movement::asleep_error(bytes));
            }
            let ptr = self.inner.core.allocate(bytes, stream);
            if !self.inner.sleep.asleep() {
                return ptr;
            }
            // A sleep began meanwhile: the block may lie on pages it unmaps. Given back, and
            // made again once a sleep for the ledger woke (refused for a user's).
            if let Ok(ptr) = ptr {
                self.inner.core.deallocate(ptr, bytes, stream)?;
            }
        }
        Err(movement::asleep_error(bytes))
    }

    #[inline]
    // The trait's method is unsafe; this body checks the pointer against the blocks it handed
    // out and relies only on the stream-ordering part of the contract.
    #[allow(unsafe_code)]
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        // A named block's free waits for the importers that hold it (`expandable/share.rs`).
        if let Some(share) = &self.inner.share {
            if share.watching() && share.take_free(&self.inner.me, ptr, bytes, stream) {
                return Ok(());
            }
        }
        self.deallocate_now(ptr, bytes, stream)
    }

    crate::resource::memory_from!(|this| this.inner.vm);

    /// Free: the pool's free bytes plus what it could still map; total: the device's total,
    /// capped by the maximum.
    fn memory_info(&self) -> Option<(usize, usize)> {
        MemoryResource::memory_info(&self.inner.core)
    }

    fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    fn report(&self) -> Option<&dyn PoolReport> {
        Some(&self.inner.core)
    }

    fn name(&self) -> &'static str {
        "expandable"
    }

    fn upstreams(&self) -> Vec<crate::resource::SharedResource> {
        Vec::new()
    }

    /// A source of memory that can sleep: the resources over it see the pool in their link.
    /// Its calls: without a release threshold a suballocator's over the virtual memory's
    /// ([`CallProfile::suballocating`]): calls are answered from bookkeeping and growth maps
    /// pages under the pool's lock. With a threshold a free may trim, which synchronizes every
    /// stream before it unmaps, so the virtual memory's own profile decides.
    fn link(&self) -> crate::resource::Link {
        let vm = self.inner.vm.call_profile();
        let calls = match self.inner.release_threshold {
            Some(_) => vm,
            None => vm.suballocating(),
        };
        let mut link =
            crate::resource::Link::source(self.kind(), self.device(), self.identity(), calls);
        link.sleep = crate::resource::sleep::SleepWatch::of(self.inner.clone());
        link
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

impl ExpandableMemoryResource {
    /// The free itself: the block goes back to the pool now (a named block's free runs this
    /// once its importers let go).
    fn deallocate_now(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        // Allowed while asleep too: bookkeeping only (see `expandable/sleep.rs`).
        self.inner.core.deallocate(ptr, bytes, stream)?;
        self.inner.sleep.forget(ptr);
        self.promote_after_free();
        if let Some(threshold) = self.inner.release_threshold {
            if self.inner.core.free_bytes() > threshold {
                // Never beside an offload or restore (they unmap and map pages themselves),
                // and never waiting for one: the next free trims. The sleep record is taken
                // only when a trim is due, not on every free.
                let Some(_sleep) = self.inner.sleep.try_hold() else {
                    return Ok(());
                };
                let free = self.inner.core.free_bytes();
                if free > threshold && !self.inner.sleep.asleep() {
                    let target = self.mapped_bytes().saturating_sub(free - threshold);
                    self.inner.core.release(target)?;
                }
            }
        }
        Ok(())
    }
}

/// Refuses `options` that ask for a shareable pool on memory that cannot be shared, saying
/// `why`.
fn refuse_shareable(options: &ExpandableOptions, why: &str) -> Result<()> {
    match options.shareable {
        true => Err(Error::invalid("shareable", why.to_string())),
        false => Ok(()),
    }
}

/// Device `device`'s virtual memory: `reserve_size` bytes of addresses (default
/// [`DEFAULT_RESERVE_FACTOR`] times its memory) in pages of `page_size` (default
/// [`DEFAULT_DEVICE_PAGE_SIZE`]).
fn device_memory(
    device: usize,
    reserve_size: Option<usize>,
    page_size: Option<usize>,
) -> Result<CudaVirtualMemory> {
    let reserve = match reserve_size {
        Some(r) => r,
        None => {
            let _ctx = crate::cuda::ContextGuard::new(device)?;
            let (_, total) = crate::cuda::mem_get_info()?;
            total.saturating_mul(DEFAULT_RESERVE_FACTOR)
        }
    };
    let page_size = page_size.unwrap_or(DEFAULT_DEVICE_PAGE_SIZE);
    CudaVirtualMemory::new(device, reserve, Some(page_size))
}

/// The expandable pool's growth policy: where to map, the runs of mapped pages, and the trim.
/// Every extension is one growth region (the reservation's base), so the core's free lists
/// coalesce blocks across growth steps.
#[derive(Debug)]
struct ExpandableGrowth {
    vm: Arc<dyn VirtualMemory>,
    /// The pool's phase ([`Phase`](crate::resource::sleep::Phase) as a byte): no mapping and
    /// no trim unless it is awake (a transition is under way, or it sleeps).
    phase: Arc<std::sync::atomic::AtomicU8>,
    maximum: Option<usize>,
    /// Runs of mapped pages: start -> end (locked after the core's shared lock).
    mapped: Mutex<BTreeMap<usize, usize>>,
    /// Whether (and for how much) the next sleep's host pages are kept ready as the pool grows.
    ready_ahead: Arc<ReadyAhead>,
    /// The pool's identity (its place where its memory is not a device's).
    identity: usize,
    /// What the pool shares: its trim keeps the exported pages mapped.
    share: Option<Arc<share::PoolShare>>,
}

/// An expandable pool's sleeps' host pages: their kind (the memory's own, or plain pageable
/// pages: [`ExpandableMemoryResource::set_pageable_host_copy`]) and whether they are kept
/// ready as the pool grows ([`ExpandableMemoryResource::keep_sleep_ready`]).
#[derive(Debug, Default)]
pub(crate) struct ReadyAhead {
    on: std::sync::atomic::AtomicBool,
    /// The bytes of the range asked for last (0: none yet).
    prepared_for: std::sync::atomic::AtomicUsize,
    /// Plain pageable pages instead of the memory's own kind.
    pageable: std::sync::atomic::AtomicBool,
}

impl ReadyAhead {
    /// The pages a sleep of memory `vm` copies into: the memory's own kind
    /// ([`VirtualMemory::host_pages`]) or plain pages where the pool chose them; `None` where
    /// the pages have no bytes to keep.
    ///
    /// # Errors
    /// Where the memory cannot be copied to the host.
    pub(crate) fn spec(
        &self,
        vm: &dyn VirtualMemory,
    ) -> Result<Option<crate::resource::host_pages::registered::PageSpec>> {
        let own = vm.host_pages()?;
        let pageable = self.pageable.load(std::sync::atomic::Ordering::Relaxed);
        Ok(own.map(|spec| match pageable {
            true => crate::resource::host_pages::registered::PageSpec::plain(),
            false => spec,
        }))
    }

    /// With `mapped` bytes mapped: asks the supply of `vm` to hold a quarter more than `mapped`
    /// when what it asked for last is less than `mapped` (a few asks over a pool's growth, each
    /// making only what the ranges made before lack: the next sleep's copy spans them), on a
    /// thread of the supply's. Never waits.
    pub(crate) fn keep_up(&self, vm: &dyn VirtualMemory, mapped: usize) -> usize {
        use std::sync::atomic::Ordering;
        if !self.on.load(Ordering::Relaxed) || mapped == 0 {
            return 0;
        }
        if mapped <= self.prepared_for.load(Ordering::Relaxed) {
            return 0;
        }
        let Ok(Some(spec)) = self.spec(vm) else {
            return 0;
        };
        let target = mapped.saturating_add(mapped / 4);
        self.prepared_for.store(target, Ordering::Relaxed);
        vm.host_supply().prepare_total(spec, target);
        target
    }
}

/// Fresh ranges for a growth without a view of the fresh list.
struct NoRanges;

impl FreeRanges for NoRanges {
    fn ranges(&self) -> Vec<Block> {
        Vec::new()
    }
    fn ranges_at_least(&self, _min: usize) -> Vec<Block> {
        Vec::new()
    }
    fn ending_at(&self, _end: usize) -> Option<Block> {
        None
    }
    fn take_range(&mut self, _addr: usize, _size: usize) -> bool {
        false
    }
    fn put_back(&mut self, _block: Block) {}
}

impl ExpandableGrowth {
    fn page(&self) -> usize {
        self.vm.page_size()
    }

    /// `bytes` rounded up to whole pages; `None` when that passes the end of the address space
    /// (a request no reservation can hold).
    fn pages_for(&self, bytes: usize) -> Option<usize> {
        bytes.div_ceil(self.page()).checked_mul(self.page())
    }

    /// Where to map for a block of `size` bytes, how many bytes are needed there, and how many
    /// unmapped bytes follow: after a run that ends in a fresh block (fewest new pages), else the
    /// lowest unmapped gap that holds the block.
    ///
    /// # Time Complexity
    /// O(runs) lookups of the fresh list (one per run end), never a read of every free block:
    /// a pool that runs out calls this on every failed request (issue 39: the `--fit` of a log
    /// with thousands of free blocks took a minute).
    fn placement(
        &self,
        runs: &BTreeMap<usize, usize>,
        fresh: &dyn FreeRanges,
        size: usize,
    ) -> Option<(usize, usize, usize)> {
        let base = self.vm.base();
        let end_of_range = base + self.vm.reserved_bytes();
        let gap_after =
            |end: usize| runs.range(end..).next().map_or(end_of_range, |(&s, _)| s) - end;
        let mut best: Option<(usize, usize, usize)> = None;
        for &end in runs.values() {
            let Some(tail) = fresh
                .ending_at(end)
                .filter(|b| b.region == base)
                .map(|b| b.size)
            else {
                continue;
            };
            let Some(need) = self.pages_for(size.saturating_sub(tail)) else {
                continue;
            };
            let room = gap_after(end);
            if need > 0 && need <= room && best.map_or(true, |(_, n, _)| need < n) {
                best = Some((end, need, room));
            }
        }
        if best.is_some() {
            return best;
        }
        // A request whose pages pass the end of the address space fits nowhere (wrapped, it
        // would ask to map nothing at the base).
        let need = self.pages_for(size).filter(|&n| n > 0)?;
        let mut at = self.vm.base();
        for (&start, &end) in runs {
            if start - at >= need {
                return Some((at, need, start - at));
            }
            at = end;
        }
        (end_of_range - at >= need).then_some((at, need, end_of_range - at))
    }

    /// Whether the pool is asleep, falling asleep or waking.
    fn moving(&self) -> bool {
        self.phase.load(std::sync::atomic::Ordering::Acquire)
            != crate::resource::sleep::Phase::Awake.to_u8()
    }

    fn map(&self, request: GrowRequest, fresh: &dyn FreeRanges) -> Result<Block> {
        if self.moving() {
            return Err(movement::asleep_error(request.bytes));
        }
        let base = self.vm.base();
        let mut runs = self.mapped.lock();
        let Some((addr, need, room)) = self.placement(&runs, fresh, request.size) else {
            return Err(Error::out_of_memory(
                request.bytes,
                format!(
                    "expandable: no room in the reserved {} bytes",
                    self.vm.reserved_bytes()
                ),
            ));
        };
        super::core::check_maximum(self.maximum, request.bytes, request.held, need)?;
        let max_room = self
            .maximum
            .map_or(usize::MAX, |m| m.saturating_sub(request.held));
        // Grow by at least half of what is mapped (few growth steps, like the pool's doubling),
        // within the gap, the maximum and the device's free memory; on failure map only the need.
        let half = match request.exact {
            true => need,
            false => self.pages_for(request.held / 2).unwrap_or(need),
        };
        let mut want = half.max(need).min(room);
        want = want.min(need.max(max_room / self.page() * self.page()));
        if let Some((free, _)) = self.vm.memory_info() {
            want = want.min(need.max(free / self.page() * self.page()));
        }
        let mut mapped = self.vm.map(addr, want);
        if want > need && mapped.as_ref().is_err_and(Error::is_out_of_memory) {
            want = need;
            mapped = self.vm.map(addr, want);
        }
        let len = want;
        mapped.map_err(|e| match e.out_of_memory_reason() {
            Some(inner) => Error::out_of_memory(
                request.bytes,
                format!("expandable: mapping {len} bytes failed: {inner}"),
            ),
            None => e,
        })?;
        add_run(&mut runs, addr, len);
        let mapped: usize = runs.iter().map(|(&s, &e)| e - s).sum();
        drop(runs);
        self.ready_ahead.keep_up(self.vm.as_ref(), mapped);
        Ok(Block {
            addr,
            size: len,
            region: base,
        })
    }
}

fn add_run(runs: &mut BTreeMap<usize, usize>, addr: usize, len: usize) {
    let (mut start, mut end) = (addr, addr + len);
    if let Some((&s, &e)) = runs.range(..addr).next_back() {
        if e == addr {
            runs.remove(&s);
            start = s;
        }
    }
    if let Some(e) = runs.remove(&end) {
        end = e;
    }
    runs.insert(start, end);
}

fn remove_run_part(runs: &mut BTreeMap<usize, usize>, addr: usize, len: usize) {
    let Some((&s, &e)) = runs.range(..=addr).next_back() else {
        return;
    };
    runs.remove(&s);
    if s < addr {
        runs.insert(s, addr);
    }
    if addr + len < e {
        runs.insert(addr + len, e);
    }
}

impl Growth for ExpandableGrowth {
    fn grow(&self, request: GrowRequest) -> Result<Block> {
        self.map(request, &NoRanges)
    }

    fn grow_beside(&self, request: GrowRequest, fresh: &dyn FreeRanges) -> Result<Block> {
        self.map(request, fresh)
    }

    crate::resource::memory_from!(|this| this.vm);

    fn call_profile(&self) -> CallProfile {
        self.vm.call_profile()
    }

    fn source_name(&self) -> &'static str {
        "virtual_memory"
    }

    fn source_identity(&self) -> usize {
        self.identity
    }

    fn gives_back_chunks(&self) -> bool {
        false
    }

    /// While the pool sleeps (or falls asleep, or wakes): the runs are the ones to map again.
    fn offloaded(&self) -> bool {
        self.moving()
    }

    fn segments(&self) -> Option<Vec<(usize, usize)>> {
        Some(
            self.mapped
                .lock()
                .iter()
                .map(|(&s, &e)| (s, e - s))
                .collect(),
        )
    }

    /// Not for a request larger than the maximum, the reservation or the physical memory
    /// behind it: unmapping free pages could never make it fit, so a failure leaves them mapped.
    fn may_grow_after_release(&self, size: usize) -> bool {
        let total = self.vm.memory_info().map_or(usize::MAX, |(_, total)| total);
        size <= self
            .maximum
            .unwrap_or(usize::MAX)
            .min(self.vm.reserved_bytes())
            .min(total)
    }

    // The pages go when the virtual memory drops (after the core, which owns this policy).
    #[allow(unsafe_code)]
    unsafe fn give_back(&self, _chunk: Block) -> Result<()> {
        Ok(())
    }

    /// Nothing while the pool sleeps (or falls asleep): the offload unmaps the pages itself.
    #[allow(unsafe_code)]
    fn trim(&self, fresh: &mut dyn FreeRanges, keep: usize) -> (usize, Result<()>) {
        if self.moving() {
            return (0, Ok(()));
        }
        let target = keep;
        let page = self.page();
        let base = self.vm.base();
        let mut runs = self.mapped.lock();
        let mut mapped: usize = runs.iter().map(|(&s, &e)| e - s).sum();
        let mut released = 0;
        // A block smaller than a page holds no whole page: only the larger ones are read.
        for b in fresh.ranges_at_least(page) {
            if mapped <= target {
                break;
            }
            let Some(lo) = self.pages_for(b.addr - base).map(|o| base + o) else {
                continue;
            };
            let hi = base + (b.end() - base) / page * page;
            if hi <= lo {
                continue;
            }
            // Pages exported to other processes stay mapped (`expandable/share.rs`): the
            // rest, highest first.
            let parts = match &self.share {
                Some(share) => share.unkept(lo, hi, page),
                None => vec![(lo, hi)],
            };
            for (lo, hi) in parts.into_iter().rev() {
                if mapped <= target {
                    break;
                }
                let len = (hi - lo).min(self.pages_for(mapped - target).unwrap_or(usize::MAX));
                let at = hi - len;
                if !fresh.take_range(at, len) {
                    continue;
                }
                // SAFETY: the core trims only after synchronizing every stream and merging
                // every list into the fresh one, and the pages lay inside a free block of it
                // (now taken out), so no allocation covers them and no work uses them.
                if let Err(e) = unsafe { self.vm.unmap(at, len) } {
                    // Still mapped: free again, and counted as held.
                    fresh.put_back(Block {
                        addr: at,
                        size: len,
                        region: base,
                    });
                    return (released, Err(e));
                }
                remove_run_part(&mut runs, at, len);
                mapped -= len;
                released += len;
            }
        }
        (released, Ok(()))
    }

    /// Free: the pool's free bytes plus what it could still map; total: the device's total,
    /// capped by the maximum.
    fn memory_info(&self, held: usize, free: usize) -> Option<(usize, usize)> {
        super::core::memory_info_below(self.vm.memory_info(), self.maximum, held, free)
    }
}

/// The figures of a test's virtual memory wrapper (`page_size`, `base`, `reserved_bytes`,
/// `mapped_bytes`, `memory_info`, `kind`), each its field `inner`'s: for the spies and
/// fault injectors of the tests, which differ only in `map`, `unmap` and the copies.
#[cfg(test)]
macro_rules! forward_vm_figures {
    () => {
        fn page_size(&self) -> usize {
            self.inner.page_size()
        }
        fn base(&self) -> usize {
            self.inner.base()
        }
        fn reserved_bytes(&self) -> usize {
            self.inner.reserved_bytes()
        }
        fn mapped_bytes(&self) -> usize {
            self.inner.mapped_bytes()
        }
        fn memory_info(&self) -> Option<(usize, usize)> {
            self.inner.memory_info()
        }
        fn kind(&self) -> MemoryKind {
            self.inner.kind()
        }
    };
}

#[cfg(test)]
mod tests;

impl Drop for Inner {
    /// A pool dropped asleep leaves the process's index of sleeping pools, and its tags the
    /// process's count.
    fn drop(&mut self) {
        if self.sleep.asleep() {
            crate::resource::sleep::index::mark_awake(self.vm.base());
        }
        self.sleep.forget_all_tags();
    }
}

mod backup;
mod movement;
mod share;
mod sleep;
mod spill;
pub use share::{PoolExport, PoolShareFigures};
pub use sleep::{DiscardFill, SleepEstimate, SleepReport, SleepTag};
pub use spill::AutoPromote;
