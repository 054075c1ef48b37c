//! The expandable pool's movement state: the one owner of where its memory is (see
//! [`crate::resource::sleep`]), and the pool's face to every mover ([`Sleeper`], [`Spiller`]).
//!
//! # The phase (no lock on the allocation path)
//! Transitions (offload, wake, promotion) run under the pool's transition lock, held through
//! each. An offload enters the process's index of sleeping pools and sets the phase to
//! `Offloading` once it has trimmed the free pages, before it reads the blocks (a wake sets it to
//! `Awake` last). An allocation reads the phase before and after the core serves it: refused
//! before; after, a block the core handed out while a sleep began is freed again and refused
//! too. This is sound because the offload's snapshot locks every stream list and the shared state
//! after setting the phase: a block carved after the snapshot read its list is carved under that
//! list's lock, so its allocation sees the phase; a block carved before is live in the snapshot
//! and is copied. Growth and the growth policy's trim do nothing unless the pool is awake, so no
//! page is mapped or unmapped behind a transition's back. A free never waits.
//!
//! # Who put it to sleep
//! The cause ([`SleepCause`]) says what may wake it: a sleep for the ledger wakes when the pool
//! is used (an allocation, one of rrmm's copies) or when the process is busy again, and an
//! offload for the ledger still in flight is abandoned by such a wake (its plan's
//! `still_wanted` is read between chunks, and a wake raises `abandon`). A user's sleep wakes
//! only at the user's restore. A user's offload of a pool asleep for the ledger makes the sleep
//! the user's.

use super::{ExpandableMemoryResource, Inner};
use crate::error::{Error, Result};
use crate::pressure::Place;
use crate::resource::host_pages::mapped::PromoteReport;
use crate::resource::sleep::{
    AfterWake, BackingChange, BackingWatcher, ByteRange, DiscardFill, Movement, Phase, SleepCause,
    SleepEstimate, SleepPlan, SleepReport, SleepTag, Sleeper, Spiller, Tenant,
};
use crate::resource::HostCopy;
use crate::resource::SpillFigures;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// A sleeping pool's record.
#[derive(Debug)]
pub(super) struct Saved {
    /// Device page runs unmapped (start, bytes), mapped again at restore.
    pub(super) runs: Vec<(usize, usize)>,
    /// Kept ranges (address, bytes, offset in the host copy), copied back at restore.
    pub(super) kept: Vec<(usize, usize, usize)>,
    /// Discarded ranges (address, bytes), zeroed at restore when the fill asks.
    pub(super) discarded: Vec<(usize, usize)>,
    pub(super) host: HostCopy,
    pub(super) fill: DiscardFill,
    pub(super) report: SleepReport,
}

impl Saved {
    /// Bytes of live data kept in the host copy.
    pub(super) fn kept_bytes(&self) -> usize {
        self.kept.iter().map(|&(_, bytes, _)| bytes).sum()
    }
}

/// A host copy kept with the pool after its wake ([`AfterWake::Keep`]): its bytes as of that
/// sleep, readable until the next sleep copies into it.
#[derive(Debug)]
pub(super) struct Retained {
    pub(super) host: HostCopy,
    /// The kept ranges of that sleep (address, bytes, offset in the copy).
    pub(super) kept: Vec<(usize, usize, usize)>,
}

/// The pool's movement state, its tags, its tenants and its records (one per pool).
#[derive(Default)]
pub(super) struct MovementState {
    /// The phase ([`Phase::to_u8`]), shared with the growth policy, which maps and trims only
    /// while the pool is awake.
    pub(super) phase: Arc<AtomicU8>,
    /// Who put the pool to sleep (0: the user, 1: the ledger); read while not awake.
    cause: AtomicU8,
    /// The transition lock, held through a whole offload, wake or promotion, and the sleep
    /// record (`Some` while asleep).
    state: Mutex<Option<Box<Saved>>>,
    /// Raised by a wake that wants an offload for the ledger in flight abandoned.
    pub(super) abandon: AtomicBool,
    /// Bytes being moved by the transition in flight.
    pub(super) moving: AtomicUsize,
    /// Blocks tagged discard until freed: start -> bytes (a block of the pool's own, or one a
    /// tenant handed out: exactly its bytes).
    pub(super) tags: Mutex<HashMap<usize, usize>>,
    /// `tags.len()`, read by frees without the lock.
    pub(super) tagged: AtomicUsize,
    /// The suballocators over the pool, while they live.
    pub(super) tenants: Mutex<Vec<Weak<dyn Tenant>>>,
    /// Where a wake puts the host copy ([`AfterWake::to_u8`]).
    pub(super) after_wake: AtomicU8,
    /// The host copy kept with the pool after its wake ([`AfterWake::Keep`]); locked after
    /// the transition lock.
    pub(super) retained: Mutex<Option<Retained>>,
    /// Changes of the physical memory behind the addresses ([`Movement::backing_changes`]).
    pub(super) backing_changes: AtomicU64,
    /// Told of the user's sleeps and wakes, outside every lock.
    pub(super) watcher: Mutex<Option<BackingWatcher>>,
    pub(super) last: Mutex<Option<SleepReport>>,
    pub(super) sleeps: AtomicUsize,
    /// When spilled pages move back on their own ([`super::spill::AutoPromote::to_u8`]).
    pub(super) auto_promote: AtomicU8,
    /// The pool's free bytes at the last promotion after a free that moved nothing (the next
    /// one waits for more room than that).
    pub(super) promote_tried_at: AtomicUsize,
}

