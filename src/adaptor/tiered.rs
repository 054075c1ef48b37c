//! A resource over an ordered list of tiers (device -> peer GPU -> host, for data beyond one
//! GPU): each allocation goes to the first tier with room, each free back to the tier that made
//! the allocation, and every tier keeps its own counters ([`TieredMemoryResource::tier_counts`]).
//!
//! It generalises [`FallbackResourceAdaptor`](super::FallbackResourceAdaptor) (two tiers, the
//! alternate's pointers recorded) to any number of tiers, and records every pointer, so that
//! frees are checked and each allocation's tier is known to the snapshot
//! ([`TieredMemoryResource::tier_of`]).

use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::live::LiveAllocations;
use crate::report::{BlockInfo, BlockState, Footprint, PoolReport, SegmentInfo};
use crate::resource::{
    CallProfile, MemoryKind, MemoryResource, SharedResource, TierBook, TierCounts,
};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// The most tiers a [`TieredMemoryResource`] takes (device, peers, host: a handful).
pub const MAX_TIERS: usize = 16;

/// One tier: a name for reports (`"device"`, `"peer"`, `"host"`) and the resource it draws on.
#[derive(Clone, Debug)]
pub struct Tier {
    /// The tier's name in counts, replays and snapshots.
    pub name: String,
    /// Where its memory comes from.
    pub resource: SharedResource,
}

impl Tier {
    /// A tier called `name` over `resource`.
    pub fn new(name: impl Into<String>, resource: SharedResource) -> Self {
        Tier {
            name: name.into(),
            resource,
        }
    }
}

/// Which allocations a [`TieredMemoryResource`] records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierRecord {
    /// Every allocation: every free is checked (a pointer not handed out, a double free or a
    /// wrong size is [`Error::Logic`]) and each allocation's tier is known
    /// ([`TieredMemoryResource::tier_of`]).
    Every,
    /// Only the allocations of the tiers after the first (the exceptions, as RMM's fallback
    /// adaptor records its alternate's): a free that none of them holds goes to the first tier,
    /// as safe as that tier is, and costs no record on the common path.
    BeyondFirst,
}

/// One tier's counters, updated without a lock (each a separate atomic: a reader may see one
/// allocation counted in `current_bytes` and not yet in `current_allocations`).
#[derive(Debug, Default)]
struct Counters {
    current_bytes: AtomicUsize,
    peak_bytes: AtomicUsize,
    total_bytes: AtomicU64,
    current_allocations: AtomicUsize,
    peak_allocations: AtomicUsize,
    total_allocations: AtomicU64,
    refused: AtomicU64,
}

impl Counters {
    fn allocated(&self, bytes: usize) {
        let now = self.current_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak_bytes.fetch_max(now, Ordering::Relaxed);
        self.total_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        let n = self.current_allocations.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak_allocations.fetch_max(n, Ordering::Relaxed);
        self.total_allocations.fetch_add(1, Ordering::Relaxed);
    }

