//! Memory that moves: the one home of the pools whose pages move (sleep and wake, spill and
//! promotion), as every mover and every resource above them sees them.
//!
//! # One owner
//! The state of moving memory is the pool's own ([`Movement`]: its [`Phase`], who put it to
//! sleep, where its bytes are). Every mover asks the pool for a transition through [`Sleeper`]
//! and [`Spiller`] and keeps no copy of the state: a user's `offload()`/`restore()`, a tag's pool
//! paused by an engine (`rrmm.compat`), the shared-GPU ledger's sleep of an idle process
//! ([`SleepCause::Ledger`]) and the process declaring itself busy again, a wake when the pool is
//! used (an allocation, one of rrmm's copies), spilling when the device is full and promotion back.
//! The pool orders its transitions with one lock held through each: a wake waits for an offload
//! in flight and undoes it (an offload for the ledger that is no longer wanted is abandoned
//! between its chunks); a refused transition changes nothing.
//!
//! # The link
//! A resource built over a pool (directly or through adaptors and other suballocators) sees it in
//! its link's [`SleepWatch`], a live cell: when the graph below grows (a tag or a bin added), the
//! new pool reaches every resource above, and the suballocators above are admitted as its
//! tenants. Through the watch a suballocator refuses to hand out blocks while a pool below sleeps
//! (its cached ranges lie on pages the sleep unmapped), its snapshot marks its segments
//! offloaded, and a free forgets a tag. At offload the pool asks each [`Tenant`] which of the
//! ranges it holds are free, and copies only the rest (a chunk is offloaded as its live blocks);
//! a tag finds the exact block a buffer is (the smallest live block that holds its address, at
//! any level).
//!
//! Tags and discards cover exactly the bytes of the tagged block. Tags given to one sleep
//! ([`SleepPlan::discard`]) apply to that sleep only; [`Sleeper::tag`] tags until the block is
//! freed.
//!
//! # The process's index
//! Copies that rrmm makes on behalf of its users (a `DeviceBuffer`'s, the Python hooks') check
//! [`check_awake`] first: an address inside a sleeping pool's reservation wakes it when it sleeps
//! for the ledger, else is an error naming the sleep, never a touch of unmapped memory. The index
//! of sleeping ranges ([`index`]) is an index, not a state: it names the pool, whose own phase
//! and cause decide.
//!
//! Functions over any stack (offload, restore, promote, figures): [`stack`].

use super::host_pages::mapped::{PromoteReport, SpillFigures};
use crate::error::{Error, Result};
use crate::pressure::Place;
use crate::report::snapshot::SegmentInfo;
use std::sync::{Arc, Weak};

pub mod index;
mod ranges;
pub mod stack;
mod watch;

pub use index::{any_moving, check_awake};
pub use ranges::{free_ranges, intersect, lookup, merged, subtract, total, TenantLookup};
pub use watch::SleepWatch;

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

/// Where a sleep's host copy goes when the pool wakes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AfterWake {
    /// Back to the process's host page supply, ready for the next sleep of any pool (within the
    /// supply's keep limit): every sleep after the first copies into pages made before.
    #[default]
    Supply,
    /// To the OS: the host memory is free for others at once; the next sleep makes its pages.
    GiveBack,
    /// Kept with the pool: its bytes, as of the sleep, stay readable (the pool's
    /// `host_copy_of`), and the next sleep copies into it where it holds enough (same host
    /// addresses); a later wake under another policy lets it go.
    Keep,
}

from_names!(AfterWake, "after_wake", "place for the host copy after a wake",
    "supply" => Supply, "give_back" => GiveBack, "keep" => Keep);

impl AfterWake {
    /// The policy as one byte (the pool's atomic).
    pub const fn to_u8(self) -> u8 {
        match self {
            AfterWake::Supply => 0,
            AfterWake::GiveBack => 1,
            AfterWake::Keep => 2,
        }
    }

    /// The policy of [`to_u8`](Self::to_u8)'s byte.
    pub const fn from_u8(b: u8) -> AfterWake {
        match b {
            1 => AfterWake::GiveBack,
            2 => AfterWake::Keep,
            _ => AfterWake::Supply,
        }
    }