impl std::fmt::Debug for MovementState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MovementState")
            .field("phase", &self.phase())
            .field("tagged", &self.tagged)
            .finish_non_exhaustive()
    }
}

/// Counts `bytes` as moving in the pool's state while it lives.
pub(super) struct Moving<'a>(&'a MovementState, usize);

impl<'a> Moving<'a> {
    pub(super) fn new(state: &'a MovementState, bytes: usize) -> Self {
        state.moving.fetch_add(bytes, Ordering::Relaxed);
        Moving(state, bytes)
    }
}

impl Drop for Moving<'_> {
    fn drop(&mut self) {
        self.0.moving.fetch_sub(self.1, Ordering::Relaxed);
    }
}

/// The error of an allocation while asleep.
pub(super) fn asleep_error(bytes: usize) -> Error {
    Error::Logic(format!(
        "expandable: the pool is asleep (offloaded to host memory); restore() it first \
         (allocation of {bytes} bytes refused)"
    ))
}

impl MovementState {
    /// The phase now (one load).
    #[inline]
    pub(super) fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Acquire))
    }

    /// Whether the pool is asleep, or falling asleep or waking (one load).
    #[inline]
    pub(super) fn asleep(&self) -> bool {
        self.phase.load(Ordering::Acquire) != Phase::Awake.to_u8()
    }

    pub(super) fn set_phase(&self, phase: Phase) {
        self.phase.store(phase.to_u8(), Ordering::SeqCst);
    }

    /// Who put the pool to sleep; `None` while awake.
    pub(super) fn cause(&self) -> Option<SleepCause> {
        if !self.asleep() {
            return None;
        }
        Some(match self.cause.load(Ordering::Acquire) {
            1 => SleepCause::Ledger,
            _ => SleepCause::User,
        })
    }

    pub(super) fn set_cause(&self, cause: SleepCause) {
        let b = u8::from(cause == SleepCause::Ledger);
        self.cause.store(b, Ordering::SeqCst);
    }

    /// The transition lock and sleep record, held: no other transition runs meanwhile.
    pub(super) fn hold(&self) -> MutexGuard<'_, Option<Box<Saved>>> {
        self.state.lock()
    }

    /// As [`hold`](Self::hold), `None` when a transition holds it now.
    pub(super) fn try_hold(&self) -> Option<MutexGuard<'_, Option<Box<Saved>>>> {
        self.state.try_lock()
    }

    /// Forgets the tag of the block at `ptr` (it was freed): a later block at that address
    /// starts as keep. A load of one counter when nothing is tagged.
    pub(super) fn forget(&self, ptr: usize) {
        if self.tagged.load(Ordering::Acquire) > 0 {
            let mut tags = self.tags.lock();
            if tags.remove(&ptr).is_some() {
                crate::resource::sleep::index::count_tags(0, 1);
            }
            self.tagged.store(tags.len(), Ordering::Release);
        }
    }

    /// Sets the tag of the block (start, bytes).
    pub(super) fn set_tag(&self, (start, bytes): (usize, usize), tag: SleepTag) {
        let mut tags = self.tags.lock();
        let had = match tag {
            SleepTag::Keep => tags.remove(&start).is_some(),
            SleepTag::Discard => tags.insert(start, bytes).is_some(),
        };
        match (tag, had) {
            (SleepTag::Keep, true) => crate::resource::sleep::index::count_tags(0, 1),
            (SleepTag::Discard, false) => crate::resource::sleep::index::count_tags(1, 0),
            _ => {}
        }
        self.tagged.store(tags.len(), Ordering::Release);
    }

    /// The live tenants' segments (dropped tenants forgotten).
    pub(super) fn tenant_segments(&self) -> Vec<Vec<crate::report::SegmentInfo>> {
        let mut tenants = self.tenants.lock();
        tenants.retain(|t| t.strong_count() > 0);
        let live: Vec<Arc<dyn Tenant>> = tenants.iter().filter_map(Weak::upgrade).collect();
        drop(tenants);
        live.iter().map(|t| t.segments()).collect()
    }

    /// Where a wake puts the host copy.
    pub(super) fn after_wake(&self) -> AfterWake {
        AfterWake::from_u8(self.after_wake.load(Ordering::Relaxed))
    }

    /// Counts a change of the physical memory behind the addresses.
    pub(super) fn backing_changed(&self) {
        self.backing_changes.fetch_add(1, Ordering::Release);
    }

    /// Tells the watcher (if any) of `change` of the range `base .. base + bytes`; call with no
    /// lock held.
    pub(super) fn tell(&self, change: BackingChange, base: usize, bytes: usize) {
        let watcher = self.watcher.lock().clone();
        if let Some(w) = watcher {
            w(change, base, bytes);
        }
    }

    /// The tags' count leaves the process's count when the pool drops.
    pub(super) fn forget_all_tags(&self) {
        let n = std::mem::take(&mut *self.tags.lock()).len();
        crate::resource::sleep::index::count_tags(0, n);
        self.tagged.store(0, Ordering::Release);
    }
}