    /// Saturating: a first tier that accepts a free of a pointer it never made (one that does
    /// not check, under [`TierRecord::BeyondFirst`]) must not wrap the counters.
    fn freed(&self, bytes: usize) {
        let _ = self
            .current_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(bytes))
            });
        let _ = self
            .current_allocations
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }

    fn reset_peaks(&self) {
        self.peak_bytes.store(
            self.current_bytes.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.peak_allocations.store(
            self.current_allocations.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }

    fn read(&self, name: &str, resource: &str) -> TierCounts {
        TierCounts {
            name: name.to_string(),
            resource: resource.to_string(),
            current_bytes: self.current_bytes.load(Ordering::Relaxed),
            peak_bytes: self.peak_bytes.load(Ordering::Relaxed),
            total_bytes: u128::from(self.total_bytes.load(Ordering::Relaxed)),
            current_allocations: self.current_allocations.load(Ordering::Relaxed),
            peak_allocations: self.peak_allocations.load(Ordering::Relaxed),
            total_allocations: self.total_allocations.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

/// The tiers with their records and counters: what the link carries up ([`TierBook`]).
#[derive(Debug)]
struct Slots(Vec<Slot>);

impl std::ops::Deref for Slots {
    type Target = Vec<Slot>;

    fn deref(&self) -> &Vec<Slot> {
        &self.0
    }
}

impl TierBook for Slots {
    fn tier_counts(&self) -> Vec<TierCounts> {
        self.0
            .iter()
            .map(|s| s.counters.read(&s.tier.name, s.tier.resource.name()))
            .collect()
    }
}

/// A tier with its record (where its allocations are recorded) and counters.
#[derive(Debug)]
struct Slot {
    tier: Tier,
    live: Option<LiveAllocations>,
    counters: Counters,
}

/// Allocates from the first of its tiers with room (device, then a peer GPU, then host memory,
/// in the order given); a tier out of memory passes the request on, any other error of a tier
/// is returned as it is. Frees go to the tier that made the allocation: with
/// [`TierRecord::Every`] (the default) every live pointer is recorded, so a free of a pointer
/// the resource did not make, a double free or a wrong size is [`Error::Logic`] (checked
/// frees). Counters per tier: [`tier_counts`](Self::tier_counts). The
/// [`FallbackResourceAdaptor`](super::FallbackResourceAdaptor) is this resource over two tiers
/// with [`TierRecord::BeyondFirst`].
///
/// Its kind, device and memory figures are the first tier's (the one it is "on"); the others
/// are where memory goes when the first is full. Use tiers whose memory the same kernels can
/// read: device memory, a [`PeerMemoryResource`](crate::resource::PeerMemoryResource) (the
/// device reads its peer's memory over NVLink or PCIe), pinned host or managed memory.
pub struct TieredMemoryResource {
    /// The tiers, shared with the link of every resource over this one ([`TierBook`]).
    slots: Arc<Slots>,
    record: TierRecord,
    name: &'static str,
    /// Allocations that every tier refused.
    failures: AtomicU64,
}

impl std::fmt::Debug for TieredMemoryResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TieredMemoryResource")
            .field("tiers", &self.tiers().collect::<Vec<_>>())
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

impl TieredMemoryResource {
    /// A resource over `tiers`, tried in order, recording every allocation.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no tier, more than [`MAX_TIERS`], or two tiers with the
    /// same name (counts are read by name).
    pub fn new(tiers: Vec<Tier>) -> Result<Self> {
        Self::recording(tiers, TierRecord::Every, "tiered")
    }

    /// A resource over `tiers` recording what `record` says, called `name` in reports and
    /// messages.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn recording(tiers: Vec<Tier>, record: TierRecord, name: &'static str) -> Result<Self> {
        if tiers.is_empty() || tiers.len() > MAX_TIERS {
            return Err(Error::invalid(
                "tiers",
                format!("1 to {MAX_TIERS} tiers, got {}", tiers.len()),
            ));
        }
        for (i, t) in tiers.iter().enumerate() {
            if tiers[..i].iter().any(|u| u.name == t.name) {
                return Err(Error::invalid(
                    "tiers",
                    format!("two tiers are named {:?}", t.name),
                ));
            }
        }
        Ok(Self::checked(tiers, record, name))
    }

    /// As [`recording`](Self::recording), for `tiers` already known to be 1 to [`MAX_TIERS`]
    /// with distinct names.
    pub(super) fn checked(tiers: Vec<Tier>, record: TierRecord, name: &'static str) -> Self {
        let slots = tiers
            .into_iter()
            .enumerate()
            .map(|(i, tier)| Slot {
                tier,
                live: (record == TierRecord::Every || i > 0).then(LiveAllocations::new),
                counters: Counters::default(),
            })
            .collect();
        TieredMemoryResource {
            slots: Arc::new(Slots(slots)),
            record,
            name,
            failures: AtomicU64::new(0),
        }
    }

    /// The tiers, in the order they are tried.
    pub fn tiers(&self) -> impl ExactSizeIterator<Item = &Tier> {
        self.slots.iter().map(|s| &s.tier)
    }

    /// Tier `i`, in the order they are tried.
    pub fn tier(&self, i: usize) -> Option<&Tier> {
        self.slots.get(i).map(|s| &s.tier)
    }

    /// The tiers' names, in order.
    pub fn tier_names(&self) -> Vec<String> {
        self.tiers().map(|t| t.name.clone()).collect()
    }

    /// The counters of every tier, in order.
    pub fn tier_counts(&self) -> Vec<TierCounts> {
        self.slots.tier_counts()
    }

    /// Allocations that no tier could serve, ever.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The index of the tier that holds the live allocation starting at `ptr`, where it is
    /// recorded ([`TierRecord`]).
    pub fn tier_of(&self, ptr: usize) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.live.as_ref().is_some_and(|l| l.size_of(ptr).is_some()))
    }

    /// Every recorded live allocation as (pointer, requested bytes, tier), sorted by pointer.
    pub fn live_allocations(&self) -> Vec<(usize, usize, usize)> {
        let mut out: Vec<_> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.live.as_ref().map(|l| (i, l)))
            .flat_map(|(i, l)| l.entries().into_iter().map(move |(p, b)| (p, b, i)))
            .collect();
        out.sort_unstable();
        out
    }

    /// Sets every tier's peaks to its current values.
    pub fn reset_peaks(&self) {
        for s in self.slots.iter() {
            s.counters.reset_peaks();
        }
    }

    /// Whether tier `i`'s resource is an earlier tier's (the same memory named twice).
    fn same_as_earlier(&self, i: usize) -> bool {
        let id = self.slots[i].tier.resource.identity();
        self.slots[..i]
            .iter()
            .any(|s| s.tier.resource.identity() == id)
    }

    /// Records `ptr` of `bytes`, just made by tier `i`.
    fn record(&self, ptr: usize, bytes: usize, i: usize) -> Result<()> {
        let slot = &self.slots[i];
        if let Some(live) = &slot.live {
            if let Some(other) = self.tier_of(ptr) {
                return Err(Error::Logic(format!(
                    "{}: tier {} returned {ptr:#x}, which tier {} holds live",
                    self.name, slot.tier.name, self.slots[other].tier.name
                )));
            }
            live.insert(ptr, bytes)
                .map_err(|e| Error::Logic(format!("{}: {e}", self.name)))?;
        }
        slot.counters.allocated(bytes);
        Ok(())
    }
}

