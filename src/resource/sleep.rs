//! Memory that moves: the pools that can sleep (give their pages back and keep their data on
//! the host), as every resource above them sees them through its [`Link`](super::Link).
//!
//! A pool that can sleep is a [`Sleeper`]. A resource built over it (directly or through
//! adaptors and other suballocators) holds it in its link's [`SleepWatch`], read once at
//! construction from its upstream's link: no walk over the graph, no downcast. Through the watch
//! a suballocator refuses to hand out blocks while a pool below sleeps (its cached ranges lie on
//! pages the sleep unmapped), its snapshot marks its segments offloaded, and a free forgets a
//! tag. A suballocator that carves blocks out of the pool's memory is also a [`Tenant`] of every
//! sleeper below it: at offload the sleeper asks each tenant which of the ranges it holds are
//! free, and copies only the rest (a chunk is offloaded as its live blocks), and a tag finds the
//! exact block a buffer is (the smallest live block that holds its address, at any level).
//!
//! Tags and discards cover exactly the bytes of the tagged block. Tags given to one sleep
//! ([`SleepPlan::discard`]) apply to that sleep only; [`Sleeper::tag`] tags until the block is
//! freed. A refused offload changes nothing.
//!
//! Copies that rrmm makes on behalf of its users (a `DeviceBuffer`'s, the Python hooks') check
//! [`check_awake`] first: an address inside a sleeping pool's reservation is an error naming the
//! sleep, never a touch of unmapped memory.

use super::host_spill::{PromoteReport, SpillFigures};
use crate::error::{Error, Result};
use crate::report::snapshot::{BlockState, SegmentInfo};
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// `FromStr` of an enum named by a few words: `from_names!(Type, argument, what, "word" =>
/// Variant, ...)`; any other word is an invalid `argument` ([`parse_choice`]).
macro_rules! from_names {
    ($ty:ident, $argument:literal, $what:literal, $($name:literal => $variant:ident),+ $(,)?) => {
        impl std::str::FromStr for $ty {
            type Err = Error;

            fn from_str(s: &str) -> Result<Self> {
                parse_choice(s, $argument, $what, &[$(($name, $ty::$variant)),+])
            }
        }
    };
}

/// What a live allocation's bytes become across a sleep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SleepTag {
    /// Copied to the host at offload and back at restore (the default).
    #[default]
    Keep,
    /// Not copied: after restore the bytes are zero or undefined ([`DiscardFill`]).
    Discard,
}

from_names!(SleepTag, "tag", "sleep tag", "keep" => Keep, "discard" => Discard);

/// What discarded allocations hold after a restore.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DiscardFill {
    /// Whatever the new pages hold (no work at restore).
    #[default]
    Undefined,
    /// Zeros (one memset per discarded block at restore).
    Zero,
}

from_names!(DiscardFill, "discard_fill", "discard fill", "undefined" => Undefined, "zero" => Zero);

/// The value named `s` among `choices` (name, value), else an invalid `argument` whose message
/// names `s`, what it should be and every name.
fn parse_choice<T: Copy>(
    s: &str,
    argument: &'static str,
    what: &str,
    choices: &[(&str, T)],
) -> Result<T> {
    if let Some(&(_, value)) = choices.iter().find(|(name, _)| *name == s) {
        return Ok(value);
    }
    let names: Vec<String> = choices
        .iter()
        .map(|(name, _)| format!("{name:?}"))
        .collect();
    Err(Error::invalid(
        argument,
        format!("{s:?} is not a {what}: use {}", names.join(" or ")),
    ))
}

/// What a sleep frees: before one, what it would do now (an estimate); after one, what it did
/// ([`SleepReport`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SleepEstimate {
    /// Physical bytes given back to the driver: every mapped page.
    pub released_bytes: usize,
    /// Bytes of live allocations kept: copied to host memory and back.
    pub copied_bytes: usize,
    /// Bytes of live allocations tagged discard: released without a copy.
    pub discarded_bytes: usize,
    /// Bytes of pages wholly inside free blocks: released without a copy.
    pub free_page_bytes: usize,
    /// Bytes that suballocators above the pool hold free in their chunks: released without a
    /// copy (a chunk is offloaded as its live blocks).
    pub cached_free_bytes: usize,
    /// Live allocations of the pool (a suballocator's chunk counts as one).
    pub live_blocks: usize,
}

