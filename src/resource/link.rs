//! The one typed link from a resource to the memory below it.
//!
//! Every concern that crosses the resource graph (what memory it is and on which device, the
//! pools below that can sleep, what calls through it may do, the tiers, the process's share of
//! the GPU) travels here.
//! A resource computes its [`Link`] once, when it is built over its upstream, from the
//! upstream's link (one call, not a walk), and holds it: the allocation path reads a field, never
//! the graph. A source resource makes a new link; an adaptor keeps its upstream's; a
//! suballocator keeps its upstream's and registers itself as a
//! [`Tenant`](super::sleep::Tenant) of the pools below, now and as the graph below grows
//! ([`Link::admit`]). The fields that can change after construction are live cells, shared by
//! every resource above: the calls ([`Calls`]) and the pools whose memory moves
//! ([`SleepWatch`]); a resource whose graph grows (a tag, a bin) adds the new part to its own
//! cells, and every resource above sees it.
//!
//! A new concern is one field here, filled where memory is made and carried up unchanged by
//! every resource that does not change it.

use super::calls::{Calls, Step};
use super::sleep::{ByteRange, MovingPool, SleepWatch, Tenant};
use super::{BlockPlacer, CallProfile, MemoryKind, TierBook};
use crate::error::{Error, Result};
use crate::pressure::{Place, Relieve};
use std::sync::Arc;
use std::sync::Weak;

/// The place of memory of `kind` on `device` from the source whose identity is `source`: the
/// device where it is one (device and managed memory), else the source itself.
pub(crate) fn place_of(kind: MemoryKind, device: Option<usize>, source: usize) -> Place {
    match (kind, device) {
        (MemoryKind::Device | MemoryKind::Managed, Some(ordinal)) => Place::Device(ordinal),
        _ => Place::Simulated(source),
    }
}

/// What a resource knows of the memory below it (see the module docs).
#[derive(Clone, Debug)]
pub struct Link {
    /// The kind of memory at the bottom.
    pub kind: MemoryKind,
    /// The device it is on, where it has one.
    pub device: Option<usize>,
    /// Whose memory it is for the process's figures and reliefs ([`crate::pressure`]): the
    /// device, or the source itself. A pool that keeps freed memory registers its cache here
    /// ([`Link::register_cache`]), so a relief of the place (an allocation that ran out, a
    /// process beside this one asking on a shared GPU) reaches it.
    pub place: Place,
    /// The pools below whose memory moves (sleep, spill): a live cell that grows with the graph
    /// below ([`SleepWatch`]).
    pub sleep: SleepWatch,
    /// What a call through this resource may do (reach foreign code, block): the Python layer's
    /// GIL decision ([`CallProfile::release_gil`]). The one field a resource between may change
    /// (a suballocator's calls do not block; an adaptor's own work adds to it), and one that can
    /// grow after construction (a binning resource gains a bin): see [`Calls`].
    pub calls: Calls,
    /// The placer of the managed memory below, where that memory is placed by the blocks a
    /// suballocator over it hands out ([`PlacementMode::Blocks`](super::PlacementMode::Blocks)):
    /// the stream-ordered core places each block it hands out through it.
    pub placement: Option<Arc<BlockPlacer>>,
    /// The tiers of the memory below, where a tiered resource is below (its counters per
    /// tier, [`TierBook`]); a resource over several keeps the first that has one.
    pub tiers: Option<Arc<dyn TierBook>>,
    /// The first resource between here and the memory that does not say what it hands out
    /// (its `link()` is the trait's default): a block it carved cannot be found by address, so
    /// a tag of an address alone through it is refused.
    pub opaque: Option<&'static str>,
    /// The ledger of the memory below where several processes share it by a name (a shared
    /// simulated device: `shared-<name>`): processes that join over it join that ledger
    /// ([`crate::shared_gpu::join`]). `None` for a GPU (its ledger is its UUID's) and for
    /// memory of this process alone.
    pub device_key: Option<Arc<str>>,
}

impl Link {
    /// The link of a source of memory: `kind` on `device`, nothing below; `identity` is the
    /// source's ([`MemoryResource::identity`](super::MemoryResource::identity)), its place where
    /// the memory is not a device's; `calls`, what its own calls may do.
    pub fn source(
        kind: MemoryKind,
        device: Option<usize>,
        identity: usize,
        calls: CallProfile,
    ) -> Link {
        Link {
            kind,
            device,
            place: place_of(kind, device, identity),
            sleep: SleepWatch::default(),
            calls: Calls::fixed(calls),
            placement: None,
            tiers: None,
            opaque: None,
            device_key: None,
        }
    }