impl MemoryResource for TieredMemoryResource {
    /// # Errors
    /// Out of memory when every tier is out of memory (naming each); a tier's other errors (a
    /// logic or CUDA error is not a reason to try the next tier).
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let mut reasons = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            match slot.tier.resource.allocate(bytes, stream) {
                Ok(0) => return Ok(0),
                Ok(ptr) => {
                    if let Err(e) = self.record(ptr, bytes, i) {
                        // SAFETY: `ptr` came from this tier just now with `bytes`, unused.
                        let _ = unsafe { slot.tier.resource.deallocate(ptr, bytes, stream) };
                        return Err(e);
                    }
                    return Ok(ptr);
                }
                Err(e) if e.is_out_of_memory() => {
                    slot.counters.refused.fetch_add(1, Ordering::Relaxed);
                    reasons.push(format!(
                        "{} ({}): {e}",
                        slot.tier.name,
                        slot.tier.resource.name()
                    ));
                }
                Err(e) => return Err(e),
            }
        }
        self.failures.fetch_add(1, Ordering::Relaxed);
        Err(Error::out_of_memory(
            bytes,
            format!(
                "{}: every tier is out of memory ({})",
                self.name,
                reasons.join("; ")
            ),
        ))
    }

    /// Frees through the tier that made the allocation. A null pointer goes to the first tier
    /// (a resource below that counts zero-byte allocations, as RMM's statistics adaptor does,
    /// ends the one this resource passed down).
    ///
    /// # Safety
    /// With [`TierRecord::Every`], only preconditions 3 and 4 of [`MemoryResource::deallocate`]:
    /// a pointer this resource did not hand out, a double free or a wrong size is
    /// [`Error::Logic`] and changes nothing. With [`TierRecord::BeyondFirst`], a pointer that no
    /// later tier holds is the first tier's: as safe as that tier.
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        let first = &self.slots[0];
        if ptr == 0 {
            // SAFETY: a null pointer is never a live allocation: freeing it is a no-op for
            // every resource (the trait's contract).
            return unsafe { first.tier.resource.deallocate(0, bytes, stream) };
        }
        let holder = self.slots.iter().find_map(|slot| {
            let live = slot.live.as_ref()?;
            live.size_of(ptr).map(|_| (slot, live))
        });
        if let Some((slot, live)) = holder {
            live.free_checked(ptr, bytes, Some(self.name), || {
                // SAFETY: the record shows `ptr` came from this tier with `bytes` and was not
                // freed since (1, 2); the caller's contract gives 3 and 4.
                unsafe { slot.tier.resource.deallocate(ptr, bytes, stream) }
            })?;
            slot.counters.freed(bytes);
            return Ok(());
        }
        if self.record == TierRecord::Every {
            return Err(Error::Logic(format!(
                "{}: deallocate of {ptr:#x}, which is not allocated (never, already freed, or \
                 inside another allocation)",
                self.name
            )));
        }
        // SAFETY: no later tier holds it, so the first tier's (the caller's contract).
        unsafe { first.tier.resource.deallocate(ptr, bytes, stream) }?;
        first.counters.freed(bytes);
        Ok(())
    }

    fn kind(&self) -> MemoryKind {
        self.slots[0].tier.resource.kind()
    }

    fn device(&self) -> Option<usize> {
        self.slots[0].tier.resource.device()
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.slots[0].tier.resource.memory_info()
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn report(&self) -> Option<&dyn PoolReport> {
        Some(self)
    }

    fn upstreams(&self) -> Vec<SharedResource> {
        self.tiers().map(|t| t.resource.clone()).collect()
    }

    /// Every tier's (the first tier's memory), with this resource's tiers.
    fn link(&self) -> crate::resource::Link {
        let links: Vec<crate::resource::Link> = self.tiers().map(|t| t.resource.link()).collect();
        let mut link = crate::resource::Link::join(&links).unwrap_or_else(|| {
            crate::resource::Link::source(
                self.kind(),
                self.device(),
                self.identity(),
                CallProfile::QUICK,
            )
        });
        link.tiers = Some(self.slots.clone());
        link
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn into_any(self: Arc<Self>) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        Some(self)
    }
}

