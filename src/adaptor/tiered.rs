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
use crate::report::{BlockInfo, BlockState, Footprint, PoolReport, SegmentInfo};
use crate::resource::{CallProfile, MemoryKind, MemoryResource, SharedResource};
use crate::sync::Mutex;
use serde::Serialize;
use std::collections::HashMap;

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

/// The counters of one tier (requested bytes, as the statistics adaptor counts them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TierCounts {
    /// The tier's name.
    pub name: String,
    /// The resource's name (`"pool"`, `"peer"`, `"pinned_host"`, `"simulated"`).
    pub resource: String,
    /// Bytes of the tier's live allocations.
    pub current_bytes: usize,
    /// The most bytes live on the tier at once.
    pub peak_bytes: usize,
    /// Bytes of every allocation the tier ever served.
    pub total_bytes: u128,
    /// Live allocations on the tier.
    pub current_allocations: usize,
    /// The most allocations live on the tier at once.
    pub peak_allocations: usize,
    /// Allocations the tier ever served.
    pub total_allocations: u64,
    /// Allocations the tier refused for want of memory, which went on to the next tier (or
    /// failed, on the last).
    pub refused: u64,
}

/// The counters and the pointer record, under one lock so that they always agree.
struct State {
    /// Live pointer -> (tier, requested bytes).
    owners: HashMap<usize, (usize, usize)>,
    counts: Vec<TierCounts>,
    /// Allocations that every tier refused.
    failures: u64,
}

/// Allocates from the first of its tiers with room (device, then a peer GPU, then host memory,
/// in the order given); a tier out of memory passes the request on, any other error of a tier
/// is returned as it is. Frees go to the tier that made the allocation; every live pointer is
/// recorded, so a free of a pointer the resource did not make, a double free or a wrong size is
/// [`Error::Logic`] (checked frees). Counters per tier: [`tier_counts`](Self::tier_counts).
///
/// Its kind, device and memory figures are the first tier's (the one it is "on"); the others
/// are where memory goes when the first is full. Use tiers whose memory the same kernels can
/// read: device memory, a [`PeerMemoryResource`](crate::resource::PeerMemoryResource) (the
/// device reads its peer's memory over NVLink or PCIe), pinned host or managed memory.
pub struct TieredMemoryResource {
    tiers: Vec<Tier>,
    state: Mutex<State>,
}

impl std::fmt::Debug for TieredMemoryResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TieredMemoryResource")
            .field("tiers", &self.tiers)
            .finish_non_exhaustive()
    }
}

impl TieredMemoryResource {
    /// A resource over `tiers`, tried in order.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no tier, more than [`MAX_TIERS`], or two tiers with the
    /// same name (counts are read by name).
    pub fn new(tiers: Vec<Tier>) -> Result<Self> {
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
        let counts = tiers
            .iter()
            .map(|t| TierCounts {
                name: t.name.clone(),
                resource: t.resource.name().to_string(),
                ..TierCounts::default()
            })
            .collect();
        Ok(TieredMemoryResource {
            tiers,
            state: Mutex::new(State {
                owners: HashMap::new(),
                counts,
                failures: 0,
            }),
        })
    }

    /// The tiers, in the order they are tried.
    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    /// The tiers' names, in order.
    pub fn tier_names(&self) -> Vec<String> {
        self.tiers.iter().map(|t| t.name.clone()).collect()
    }

    /// The counters of every tier, in order.
    pub fn tier_counts(&self) -> Vec<TierCounts> {
        self.state.lock().counts.clone()
    }

    /// Allocations that no tier could serve, ever.
    pub fn failures(&self) -> u64 {
        self.state.lock().failures
    }

    /// The index of the tier that holds the live allocation starting at `ptr`, if any.
    pub fn tier_of(&self, ptr: usize) -> Option<usize> {
        self.state.lock().owners.get(&ptr).map(|&(tier, _)| tier)
    }

    /// Every live allocation as (pointer, requested bytes, tier), sorted by pointer.
    pub fn live_allocations(&self) -> Vec<(usize, usize, usize)> {
        let s = self.state.lock();
        let mut out: Vec<_> = s
            .owners
            .iter()
            .map(|(&ptr, &(tier, bytes))| (ptr, bytes, tier))
            .collect();
        out.sort_unstable();
        out
    }

    /// Sets every tier's peaks to its current values.
    pub fn reset_peaks(&self) {
        let mut s = self.state.lock();
        for c in &mut s.counts {
            c.peak_bytes = c.current_bytes;
            c.peak_allocations = c.current_allocations;
        }
    }

    /// Whether tier `i`'s resource is an earlier tier's (the same memory named twice).
    fn same_as_earlier(&self, i: usize) -> bool {
        let id = self.tiers[i].resource.identity();
        self.tiers[..i].iter().any(|t| t.resource.identity() == id)
    }

    fn record(&self, ptr: usize, bytes: usize, tier: usize, refused: &[usize]) -> Result<()> {
        let mut s = self.state.lock();
        for &r in refused {
            s.counts[r].refused += 1;
        }
        if ptr == 0 {
            return Ok(());
        }
        if s.owners.contains_key(&ptr) {
            return Err(Error::Logic(format!(
                "tiered: tier {} returned {ptr:#x}, which is already live",
                self.tiers[tier].name
            )));
        }
        s.owners.insert(ptr, (tier, bytes));
        let c = &mut s.counts[tier];
        c.current_bytes += bytes;
        c.peak_bytes = c.peak_bytes.max(c.current_bytes);
        c.total_bytes += bytes as u128;
        c.current_allocations += 1;
        c.peak_allocations = c.peak_allocations.max(c.current_allocations);
        c.total_allocations += 1;
        Ok(())
    }
}