    /// The link of `source`, a source resource whose calls block (they wait on the driver, the
    /// device or the OS): [`CallProfile::BLOCKING`].
    pub fn blocking_source<R: super::MemoryResource + ?Sized>(source: &R) -> Link {
        Link::source(
            source.kind(),
            source.device(),
            source.identity(),
            CallProfile::BLOCKING,
        )
    }

    /// The link of a resource over several upstreams (fallback, tiers, binning's bins): the
    /// first one's memory, every one's sleepers, every one's calls.
    pub fn join(links: &[Link]) -> Option<Link> {
        let first = links.first()?;
        Some(Link {
            kind: first.kind,
            device: first.device,
            place: first.place,
            sleep: SleepWatch::join(links.iter().map(|l| &l.sleep)),
            calls: Calls::over(
                &links.iter().map(|l| &l.calls).collect::<Vec<_>>(),
                Step::And(CallProfile::QUICK),
            ),
            placement: first.placement.clone(),
            tiers: links.iter().find_map(|l| l.tiers.clone()),
            opaque: links.iter().find_map(|l| l.opaque),
            device_key: first.device_key.clone(),
        })
    }

    /// This link with its calls made by a suballocator over it ([`CallProfile::suballocating`]):
    /// the link a suballocator computes at construction and holds.
    #[must_use]
    pub fn suballocated(mut self) -> Link {
        self.calls = self.calls.suballocating();
        self
    }

    /// This link with an adaptor's own work added to its calls ([`Calls::and`]).
    #[must_use]
    pub fn with_own_calls(mut self, own: CallProfile) -> Link {
        self.calls = self.calls.and(own);
        self
    }

    /// Whether a pool below sleeps (one process-wide load while nothing moves).
    #[inline]
    pub fn asleep(&self) -> bool {
        self.sleep.asleep()
    }

    /// Registers `cache`, a pool over this link that keeps freed memory, for reliefs of the
    /// place (held weakly, until it drops).
    pub fn register_cache(&self, cache: std::sync::Weak<dyn Relieve>) {
        crate::pressure::register(self.place, cache);
    }

    /// Records `tenant`, a suballocator built over this link, with every pool below that can
    /// sleep, now and as the link's watch gains pools.
    pub fn admit(&self, tenant: &Weak<dyn Tenant>) {
        self.sleep.admit(tenant);
    }

    /// The exact block (start, bytes) a buffer at `ptr` is, for a tag, and the pool below that
    /// holds it: the smallest live block holding it in a pool below (or one that pool's tenants
    /// handed out). Through an opaque resource the block is `(ptr, size)` when the caller knows
    /// the buffer's size.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `ptr` when no pool below holds it, or when an opaque
    /// resource lies between and no size is known; [`Error::Logic`] when no pool below can
    /// sleep.
    pub fn block_for_tag(
        &self,
        ptr: usize,
        size: Option<usize>,
    ) -> Result<(ByteRange, Arc<dyn MovingPool>)> {
        if self.sleep.is_empty() {
            return Err(Error::Logic(
                "sleep needs a pool on virtual memory, and this stack has none; build it with \
                 rrmm.reinitialize(pool_allocator=\"expandable\") or over \
                 rrmm.mr.ExpandableMemoryResource"
                    .into(),
            ));
        }
        let Some(((start, bytes), pool)) = self.sleep.block_at(ptr) else {
            return Err(Error::invalid(
                "ptr",
                format!("{ptr:#x} is not inside a live allocation of the expandable pool below"),
            ));
        };
        match (self.opaque, size) {
            (None, _) => Ok(((start, bytes), pool)),
            (Some(_), Some(size)) if ptr >= start && ptr + size <= start + bytes => {
                Ok(((ptr, size), pool))
            }
            (Some(_), Some(size)) => Err(Error::invalid(
                "ptr",
                format!(
                    "{ptr:#x} ({size} bytes) is not inside one live allocation of the \
                     expandable pool below"
                ),
            )),
            (Some(name), None) => Err(Error::invalid(
                "ptr",
                format!(
                    "{name} does not say which of its blocks holds {ptr:#x}: tag a buffer \
                     that knows its size (a DeviceBuffer, an array, a tensor)"
                ),
            )),
        }
    }
}