summed_fields!(SleepEstimate {
    released_bytes,
    copied_bytes,
    discarded_bytes,
    free_page_bytes,
    cached_free_bytes,
    live_blocks,
});

/// The latest sleep of a pool: its figures and where the time went (seconds).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct SleepReport {
    /// What the offload freed and copied.
    pub estimate: SleepEstimate,
    /// Sleeps of this pool so far (this one included).
    pub sleeps: u64,
    /// Bytes of host memory held for the copy, and whether it is pinned.
    pub host_bytes: usize,
    /// Whether the host copy is pinned memory.
    pub host_pinned: bool,
    /// Whether the host copy was kept from an earlier sleep (no host pages made).
    pub host_reused: bool,
    /// The ranges of the host page supply the copy spans (several where the pool grew: each
    /// growth made ready ahead adds one; 0 for simulated memory).
    pub host_ranges: usize,
    /// The whole offload.
    pub offload_s: f64,
    /// Synchronizing and trimming the free pages.
    pub sync_trim_s: f64,
    /// Making the host copy (pinning pages).
    pub host_alloc_s: f64,
    /// Copying to the host, beyond what ran while unmapping (the copies of a chunk run while
    /// the chunk before it is unmapped).
    pub copy_out_s: f64,
    /// Unmapping.
    pub unmap_s: f64,
    /// The whole restore, once it succeeded.
    pub restore_s: Option<f64>,
    /// Mapping again (the successful restore; the copies into mapped chunks run meanwhile).
    pub map_s: Option<f64>,
    /// The rest of the restore: copying back beyond what ran while mapping, zeroing discarded
    /// blocks, waiting.
    pub copy_in_s: Option<f64>,
    /// Restores refused (the memory could not be mapped) before the one that succeeded.
    pub failed_restores: u64,
}

/// What one sleep does beyond the persistent tags: the blocks (start, bytes) it discards, and
/// what discarded blocks hold after the wake.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SleepPlan {
    /// Exact ranges not copied by this sleep only (each a live block, resolved by
    /// [`SleepWatch::block_at`]).
    pub discard: Vec<(usize, usize)>,
    /// What discarded ranges hold after the wake.
    pub fill: DiscardFill,
    /// Discard every live block (copy nothing): the pool's data is not worth keeping (a KV
    /// cache between an engine's phases, a region paused without a backup).
    pub discard_all: bool,
    /// The pool wakes by itself when next used (an allocation from it or above it, or one of
    /// rrmm's copies of its bytes) instead of refusing: a sleep of an idle process on a shared
    /// GPU ([`crate::shared_gpu`]), which the process did not ask for.
    pub wake_on_use: bool,
}

impl SleepPlan {
    /// A plan that discards nothing beyond the persistent tags.
    pub fn with_fill(fill: DiscardFill) -> SleepPlan {
        SleepPlan {
            discard: Vec::new(),
            fill,
            discard_all: false,
            wake_on_use: false,
        }
    }
}

/// A suballocator that carves blocks out of memory a sleeper below it handed out (its chunks):
/// what the sleeper asks it at offload and when a block is tagged.
pub trait Tenant: Send + Sync {
    /// Its segments (the chunks it holds from below) with their blocks, live and free, as its
    /// snapshot reports them: a sleep copies none of the free ones.
    fn segments(&self) -> Vec<SegmentInfo>;
}

/// What a sleeper learns of an address from one tenant's segments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TenantLookup {
    /// Outside the tenant's chunks.
    NotHeld,
    /// Inside a chunk, in no live block (free: a tag of it would be a use after free).
    Free,
    /// Inside this live block (start, bytes).
    Live(usize, usize),
}

/// The free ranges (start, bytes) of `segments`.
pub fn free_ranges(segments: &[SegmentInfo]) -> Vec<(usize, usize)> {
    segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state == BlockState::Free && b.size > 0)
        .map(|b| (b.address, b.size))
        .collect()
}