    /// Its name (`"supply"`, `"give_back"`, `"keep"`).
    pub const fn name(self) -> &'static str {
        match self {
            AfterWake::Supply => "supply",
            AfterWake::GiveBack => "give_back",
            AfterWake::Keep => "keep",
        }
    }
}

/// A change of the physical memory behind a pool's addresses, as the pool's watcher hears of it
/// ([`BackingWatcher`]), for code that registered the memory with another library (NCCL's
/// buffer registration, an RDMA memory region): such registrations name the physical pages,
/// which a sleep gives back and a wake replaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackingChange {
    /// A sleep of the user's is about to unmap the pool's pages: deregister now.
    Sleep,
    /// A wake mapped new pages under the same addresses (or a sleep was refused, the pages
    /// unchanged): register again.
    Wake,
}

impl BackingChange {
    /// Its name (`"sleep"`, `"wake"`).
    pub const fn name(self) -> &'static str {
        match self {
            BackingChange::Sleep => "sleep",
            BackingChange::Wake => "wake",
        }
    }
}

/// Called with a [`BackingChange`] and the pool's address range (start, bytes): before a sleep
/// of the user's unmaps it, after a wake of one mapped it again. Called with no lock of rrmm's
/// held, on the thread of the transition; it may call into rrmm, but must not start a
/// transition of the same pool.
pub type BackingWatcher = Arc<dyn Fn(BackingChange, usize, usize) + Send + Sync>;

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

summed_fields! {
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
}

/// The latest sleep of a pool: its figures and where the time went (seconds).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct SleepReport {
    /// What the offload freed and copied (its keys are the report's own in a dict).
    #[serde(flatten)]
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
    /// Bytes written to files (a sleep to disk: [`SleepPlan::disk`]); 0 for a host copy.
    pub disk_bytes: usize,
}

/// Who put a pool to sleep: what may wake it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SleepCause {
    /// The process itself (`offload()`, `rrmm.sleep()`, an engine's pause): asleep until its
    /// `restore()`; allocations and copies are refused meanwhile.
    #[default]
    User,
    /// The shared-GPU ledger, while the process declared itself idle
    /// ([`crate::shared_gpu`]): the pool wakes by itself when next used (an allocation from it or
    /// above it, one of rrmm's copies of its bytes) or when the process is busy again.
    Ledger,
}

/// Where a pool is in its sleep (one load: allocations read it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Every page mapped; blocks handed out.
    #[default]
    Awake,
    /// An offload is copying the live bytes out and unmapping (nothing handed out).
    Offloading,
    /// Offloaded: the live bytes on the host, the addresses kept.
    Asleep,
    /// A wake is mapping the pages again and copying back.
    Waking,
}

impl Phase {
    /// The phase as one byte (the pool's atomic).
    pub const fn to_u8(self) -> u8 {
        match self {
            Phase::Awake => 0,
            Phase::Offloading => 1,
            Phase::Asleep => 2,
            Phase::Waking => 3,
        }
    }

    /// The phase of [`to_u8`](Self::to_u8)'s byte (an unknown byte reads as asleep: the safe
    /// side).
    pub const fn from_u8(b: u8) -> Phase {
        match b {
            0 => Phase::Awake,
            1 => Phase::Offloading,
            3 => Phase::Waking,
            _ => Phase::Asleep,
        }
    }

    /// Its name (`"awake"`, `"offloading"`, `"asleep"`, `"waking"`).
    pub const fn name(self) -> &'static str {
        match self {
            Phase::Awake => "awake",
            Phase::Offloading => "offloading",
            Phase::Asleep => "asleep",
            Phase::Waking => "waking",
        }
    }
}