impl ExpandableMemoryResource {
    /// The pool's movement state now: its phase, who put it to sleep, and where its bytes are
    /// (device pages, host pages spilled under its addresses, the host copy of a sleep, in
    /// flight). Never waits for a transition.
    pub fn movement(&self) -> Movement {
        let m = &self.inner.sleep;
        let spilled = self.spilled_bytes();
        let offloaded = match m.try_hold() {
            Some(state) => state.as_ref().map_or(0, |s| s.kept_bytes()),
            None => m
                .last
                .lock()
                .as_ref()
                .map_or(0, |r| r.estimate.copied_bytes),
        };
        Movement {
            phase: m.phase(),
            cause: m.cause(),
            device_bytes: self.mapped_bytes().saturating_sub(spilled),
            spilled_bytes: spilled,
            offloaded_bytes: if m.asleep() { offloaded } else { 0 },
            moving_bytes: m.moving.load(Ordering::Relaxed),
            backing_changes: m.backing_changes.load(Ordering::Acquire),
        }
    }

    /// Whether the pool is asleep (offloaded, not yet restored), falling asleep or waking.
    pub fn asleep(&self) -> bool {
        self.inner.sleep.asleep()
    }
}

impl Inner {
    /// A handle of this pool, while it lives.
    fn handle(&self) -> Option<ExpandableMemoryResource> {
        self.me
            .upgrade()
            .map(|inner| ExpandableMemoryResource { inner })
    }

    fn gone() -> Error {
        Error::Logic("expandable: the pool is being dropped".into())
    }
}

impl Sleeper for Inner {
    fn identity(&self) -> usize {
        self as *const Inner as usize
    }

    fn place(&self) -> Place {
        crate::resource::place_of(self.vm.kind(), self.vm.device(), self.identity())
    }

    fn asleep(&self) -> bool {
        self.sleep.asleep()
    }

    fn movement(&self) -> Movement {
        self.handle()
            .map_or_else(Movement::default, |h| h.movement())
    }

    fn admit(&self, tenant: Weak<dyn Tenant>) {
        let mut tenants = self.sleep.tenants.lock();
        tenants.retain(|t| t.strong_count() > 0);
        tenants.push(tenant);
    }

    fn block_at(&self, addr: usize) -> Option<(usize, usize)> {
        self.handle()?.live_block_at(addr)
    }

    fn tag(&self, block: (usize, usize), tag: SleepTag) {
        self.sleep.set_tag(block, tag);
    }

    fn forget(&self, addr: usize) {
        self.sleep.forget(addr);
    }

    fn offload(&self, plan: &SleepPlan) -> Result<SleepEstimate> {
        self.handle().ok_or_else(Self::gone)?.offload_plan(plan)
    }

    fn wake(&self, cause: Option<SleepCause>) -> Result<bool> {
        self.handle().ok_or_else(Self::gone)?.wake(cause)
    }

    fn estimate(&self, plan: &SleepPlan) -> SleepEstimate {
        self.handle()
            .map_or_else(SleepEstimate::default, |h| h.estimate_with(plan))
    }

    fn prepare(&self) -> Result<usize> {
        self.handle().ok_or_else(Self::gone)?.prepare_sleep()
    }

    fn keep_ready(&self, on: bool) -> Result<usize> {
        self.handle().ok_or_else(Self::gone)?.keep_sleep_ready(on)
    }

    fn last_sleep(&self) -> Option<SleepReport> {
        self.sleep.last.lock().clone()
    }
}

impl Spiller for Inner {
    fn promote(&self, range: Option<ByteRange>, limit: Option<usize>) -> Result<PromoteReport> {
        self.handle().ok_or_else(Self::gone)?.promote(range, limit)
    }

    fn promote_at_safe_point(&self) -> Result<PromoteReport> {
        self.handle()
            .ok_or_else(Self::gone)?
            .promote_at_safe_point()
    }

    fn spill_figures(&self) -> Option<SpillFigures> {
        self.vm.spill_figures()
    }
}