/// Where `addr` lies in `segments`.
pub fn lookup(segments: &[SegmentInfo], addr: usize) -> TenantLookup {
    let Some(seg) = segments
        .iter()
        .find(|s| addr >= s.address && addr - s.address < s.total_size)
    else {
        return TenantLookup::NotHeld;
    };
    match seg
        .blocks
        .iter()
        .find(|b| addr >= b.address && addr - b.address < b.size.max(1))
    {
        Some(b) if b.state == BlockState::Allocated => TenantLookup::Live(b.address, b.size),
        _ => TenantLookup::Free,
    }
}

/// Sorted, disjoint ranges (start, bytes) covering `ranges` (touching ones joined).
pub fn merged(mut ranges: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    ranges.retain(|&(_, n)| n > 0);
    ranges.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (a, n) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.0 + last.1 => {
                let end = (last.0 + last.1).max(a + n);
                last.1 = end - last.0;
            }
            _ => out.push((a, n)),
        }
    }
    out
}

/// The parts of `a` outside `b`; both sorted and disjoint ([`merged`]), and so is the result.
pub fn subtract(a: &[(usize, usize)], b: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut j = 0;
    for &(start, len) in a {
        let end = start + len;
        let mut at = start;
        while j < b.len() && b[j].0 + b[j].1 <= at {
            j += 1;
        }
        let mut k = j;
        while k < b.len() && b[k].0 < end {
            let (hs, he) = (b[k].0, b[k].0 + b[k].1);
            if hs > at {
                out.push((at, hs - at));
            }
            at = at.max(he);
            k += 1;
        }
        if at < end {
            out.push((at, end - at));
        }
    }
    out
}

/// The parts of `a` inside `b`; both sorted and disjoint ([`merged`]).
pub fn intersect(a: &[(usize, usize)], b: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let outside = subtract(a, b);
    subtract(a, &outside)
}

/// Total bytes of `ranges`.
pub fn total(ranges: &[(usize, usize)]) -> usize {
    ranges.iter().map(|&(_, n)| n).sum()
}

/// A pool that can sleep, as the resources above it see it.
pub trait Sleeper: Send + Sync + std::fmt::Debug {
    /// The pool's identity (clones that share it return the same number).
    fn identity(&self) -> usize;

    /// Whether the pool is asleep, falling asleep or waking (one load).
    fn asleep(&self) -> bool;

    /// Records `tenant`, a suballocator over this pool (kept while it lives).
    fn admit(&self, tenant: Weak<dyn Tenant>);

    /// The smallest live block (start, bytes) holding `addr`: the pool's own, or one its
    /// tenants handed out.
    fn block_at(&self, addr: usize) -> Option<(usize, usize)>;

    /// Tags the block (start, bytes) until it is freed (at whichever level it was handed out).
    fn tag(&self, block: (usize, usize), tag: SleepTag);

    /// A block starting at `addr` was freed by a tenant: its tag goes (one load when nothing
    /// is tagged).
    fn forget(&self, addr: usize);

    /// Puts the pool to sleep with `plan`.
    ///
    /// # Errors
    /// As the pool's own offload; a refused offload changes nothing.
    fn offload(&self, plan: &SleepPlan) -> Result<SleepEstimate>;

    /// Wakes the pool.
    ///
    /// # Errors
    /// As the pool's own restore.
    fn restore(&self) -> Result<()>;

    /// Wakes the pool if it sleeps with [`SleepPlan::wake_on_use`] (about to be used); whether
    /// it is awake afterwards (false: it sleeps by its user's choice, or could not wake).
    fn wake_for_use(&self) -> bool;

    /// What an offload with `plan` would release, copy and discard now.
    fn estimate(&self, plan: &SleepPlan) -> SleepEstimate;

    /// Makes the host pages of the pool's next sleep ready ahead of need, in the background
    /// (pages for all it holds now); returns the bytes asked for (0 where its pages have no
    /// bytes to keep).
    ///
    /// # Errors
    /// Where the pool's memory cannot be copied to the host.
    fn prepare(&self) -> Result<usize>;

    /// Keeps the next sleep's host pages ready as the pool grows (`on`), in the background;
    /// returns the bytes asked for now.
    ///
    /// # Errors
    /// Where the pool's memory cannot be copied to the host.
    fn keep_ready(&self, on: bool) -> Result<usize>;

    /// Moves the pool's pages spilled to the host (those in `range` where given) back to
    /// device memory at the same addresses, at most `limit` bytes, as far as the device has
    /// room (nothing where the pool never spills).
    ///
    /// # Errors
    /// As the pool's own promote.
    fn promote(&self, range: Option<ByteRange>, limit: Option<usize>) -> Result<PromoteReport>;