/// A pool's movement state as it is now: its phase, who put it to sleep, and where its mapped
/// bytes live (device pages, host pages spilled under its addresses, the host copy of a sleep,
/// in flight).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Movement {
    /// The phase.
    pub phase: Phase,
    /// Who put it to sleep (`None` while awake).
    pub cause: Option<SleepCause>,
    /// Bytes of device pages mapped under its addresses.
    pub device_bytes: usize,
    /// Bytes of host pages mapped under its addresses (spilled); they stay where they are
    /// across a sleep.
    pub spilled_bytes: usize,
    /// Bytes of its live data held in the host copy of a sleep (0 while awake).
    pub offloaded_bytes: usize,
    /// Bytes being moved now (an offload's, a wake's or a promotion's pages).
    pub moving_bytes: usize,
    /// How many times the physical memory behind its addresses changed: every sleep, wake and
    /// promotion that moved pages (whoever asked). Code that registered the memory elsewhere
    /// compares it with the count it registered at (see [`BackingWatcher`] for being told).
    pub backing_changes: u64,
}

/// What one sleep does beyond the persistent tags: the blocks (start, bytes) it discards, what
/// discarded blocks hold after the wake, and who asks.
#[derive(Clone, Default)]
pub struct SleepPlan {
    /// Exact ranges not copied by this sleep only (each a live block, resolved by
    /// [`SleepWatch::block_at`]).
    pub discard: Vec<(usize, usize)>,
    /// What discarded ranges hold after the wake.
    pub fill: DiscardFill,
    /// Discard every live block (copy nothing): the pool's data is not worth keeping (a KV
    /// cache between an engine's phases, a region paused without a backup).
    pub discard_all: bool,
    /// Who asks ([`SleepCause`]): a sleep for the ledger wakes by itself when the pool is used.
    pub cause: SleepCause,
    /// Whether the sleep is still wanted: read once the pool's transition lock is held and
    /// between the offload's chunks; when it turns false the offload is abandoned (what it
    /// unmapped is mapped back, every byte in place) and refused. The ledger's sleep reads
    /// whether the process is still idle.
    pub still_wanted: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
    /// Write the kept bytes to files in this directory instead of host memory (a disk backup:
    /// see [`crate::resource::host_pages::disk`]).
    pub disk: Option<crate::resource::host_pages::disk::DiskTarget>,
}

impl std::fmt::Debug for SleepPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SleepPlan")
            .field("discard", &self.discard)
            .field("fill", &self.fill)
            .field("discard_all", &self.discard_all)
            .field("cause", &self.cause)
            .field("still_wanted", &self.still_wanted.is_some())
            .field("disk", &self.disk)
            .finish()
    }
}

impl SleepPlan {
    /// A plan of the user's that discards nothing beyond the persistent tags.
    pub fn with_fill(fill: DiscardFill) -> SleepPlan {
        SleepPlan {
            fill,
            ..SleepPlan::default()
        }
    }

    /// The ledger's plan: keep every live byte, wake when used, abandoned once `still_wanted`
    /// turns false.
    pub fn for_ledger(still_wanted: Arc<dyn Fn() -> bool + Send + Sync>) -> SleepPlan {
        SleepPlan {
            cause: SleepCause::Ledger,
            still_wanted: Some(still_wanted),
            ..SleepPlan::default()
        }
    }

    /// Whether the sleep is still wanted now ([`still_wanted`](Self::still_wanted)).
    pub fn wanted(&self) -> bool {
        self.still_wanted.as_ref().map_or(true, |f| f())
    }
}

/// A suballocator that carves blocks out of memory a sleeper below it handed out (its chunks):
/// what the sleeper asks it at offload and when a block is tagged.
pub trait Tenant: Send + Sync {
    /// Its segments (the chunks it holds from below) with their blocks, live and free, as its
    /// snapshot reports them: a sleep copies none of the free ones.
    fn segments(&self) -> Vec<SegmentInfo>;
}

/// A pool whose memory can sleep, as the movers and the resources above it see it: its
/// transitions (offload, wake), tags and tenants. The state is the pool's own ([`Movement`]);
/// callers keep no copy of it.
pub trait Sleeper: Send + Sync + std::fmt::Debug {
    /// The pool's identity (clones that share it return the same number).
    fn identity(&self) -> usize;

    /// Whose memory it is (the device, or a simulated source): the ledger's place.
    fn place(&self) -> Place;

    /// Whether the pool is asleep, falling asleep or waking (one load).
    fn asleep(&self) -> bool;

    /// The pool's movement state now.
    fn movement(&self) -> Movement;

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