impl MemoryResource for TieredMemoryResource {
    /// # Errors
    /// Out of memory when every tier is out of memory (naming each); a tier's other errors (a
    /// logic or CUDA error is not a reason to try the next tier).
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let mut refused = Vec::new();
        let mut reasons = Vec::new();
        for (i, tier) in self.tiers.iter().enumerate() {
            match tier.resource.allocate(bytes, stream) {
                Ok(ptr) => {
                    if let Err(e) = self.record(ptr, bytes, i, &refused) {
                        // SAFETY: `ptr` came from this tier just now with `bytes`, unused.
                        let _ = unsafe { tier.resource.deallocate(ptr, bytes, stream) };
                        return Err(e);
                    }
                    return Ok(ptr);
                }
                Err(e) if e.is_out_of_memory() => {
                    refused.push(i);
                    reasons.push(format!("{}: {e}", tier.name));
                }
                Err(e) => {
                    let _ = self.record(0, bytes, i, &refused);
                    return Err(e);
                }
            }
        }
        {
            let mut s = self.state.lock();
            for &r in &refused {
                s.counts[r].refused += 1;
            }
            s.failures += 1;
        }
        Err(Error::out_of_memory(
            bytes,
            format!(
                "tiered: every tier is out of memory ({})",
                reasons.join("; ")
            ),
        ))
    }

    /// Frees through the tier that made the allocation.
    ///
    /// # Safety
    /// Only preconditions 3 and 4 of [`MemoryResource::deallocate`]: a pointer this resource
    /// did not hand out, a double free or a wrong size is [`Error::Logic`] and changes nothing.
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let tier = {
            let mut s = self.state.lock();
            let Some(&(tier, size)) = s.owners.get(&ptr) else {
                return Err(Error::Logic(format!(
                    "tiered: deallocate of {ptr:#x}, which is not allocated (never, already \
                     freed, or inside another allocation)"
                )));
            };
            if size != bytes {
                return Err(Error::Logic(format!(
                    "tiered: deallocate of {ptr:#x} with {bytes} bytes, but it was allocated \
                     with {size} bytes"
                )));
            }
            s.owners.remove(&ptr);
            let c = &mut s.counts[tier];
            c.current_bytes -= bytes;
            c.current_allocations -= 1;
            tier
        };
        // SAFETY: the record shows `ptr` came from this tier with `bytes` and was not freed
        // since (1, 2); the caller's contract gives 3 and 4.
        let result = unsafe { self.tiers[tier].resource.deallocate(ptr, bytes, stream) };
        if result.is_err() {
            // The tier kept it: so does the record.
            let mut s = self.state.lock();
            s.owners.insert(ptr, (tier, bytes));
            let c = &mut s.counts[tier];
            c.current_bytes += bytes;
            c.current_allocations += 1;
        }
        result
    }

    fn kind(&self) -> MemoryKind {
        self.tiers[0].resource.kind()
    }

    fn device(&self) -> Option<usize> {
        self.tiers[0].resource.device()
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.tiers[0].resource.memory_info()
    }

    fn call_profile(&self) -> CallProfile {
        self.tiers
            .iter()
            .fold(CallProfile::QUICK, |p, t| p.and(t.resource.call_profile()))
    }

    fn name(&self) -> &'static str {
        "tiered"
    }

    fn report(&self) -> Option<&dyn PoolReport> {
        Some(self)
    }

    fn upstreams(&self) -> Vec<SharedResource> {
        self.tiers.iter().map(|t| t.resource.clone()).collect()
    }

    /// Every tier's (the first tier's memory).
    fn link(&self) -> crate::resource::Link {
        let links: Vec<crate::resource::Link> =
            self.tiers.iter().map(|t| t.resource.link()).collect();
        crate::resource::Link::join(&links)
            .unwrap_or_else(|| crate::resource::Link::source(self.kind(), self.device()))
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

impl PoolReport for TieredMemoryResource {
    /// Held: what each tier holds (its own report's held bytes where it reports them, else the
    /// bytes of its live allocations); free and the largest free block: those the tiers that
    /// hold memory keep (not a source's free memory, which is the device's).
    fn footprint(&self) -> Footprint {
        let counts = self.tier_counts();
        let mut out = Footprint::default();
        for (i, (tier, c)) in self.tiers.iter().zip(&counts).enumerate() {
            if self.same_as_earlier(i) {
                continue;
            }
            match tier.resource.report() {
                Some(r) if !r.is_source() => {
                    let f = r.footprint();
                    out.held_bytes += f.held_bytes;
                    out.free_bytes += f.free_bytes;
                    out.largest_free_block = out.largest_free_block.max(f.largest_free_block);
                    out.free_blocks += f.free_blocks;
                }
                _ => out.held_bytes += c.current_bytes,
            }
        }
        out
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
        for (i, tier) in self.tiers.iter().enumerate() {
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
                        .filter(|a| self.tiers[a.2].resource.identity() == id)
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