    /// The figures of the host pages the pool spills to (`None`: it never spills).
    fn spill_figures(&self) -> Option<SpillFigures>;
}

/// A range of addresses: (start, bytes).
pub type ByteRange = (usize, usize);

/// The pools that can sleep below a resource (none for most stacks: then every check is one
/// length test).
#[derive(Clone, Debug)]
pub struct SleepWatch(Arc<[Arc<dyn Sleeper>]>);

impl Default for SleepWatch {
    fn default() -> Self {
        SleepWatch(Arc::from(Vec::new()))
    }
}

impl SleepWatch {
    /// A watch over one pool.
    pub fn of(sleeper: Arc<dyn Sleeper>) -> SleepWatch {
        SleepWatch(Arc::from(vec![sleeper]))
    }

    /// The pools of every watch, each once (by identity), in order.
    pub fn join<'a>(watches: impl IntoIterator<Item = &'a SleepWatch>) -> SleepWatch {
        let mut out: Vec<Arc<dyn Sleeper>> = Vec::new();
        for w in watches {
            for s in w.0.iter() {
                if !out.iter().any(|o| o.identity() == s.identity()) {
                    out.push(s.clone());
                }
            }
        }
        SleepWatch(Arc::from(out))
    }

    /// The pools, top first.
    pub fn sleepers(&self) -> &[Arc<dyn Sleeper>] {
        &self.0
    }

    /// Whether no pool below can sleep.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a pool below sleeps (or falls asleep, or wakes).
    #[inline]
    pub fn asleep(&self) -> bool {
        self.0.iter().any(|s| s.asleep())
    }

    /// [`Error::Logic`] naming `name` while a pool below sleeps.
    ///
    /// # Errors
    /// As said.
    /// A pool asleep with [`SleepPlan::wake_on_use`] wakes here instead.
    #[inline]
    pub fn check(&self, name: &str, bytes: usize) -> Result<()> {
        if self.asleep() && !self.wake_for_use() {
            return Err(asleep_below_error(name, bytes));
        }
        Ok(())
    }

    /// Wakes every pool below that sleeps until used; whether none sleeps afterwards.
    #[inline(never)]
    pub fn wake_for_use(&self) -> bool {
        self.0.iter().all(|s| !s.asleep() || s.wake_for_use())
    }

    /// Records `tenant` with every pool below.
    pub fn admit(&self, tenant: &Weak<dyn Tenant>) {
        for s in self.0.iter() {
            s.admit(tenant.clone());
        }
    }

    /// A block starting at `addr` was freed above: its tags go.
    #[inline]
    pub fn forget(&self, addr: usize) {
        for s in self.0.iter() {
            s.forget(addr);
        }
    }

    /// The smallest live block holding `addr` in any pool below, and that pool.
    pub fn block_at(&self, addr: usize) -> Option<(ByteRange, &Arc<dyn Sleeper>)> {
        self.0
            .iter()
            .filter_map(|s| s.block_at(addr).map(|b| (b, s)))
            .min_by_key(|((_, size), _)| *size)
    }
}

/// The error of a suballocator's allocation while a pool below it sleeps.
pub fn asleep_below_error(name: &str, bytes: usize) -> Error {
    Error::Logic(format!(
        "{name}: the expandable pool under it is asleep (offloaded to host memory); restore() \
         it first (allocation of {bytes} bytes refused)"
    ))
}