    /// Puts the pool to sleep with `plan`. A pool asleep for the ledger that the user puts to
    /// sleep becomes the user's (it no longer wakes when used).
    ///
    /// # Errors
    /// As the pool's own offload; a refused or abandoned offload changes nothing.
    fn offload(&self, plan: &SleepPlan) -> Result<SleepEstimate>;

    /// Wakes the pool where it sleeps for `cause` (any cause: `None`), after the transition in
    /// flight (an offload for the ledger in flight is abandoned); whether it is awake after.
    ///
    /// # Errors
    /// As the pool's own restore (the pool stays asleep with its data on the host).
    fn wake(&self, cause: Option<SleepCause>) -> Result<bool>;

    /// Wakes the pool where it sleeps for the ledger (it is about to be used); whether it is
    /// awake afterwards (false: it sleeps by its user's choice, or could not wake).
    fn wake_for_use(&self) -> bool {
        self.wake(Some(SleepCause::Ledger)).unwrap_or(false)
    }

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

    /// The pool's last sleep (`None` before its first).
    fn last_sleep(&self) -> Option<SleepReport>;
}

/// A pool whose pages spill to the host when the device is full, as the movers see it.
pub trait Spiller: Send + Sync {
    /// Moves the pool's pages spilled to the host (those in `range` where given) back to
    /// device memory at the same addresses, at most `limit` bytes, as far as the device has
    /// room (nothing where the pool never spills). Ordered against the pool's sleeps.
    ///
    /// # Errors
    /// As the pool's own promote (a refused promotion moves nothing).
    fn promote(&self, range: Option<ByteRange>, limit: Option<usize>) -> Result<PromoteReport>;

    /// A safe point (no work runs on the pool's memory until this returns): the pool moves
    /// its spilled pages back as far as the device has room, where its auto promotion allows
    /// (nothing where it never spills).
    ///
    /// # Errors
    /// As [`promote`](Self::promote).
    fn promote_at_safe_point(&self) -> Result<PromoteReport> {
        Ok(PromoteReport::default())
    }

    /// The figures of the host pages the pool spills to (`None`: it never spills).
    fn spill_figures(&self) -> Option<SpillFigures>;
}

/// A pool whose memory moves: both faces ([`Sleeper`], [`Spiller`]), what a [`SleepWatch`]
/// holds.
pub trait MovingPool: Sleeper + Spiller {}

impl<T: Sleeper + Spiller> MovingPool for T {}

/// A range of addresses: (start, bytes).
pub type ByteRange = (usize, usize);

/// The error of a suballocator's allocation while a pool below it sleeps.
pub fn asleep_below_error(name: &str, bytes: usize) -> Error {
    Error::Logic(format!(
        "{name}: the expandable pool under it is asleep (offloaded to host memory); restore() \
         it first (allocation of {bytes} bytes refused)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip_through_their_byte() {
        for p in [
            Phase::Awake,
            Phase::Offloading,
            Phase::Asleep,
            Phase::Waking,
        ] {
            assert_eq!(Phase::from_u8(p.to_u8()), p);
        }
        assert_eq!(
            Phase::from_u8(200),
            Phase::Asleep,
            "unknown reads as asleep"
        );
    }

    #[test]
    fn a_plan_is_wanted_until_its_predicate_says_no() {
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let f = flag.clone();
        let plan = SleepPlan::for_ledger(Arc::new(move || {
            f.load(std::sync::atomic::Ordering::SeqCst)
        }));
        assert!(plan.wanted() && plan.cause == SleepCause::Ledger);
        flag.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(!plan.wanted());
        assert!(SleepPlan::default().wanted());
        assert!(format!("{plan:?}").contains("still_wanted: true"));
    }

    #[test]
    fn tags_and_fills_are_named_by_words() {
        assert_eq!("discard".parse::<SleepTag>().unwrap(), SleepTag::Discard);
        assert_eq!("zero".parse::<DiscardFill>().unwrap(), DiscardFill::Zero);
        let e = "drop".parse::<SleepTag>().unwrap_err().to_string();
        assert!(e.contains("\"keep\" or \"discard\""), "{e}");
    }
}