impl PoolReport for TieredMemoryResource {
    /// Held: what each tier holds (its own report's held bytes where it reports them, else the
    /// bytes of its live allocations); free and the largest free block: those the tiers that
    /// hold memory keep (not a source's free memory, which is the device's).
    fn footprint(&self) -> Footprint {
        let mut out = Footprint::default();
        for (i, slot) in self.slots.iter().enumerate() {
            if self.same_as_earlier(i) {
                continue;
            }
            match slot.tier.resource.report() {
                Some(r) if !r.is_source() => {
                    let f = r.footprint();
                    out.held_bytes += f.held_bytes;
                    out.free_bytes += f.free_bytes;
                    out.largest_free_block = out.largest_free_block.max(f.largest_free_block);
                    out.free_blocks += f.free_blocks;
                }
                _ => out.held_bytes += slot.counters.current_bytes.load(Ordering::Relaxed),
            }
        }
        out
    }

    /// The footprint's held bytes without its walk: each tier that holds memory answers its
    /// own [`PoolReport::held_bytes`] (a pool's is a counter; its full footprint walks every
    /// stream's free list, which made a replay of the tiered resource walk them after every
    /// allocation: 40 times the pool's time, issue 50), any other tier its live bytes.
    ///
    /// # Time Complexity
    /// O(tiers), each tier's `held_bytes`.
    fn held_bytes(&self) -> usize {
        (0..self.slots.len())
            .filter(|&i| !self.same_as_earlier(i))
            .map(|i| {
                let slot = &self.slots[i];
                match slot.tier.resource.report() {
                    Some(r) if !r.is_source() => r.held_bytes(),
                    _ => slot.counters.current_bytes.load(Ordering::Relaxed),
                }
            })
            .sum()
    }

    // No PyTorch-style counters: they would describe one pool, and a tiered resource's memory
    // is several (its counts are per tier: `tier_counts`).

    /// Resets the tiers' peaks ([`TieredMemoryResource::reset_peaks`]).
    fn reset_peak_memory_stats(&self) -> bool {
        self.reset_peaks();
        true
    }

    /// Each tier's segments, tagged with the tier: a tier that lays out its own (a pool) gives
    /// its segments, any other tier one segment per live allocation (one allocated block).
    fn memory_snapshot(&self) -> Option<Vec<SegmentInfo>> {
        let live = self.live_allocations();
        let mut out = Vec::new();
        for (i, tier) in self.tiers().enumerate() {
            if self.same_as_earlier(i) {
                // Its memory is an earlier tier's, laid out there (its pointers are too).
                continue;
            }
            let id = tier.resource.identity();
            let laid_out = tier
                .resource
                .report()
                .filter(|r| !r.is_source())
                .and_then(|r| r.memory_snapshot());
            match laid_out {
                Some(segments) => out.extend(segments.into_iter().map(|mut s| {
                    s.tier = Some(tier.name.clone());
                    s
                })),
                None => out.extend(
                    live.iter()
                        .filter(|a| self.slots[a.2].tier.resource.identity() == id)
                        .map(|&(ptr, bytes, _)| SegmentInfo {
                            address: ptr,
                            total_size: bytes,
                            expandable: false,
                            tier: Some(tier.name.clone()),
                            offloaded: false,
                            blocks: vec![BlockInfo {
                                address: ptr,
                                size: bytes,
                                requested_size: bytes,
                                state: BlockState::Allocated,
                            }],
                        }),
                ),
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests;