/// A sleeping pool's range: its end, its name, and the pool where it wakes when used
/// ([`SleepPlan::wake_on_use`]).
type AsleepRange = (usize, &'static str, Option<Arc<dyn Sleeper>>);

/// The address ranges of sleeping pools: start -> range.
// Why process-wide: an address may be copied from anywhere (a raw pointer, a buffer of another
// resource); a copy of a sleeping pool's memory must be refused whoever asks.
static ASLEEP: RwLock<BTreeMap<usize, AsleepRange>> = RwLock::new(BTreeMap::new());
/// `ASLEEP.len()`, read without the lock (the copy path's one load while nothing sleeps).
// Why process-wide: the count of `ASLEEP`, beside it.
static ASLEEP_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Marks `[start, start + bytes)` asleep (a pool's reservation, from the start of its offload
/// to the end of its restore); a copy there wakes `waker` where there is one.
pub(crate) fn mark_asleep(
    start: usize,
    bytes: usize,
    name: &'static str,
    waker: Option<Arc<dyn Sleeper>>,
) {
    let mut map = ASLEEP.write();
    map.insert(start, (start.saturating_add(bytes), name, waker));
    ASLEEP_COUNT.store(map.len(), Ordering::Release);
}

/// Marks the range that starts at `start` awake again.
pub(crate) fn mark_awake(start: usize) {
    let mut map = ASLEEP.write();
    map.remove(&start);
    ASLEEP_COUNT.store(map.len(), Ordering::Release);
}

/// An error when `[ptr, ptr + bytes)` touches a sleeping pool's memory: a copy there would
/// touch pages the sleep gave back. `name` is the argument, for the message.
///
/// # Errors
/// [`Error::Logic`] naming the argument, the address and the sleep.
#[inline]
pub fn check_awake(name: &str, ptr: usize, bytes: usize) -> Result<()> {
    if bytes == 0 || ASLEEP_COUNT.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let end = ptr.saturating_add(bytes);
    let hit = ASLEEP
        .read()
        .range(..end)
        .next_back()
        .filter(|(_, (stop, _, _))| *stop > ptr)
        .map(|(_, (_, pool, waker))| (*pool, waker.clone()));
    match hit {
        None => Ok(()),
        Some((_, Some(waker))) if waker.wake_for_use() => Ok(()),
        Some((pool, _)) => Err(Error::Logic(format!(
            "{name}={ptr:#x} ({bytes} bytes) lies in the memory of an {pool} pool that is asleep \
             (offloaded to host memory; its pages are given back): restore() it first, or wait \
             for the end of rrmm.sleep()"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_into_a_sleeping_range_are_refused_and_others_pass() {
        let base = 0x7000_0000_0000usize;
        assert!(check_awake("src", base, 16).is_ok());
        mark_asleep(base, 1 << 20, "expandable", None);
        assert!(check_awake("src", base + 100, 16).is_err());
        assert!(
            check_awake("src", base - 8, 16).is_err(),
            "overlaps the start"
        );
        assert!(
            check_awake("src", base + (1 << 20), 16).is_ok(),
            "just past"
        );
        assert!(check_awake("src", base - 16, 16).is_ok(), "just before");
        let e = check_awake("dst", base, 1).unwrap_err().to_string();
        assert!(e.contains("asleep") && e.contains("dst="), "{e}");
        mark_awake(base);
        assert!(check_awake("src", base + 100, 16).is_ok());
    }

    /// A byte-level model of the range operations.
    fn bytes_of(ranges: &[(usize, usize)]) -> std::collections::BTreeSet<usize> {
        ranges.iter().flat_map(|&(a, n)| a..a + n).collect()
    }

    proptest::proptest! {
        #[test]
        fn range_operations_match_a_set_of_bytes(
            a in proptest::collection::vec((0usize..200, 0usize..40), 0..8),
            b in proptest::collection::vec((0usize..200, 0usize..40), 0..8),
        ) {
            let (ma, mb) = (merged(a.clone()), merged(b.clone()));
            proptest::prop_assert_eq!(bytes_of(&ma), bytes_of(&a));
            proptest::prop_assert!(ma.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0));
            let (sa, sb) = (bytes_of(&a), bytes_of(&b));
            let diff = subtract(&ma, &mb);
            proptest::prop_assert_eq!(bytes_of(&diff), sa.difference(&sb).copied().collect());
            proptest::prop_assert!(diff.iter().all(|&(_, n)| n > 0));
            let both = intersect(&ma, &mb);
            proptest::prop_assert_eq!(bytes_of(&both), sa.intersection(&sb).copied().collect());
            proptest::prop_assert_eq!(total(&diff) + total(&both), total(&ma));
        }
    }

    #[test]
    fn an_empty_watch_is_awake_and_joins_dedup() {
        let w = SleepWatch::default();
        assert!(w.is_empty() && !w.asleep());
        assert!(w.check("pool", 8).is_ok());
        assert!(SleepWatch::join([&w, &w]).is_empty());
    }
}
