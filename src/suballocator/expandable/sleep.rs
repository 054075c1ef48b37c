//! Sleep and wake for the expandable pool: [`offload`](ExpandableMemoryResource::offload)
//! copies the live blocks' bytes on device pages to host memory and gives every device page back
//! to the driver, keeping the whole address reservation;
//! [`restore`](ExpandableMemoryResource::restore) maps the same pages at the same addresses and
//! copies the bytes back. Live allocations keep their addresses (CUDA graphs, CuPy arrays,
//! PyTorch tensors stay valid) and their data. Pages spilled to the host (a spilling pool) stay
//! mapped where they are: they are host memory already, so a sleep neither copies them nor asks
//! for host memory for them. The state and its ordering: `movement.rs`.
//!
//! # Offload
//! 1. Synchronize every stream the pool has seen (the context): work queued on the pool's memory
//!    finishes first, so the bytes copied are final (offload waits, it never refuses).
//! 2. Unmap every page wholly inside free blocks (a `trim(0)`): never copied. Enter the index of
//!    sleeping pools, set the phase.
//! 3. Take the host copy for the live blocks on device pages not tagged [`SleepTag::Discard`]
//!    (refused here when the host has no room: nothing else changed), copy them (adjacent
//!    blocks as one copy), then unmap the device page runs, chunk by chunk; an offload that is no
//!    longer wanted (its plan, or a wake for the ledger) stops between chunks and maps back what
//!    it unmapped.
//!
//! # Restore
//! Map the recorded page runs again (all or nothing: on a refusal the runs mapped so far are
//! unmapped again, the pool stays asleep with its bytes on the host, and a later restore retries),
//! copy the kept blocks back, zero the discarded ones when asked ([`DiscardFill::Zero`]), then
//! return the host copy's pages to the process's host page supply, where the next sleep takes
//! them ready (or to the OS, [`set_retain_host_copy`]), trim the pages freed while asleep, and
//! set the phase to awake.
//!
//! [`set_retain_host_copy`]: ExpandableMemoryResource::set_retain_host_copy

use super::movement::{Moving, Retained, Saved};
use super::{ExpandableMemoryResource, Inner};
use crate::error::{Error, Result};
use crate::report::snapshot::BlockState;
use crate::resource::sleep::{
    self as rs, index, AfterWake, BackingChange, MovingPool, Phase, SleepCause, SleepPlan,
    TenantLookup,
};
use crate::resource::{CopyFence, HostCopy, Toward};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

pub use crate::resource::sleep::{DiscardFill, SleepEstimate, SleepReport, SleepTag};

/// The error of an offload abandoned half-way (a wake came, or its plan is no longer wanted).
fn abandoned() -> Error {
    Error::Logic(
        "expandable: the sleep was abandoned (no longer wanted: the process is busy again, or a \
         wake came); every byte is where it was"
            .into(),
    )
}

/// The live blocks (start, size), the mapped runs and the bytes of whole free pages, from one
/// snapshot of the pool.
struct View {
    live: Vec<(usize, usize)>,
    runs: Vec<(usize, usize)>,
    free_page_bytes: usize,
}

/// What an offload copies and discards: exact ranges, sorted and disjoint.
#[derive(Debug, Default)]
struct CopyPlan {
    kept: Vec<(usize, usize)>,
    discarded: Vec<(usize, usize)>,
    /// Free ranges of tenants inside the pool's live blocks: neither copied nor kept.
    cached_free: usize,
}

impl ExpandableMemoryResource {
    fn view(&self) -> View {
        let page = self.page_size();
        let base = self.inner.vm.base();
        let mut view = View {
            live: Vec::new(),
            runs: Vec::new(),
            free_page_bytes: 0,
        };
        for seg in self.inner.core.snapshot() {
            view.runs.push((seg.address, seg.total_size));
            for b in seg.blocks {
                match b.state {
                    BlockState::Allocated => view.live.push((b.address, b.size)),
                    BlockState::Free => {
                        let lo = base + (b.address - base).div_ceil(page) * page;
                        let hi = base + (b.address + b.size - base) / page * page;
                        view.free_page_bytes += hi.saturating_sub(lo);
                    }
                }
            }
        }
        view.live.sort_unstable();
        view
    }

    /// The exact ranges an offload with `plan` copies and discards, from the pool's live blocks
    /// `live`: the tenants' free ranges are neither, the tagged blocks' bytes (persistent tags
    /// and the plan's `discard`; every live byte with `discard_all`) are discarded, the bytes on
    /// spilled pages stay where they are, every other live byte is kept.
    fn copy_plan(&self, live: &[(usize, usize)], plan: &SleepPlan) -> CopyPlan {
        let gate = &self.inner.sleep;
        let live = rs::merged(live.to_vec());
        let free: Vec<(usize, usize)> = gate
            .tenant_segments()
            .iter()
            .flat_map(|segs| rs::free_ranges(segs))
            .collect();
        let free = rs::intersect(&live, &rs::merged(free));
        let mut holes: Vec<(usize, usize)> =
            gate.tags.lock().iter().map(|(&a, &n)| (a, n)).collect();
        holes.extend_from_slice(&plan.discard);
        let used = rs::subtract(&live, &free);
        if plan.discard_all {
            holes.extend_from_slice(&used);
        }
        let tagged = rs::merged(holes);
        let spilled = rs::merged(self.inner.vm.spilled_runs());
        CopyPlan {
            kept: rs::subtract(&rs::subtract(&used, &tagged), &spilled),
            discarded: rs::intersect(&used, &tagged),
            cached_free: rs::total(&free),
        }
    }

    /// The smallest live block holding `ptr`: the pool's own, or one a tenant handed out;
    /// `None` when no live block holds it, or when a tenant holds it free (a stale address).
    pub(super) fn live_block_at(&self, ptr: usize) -> Option<(usize, usize)> {
        // The start of one of the pool's own blocks is a lookup in the stream lists; an address
        // inside one needs the ordered view of every block.
        let own = if let Some(size) = self.inner.core.allocated_at(ptr) {
            Some((ptr, size))
        } else {
            let live = self.view().live;
            let i = live.partition_point(|&(a, _)| a <= ptr);
            i.checked_sub(1)
                .map(|i| live[i])
                .filter(|&(a, size)| ptr < a + size.max(1))
        }?;
        let mut best = own;
        for segs in self.inner.sleep.tenant_segments() {
            match rs::lookup(&segs, ptr) {
                TenantLookup::NotHeld => {}
                TenantLookup::Free => return None,
                TenantLookup::Live(a, n) if n < best.1 => best = (a, n),
                TenantLookup::Live(..) => {}
            }
        }
        Some(best)
    }

    /// Tags the live allocation that holds `ptr` (any address inside it) `tag`: [`Keep`]
    /// (offloaded and restored, the default) or [`Discard`] (not copied). The allocation is the
    /// smallest live block holding `ptr`, the pool's own or one a suballocator over the pool
    /// handed out: exactly its bytes are tagged. The tag holds until the allocation is freed.
    /// Returns the allocation's start. Tagging an allocation while another thread frees it is
    /// the caller's race (as any use after free).
    ///
    /// [`Keep`]: SleepTag::Keep
    /// [`Discard`]: SleepTag::Discard
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when no live allocation holds `ptr`.
    pub fn tag(&self, ptr: usize, tag: SleepTag) -> Result<usize> {
        let block = self.live_block_at(ptr).ok_or_else(|| {
            Error::invalid(
                "ptr",
                format!("{ptr:#x} is not inside a live allocation of this expandable pool"),
            )
        })?;
        self.inner.sleep.set_tag(block, tag);
        Ok(block.0)
    }

    /// The tag of the live allocation that starts at `ptr` ([`SleepTag::Keep`] unless tagged).
    pub fn tag_of(&self, ptr: usize) -> SleepTag {
        if self.inner.sleep.tags.lock().contains_key(&ptr) {
            SleepTag::Discard
        } else {
            SleepTag::Keep
        }
    }

    /// What an [`offload`](Self::offload) now would release, copy and discard (all zero while
    /// asleep: the memory is released already). Reads one snapshot of the pool and its tenants.
    pub fn sleep_estimate(&self) -> SleepEstimate {
        self.estimate_with(&SleepPlan::default())
    }

    pub(super) fn estimate_with(&self, plan: &SleepPlan) -> SleepEstimate {
        if self.inner.sleep.asleep() {
            return SleepEstimate::default();
        }
        let view = self.view();
        let plan = self.copy_plan(&view.live, plan);
        SleepEstimate {
            released_bytes: self.mapped_bytes().saturating_sub(self.spilled_bytes()),
            copied_bytes: rs::total(&plan.kept),
            discarded_bytes: rs::total(&plan.discarded),
            free_page_bytes: view.free_page_bytes,
            cached_free_bytes: plan.cached_free,
            live_blocks: view.live.len(),
        }
    }

    /// Bytes of the pool's data held in host memory while asleep (0 when awake, and for
    /// simulated memory, whose pages have no bytes). The host range that holds them may be
    /// larger (a range of the supply made for a larger sleep): [`SleepReport::host_bytes`].
    pub fn host_copy_bytes(&self) -> usize {
        self.inner
            .sleep
            .hold()
            .as_ref()
            .map_or(0, |s| s.kept_bytes().min(s.host.host_bytes()))
    }

    /// The latest sleep's figures and times (`None` before the first offload).
    pub fn last_sleep(&self) -> Option<SleepReport> {
        self.inner.sleep.last.lock().clone()
    }

    /// Makes the host pages of the next sleep ready ahead of need, in the background: ranges
    /// of the process's host page supply holding as much as the pool's mapped memory (what a
    /// sleep can copy at most), so that the sleep copies at the link's speed from the first
    /// time; only what the supply's free and preparing ranges lack is made (one range; the
    /// sleep's copy spans them). Returns the bytes the pages are to hold (0 for simulated
    /// memory, whose pages have no bytes).
    ///
    /// # Errors
    /// Where the memory cannot be copied to the host.
    pub fn prepare_sleep(&self) -> Result<usize> {
        let vm = &self.inner.vm;
        let Some(spec) = self.inner.ready_ahead.spec(vm.as_ref())? else {
            return Ok(0);
        };
        // Spilled pages stay where they are across a sleep: only device pages are copied.
        let bytes = self.mapped_bytes().saturating_sub(self.spilled_bytes());
        if bytes > 0 {
            vm.host_supply().prepare_total(spec, bytes);
        }
        Ok(bytes)
    }

    /// Keeps the next sleep's host pages ready as the pool grows (`on`), in the background: now,
    /// a range for what the pool has mapped ([`prepare_sleep`](Self::prepare_sleep)), and after
    /// every growth past the range asked for last, one a quarter larger than what is mapped then
    /// (the smaller free ranges given back first). Growth never waits for it. Returns the bytes
    /// asked for now (0 when off, or for simulated memory).
    ///
    /// # Errors
    /// Where the memory cannot be copied to the host.
    pub fn keep_sleep_ready(&self, on: bool) -> Result<usize> {
        let vm = &self.inner.vm;
        let ready = &self.inner.ready_ahead;
        ready.spec(vm.as_ref())?;
        ready.on.store(on, Ordering::Relaxed);
        if !on {
            ready.prepared_for.store(0, Ordering::Relaxed);
            return Ok(0);
        }
        Ok(ready.keep_up(vm.as_ref(), self.mapped_bytes()))
    }

    /// [`offload_with`](Self::offload_with) with [`DiscardFill::Undefined`].
    ///
    /// # Errors
    /// As [`offload_with`](Self::offload_with).
    pub fn offload(&self) -> Result<SleepEstimate> {
        self.offload_with(DiscardFill::Undefined)
    }

    /// Puts the pool to sleep: waits for every stream's work, unmaps the free pages, copies the
    /// live allocations (but those tagged discard) to host memory and unmaps every other page,
    /// keeping the address reservation; `fill`: what discarded allocations hold after
    /// [`restore`](Self::restore). Returns what it released and copied.
    ///
    /// # Errors
    /// As [`offload_plan`](Self::offload_plan).
    pub fn offload_with(&self, fill: DiscardFill) -> Result<SleepEstimate> {
        self.offload_plan(&SleepPlan::with_fill(fill))
    }

    /// [`offload_with`](Self::offload_with) that also discards `plan.discard`'s ranges, for this
    /// sleep only, for `plan.cause`. A suballocator's chunk over the pool is copied as its live
    /// blocks (its free ranges are not copied); a tagged block's bytes exactly are not copied;
    /// bytes on spilled pages stay where they are. A pool asleep for the ledger that the user
    /// offloads becomes the user's (the figures of that sleep are returned).
    ///
    /// # Errors
    /// [`Error::Logic`] when the pool is asleep already (offload twice), when the plan is no
    /// longer wanted (the sleep is abandoned: every byte where it was) or its virtual memory
    /// cannot copy; out of host memory for the copy; CUDA errors. On an error the pool is awake
    /// and unchanged, except when the unmapping failed half-way and undoing it failed too: then
    /// it is asleep (the message says so) and [`restore`](Self::restore) retries.
    pub fn offload_plan(&self, plan: &SleepPlan) -> Result<SleepEstimate> {
        let gate = &self.inner.sleep;
        // The user's sleeps are told to the watcher before the lock (it may call into rrmm),
        // and a refused one is told as a wake (the pages unchanged).
        let told = plan.cause == SleepCause::User && !gate.asleep();
        if told {
            self.tell(BackingChange::Sleep);
        }
        let done = self.offload_held(plan);
        if told && done.is_err() && !gate.asleep() {
            self.tell(BackingChange::Wake);
        }
        done
    }

    /// [`offload_plan`](Self::offload_plan) under the transition lock.
    fn offload_held(&self, plan: &SleepPlan) -> Result<SleepEstimate> {
        let inner = &self.inner;
        let gate = &inner.sleep;
        let mut state = gate.hold();
        if state.is_some() {
            if plan.cause == SleepCause::User && gate.cause() == Some(SleepCause::Ledger) {
                gate.set_cause(SleepCause::User);
                return Ok(gate
                    .last
                    .lock()
                    .as_ref()
                    .map_or_else(SleepEstimate::default, |r| r.estimate));
            }
            return Err(Error::Logic(
                "expandable: offload() of a pool that is asleep already; restore() it first".into(),
            ));
        }
        gate.abandon.store(false, Ordering::SeqCst);
        if !plan.wanted() {
            return Err(abandoned());
        }
        // A published pool sleeps only with no importer attached; its publication takes none
        // until the pool is awake again (here, when the sleep ends undone; at the wake).
        if let Some(share) = &inner.share {
            share.begin_sleep(&inner.vm)?;
        }
        let _publication_back = AwakeAgain(inner);
        let started = Instant::now();
        inner.events.synchronize_all()?;
        let trimmed = inner.core.release(0)?;
        // From here on allocations, growth and trims are refused (see `movement.rs`), here and
        // in every suballocator over the pool; copies of its memory too (or they wake it, for
        // the ledger's sleep).
        let me: Weak<dyn MovingPool> = Arc::downgrade(inner) as Weak<dyn MovingPool>;
        gate.set_cause(plan.cause);
        gate.set_phase(Phase::Offloading);
        index::mark_asleep(inner.vm.base(), inner.vm.reserved_bytes(), "expandable", me);
        // rrmm's copies that began before the pool was seen are queued once they are counted
        // out; their work is done after one more synchronization (a no-op with nothing queued).
        index::wait_for_copies();
        if let Err(e) = inner.events.synchronize_all() {
            gate.set_phase(Phase::Awake);
            index::mark_awake(inner.vm.base());
            return Err(e);
        }
        let still_wanted = || plan.wanted() && !gate.abandon.load(Ordering::SeqCst);
        let done = self.offload_flagged(&mut state, plan, started, trimmed, &still_wanted);
        match (&done, state.is_some()) {
            (Ok(_), _) => {
                gate.backing_changed();
                gate.set_phase(Phase::Asleep);
            }
            (Err(_), false) => {
                gate.set_phase(Phase::Awake);
                index::mark_awake(inner.vm.base());
            }
            // Half-way, and the undo failed: asleep with the data on the host.
            (Err(_), true) => gate.set_phase(Phase::Asleep),
        }
        done
    }

    /// The offload once the phase is set; `state` is `None` and held.
    fn offload_flagged(
        &self,
        state: &mut Option<Box<Saved>>,
        plan: &SleepPlan,
        started: Instant,
        trimmed: usize,
        still_wanted: &dyn Fn() -> bool,
    ) -> Result<SleepEstimate> {
        let inner = &self.inner;
        let gate = &inner.sleep;
        let view = self.view();
        let copy = self.copy_plan(&view.live, plan);
        // Spilled pages are host memory already: they stay mapped, uncopied.
        let spilled = rs::merged(inner.vm.spilled_runs());
        let runs = rs::subtract(&rs::merged(view.runs.clone()), &spilled);
        let sync_trim_s = started.elapsed().as_secs_f64();
        let mut kept = Vec::with_capacity(copy.kept.len());
        let mut copied = 0usize;
        for &(addr, size) in &copy.kept {
            kept.push((addr, size, copied));
            copied += size;
        }
        let _moving = Moving::new(gate, copied);
        let step = Instant::now();
        let (host, host_reused) = self.take_host_copy(plan, &kept, &view.live, copied)?;
        let host_alloc_s = step.elapsed().as_secs_f64();
        let step = Instant::now();
        let page = inner.vm.page_size();
        let chunks = split_runs(&runs, inner.vm.map_chunk_bytes().max(page) / page * page);
        let mut unmapped = 0;
        let mut unmap_s = 0.0;
        let mut copied_out = self.copy_out_and_unmap(
            &chunks,
            &kept,
            &host,
            &mut unmapped,
            &mut unmap_s,
            still_wanted,
        );
        if copied_out.is_ok() && !still_wanted() {
            // No longer wanted once every chunk was out: undone as a failure would be.
            copied_out = Err(abandoned());
        }
        let mut report = SleepReport {
            estimate: SleepEstimate {
                released_bytes: trimmed + rs::total(&runs),
                copied_bytes: copied,
                discarded_bytes: rs::total(&copy.discarded),
                free_page_bytes: trimmed,
                cached_free_bytes: copy.cached_free,
                live_blocks: view.live.len(),
            },
            sleeps: gate.sleeps.load(Ordering::Relaxed) as u64 + 1,
            host_bytes: host.host_bytes(),
            host_pinned: host.is_pinned(),
            host_reused,
            host_ranges: host.ranges(),
            disk_bytes: host.disk_bytes(),
            sync_trim_s,
            host_alloc_s,
            copy_out_s: step.elapsed().as_secs_f64() - unmap_s,
            unmap_s,
            ..SleepReport::default()
        };
        if let Err(e) = copied_out {
            // Always waited: the host copy may be dropped next, and the chunks unmapped so far
            // are mapped back from it.
            let _ = inner.vm.wait_copies();
            if unmapped == 0 {
                return Err(e);
            }
            // Undo: the chunks unmapped so far are a sleep of their own; wake it (the record
            // of the last sleep stays the last one that happened).
            *state = Some(Box::new(Saved {
                runs: chunks[..unmapped].to_vec(),
                kept,
                discarded: Vec::new(),
                host,
                fill: DiscardFill::Undefined,
                report,
            }));
            let last = gate.last.lock().clone();
            let undone = self.wake_locked(state);
            *gate.last.lock() = last;
            return match undone {
                Ok(()) => Err(e),
                Err(again) => Err(Error::Logic(format!(
                    "expandable: offload failed half-way ({e}) and mapping back failed \
                     ({again}): the pool is asleep with its data on the host; restore() \
                     again once memory is free"
                ))),
            };
        }
        gate.sleeps.fetch_add(1, Ordering::Relaxed);
        report.offload_s = started.elapsed().as_secs_f64();
        let estimate = report.estimate;
        *gate.last.lock() = Some(report.clone());
        *state = Some(Box::new(Saved {
            runs,
            kept,
            discarded: copy.discarded,
            host,
            fill: plan.fill,
            report,
        }));
        Ok(estimate)
    }

    /// Copies the kept pieces `(addr, bytes, host offset)` out chunk by chunk and unmaps each
    /// chunk once its copies are done, while the next chunk's copies run; `unmapped` counts the
    /// chunks unmapped (a prefix), `unmap_s` the seconds spent unmapping.
    #[allow(unsafe_code)]
    fn copy_out_and_unmap(
        &self,
        chunks: &[(usize, usize)],
        pieces: &[(usize, usize, usize)],
        host: &HostCopy,
        unmapped: &mut usize,
        unmap_s: &mut f64,
        still_wanted: &dyn Fn() -> bool,
    ) -> Result<()> {
        let vm = &self.inner.vm;
        let mut fences = std::collections::VecDeque::new();
        let mut unmap_next = |fences: &mut std::collections::VecDeque<CopyFence>| -> Result<()> {
            if let Some(fence) = fences.pop_front() {
                fence.wait()?;
                let (addr, len) = chunks[*unmapped];
                let step = Instant::now();
                // SAFETY: every stream was synchronized (offload's contract: no work of the
                // pool's users is queued meanwhile), the copies out of the chunk are done (its
                // fence), a block an allocation carves here now is freed again unused (it sees
                // the phase), and the pages are mapped again before any allocation is handed out.
                unsafe { vm.unmap(addr, len) }?;
                *unmap_s += step.elapsed().as_secs_f64();
                *unmapped += 1;
            }
            Ok(())
        };
        let mut next = 0;
        for &(addr, len) in chunks {
            if !still_wanted() {
                return Err(abandoned());
            }
            let end = addr + len;
            while let Some(&(at, size, off)) = pieces.get(next) {
                if at >= end {
                    break;
                }
                if at + size > addr {
                    let (lo, hi) = (at.max(addr), (at + size).min(end));
                    // SAFETY: `lo .. hi` lies in a block live at the snapshot, so its pages are
                    // mapped (the phase stops growth and trims since before it) and no work is
                    // queued on it (synchronized; offload's contract); the piece lies in the
                    // copy (`off + size` is at most its length), which nothing else uses and
                    // which outlives the copies (fenced, or waited for on an error).
                    unsafe { host.copy(vm.as_ref(), Toward::Copy, lo, off + (lo - at), hi - lo) }?;
                }
                if at + size > end {
                    break;
                }
                next += 1;
            }
            fences.push_back(vm.copy_fence()?);
            // The chunk before this one, while this one's copies run.
            if fences.len() > 1 {
                unmap_next(&mut fences)?;
            }
        }
        while !fences.is_empty() {
            unmap_next(&mut fences)?;
        }
        host.finish(true)
    }

    /// Wakes the pool: maps its pages again at the same addresses, copies the kept allocations
    /// back and zeroes the discarded ones when the offload asked, and releases the host copy;
    /// whoever put it to sleep.
    ///
    /// # Errors
    /// [`Error::Logic`] when the pool is awake (restore without offload); out of memory when the
    /// driver cannot map the pages again (another process took the memory): nothing is lost,
    /// the pool stays asleep with its data on the host and a later restore retries; CUDA errors
    /// of the copies (the pool stays asleep too).
    pub fn restore(&self) -> Result<()> {
        let gate = &self.inner.sleep;
        if gate.phase() == Phase::Offloading && gate.cause() == Some(SleepCause::Ledger) {
            gate.abandon.store(true, Ordering::SeqCst);
        }
        let mut state = gate.hold();
        if state.is_none() {
            return Err(Error::Logic(
                "expandable: restore() of a pool that is awake (no offload() to undo)".into(),
            ));
        }
        let users = gate.cause() == Some(SleepCause::User);
        self.wake_locked(&mut state)?;
        drop(state);
        self.after_wake(users, true);
        Ok(())
    }

    /// After a wake: the user's watcher hears of it where the pool slept for its user, and
    /// where the wake was the user's call (a restore, a wake of any cause or the user's: no
    /// work runs on the pool's memory until it returns) it is a safe point for the spilled
    /// pages ([`promote_at_safe_point`](Self::promote_at_safe_point); a promotion that fails
    /// leaves them on the host). A wake for use (an allocation) is not.
    fn after_wake(&self, users: bool, safe_point: bool) {
        if users {
            self.tell(BackingChange::Wake);
        }
        if safe_point {
            let _ = self.promote_at_safe_point();
        }
    }

    /// Wakes the pool where it sleeps for `cause` (any cause: `None`), after the transition in
    /// flight: an offload for the ledger in flight is abandoned (every byte back where it was);
    /// an offload for the user in flight finishes first. Whether the pool is awake afterwards
    /// (false: it sleeps for another cause).
    ///
    /// # Errors
    /// As [`restore`](Self::restore)'s mapping and copies (the pool stays asleep).
    pub fn wake(&self, cause: Option<SleepCause>) -> Result<bool> {
        let gate = &self.inner.sleep;
        if !gate.asleep() {
            return Ok(true);
        }
        let mine = |now: Option<SleepCause>| cause.is_none() || now == cause;
        if gate.phase() == Phase::Offloading
            && gate.cause() == Some(SleepCause::Ledger)
            && mine(gate.cause())
        {
            gate.abandon.store(true, Ordering::SeqCst);
        }
        let mut state = gate.hold();
        let mut users = false;
        let mut woke = false;
        if state.is_some() && mine(gate.cause()) {
            users = gate.cause() == Some(SleepCause::User);
            self.wake_locked(&mut state)?;
            woke = true;
        }
        drop(state);
        self.after_wake(users, woke && cause != Some(SleepCause::Ledger));
        Ok(!gate.asleep())
    }

    /// Wakes the pool if it sleeps for the ledger (it is about to be used); whether it is
    /// awake afterwards.
    pub fn wake_for_use(&self) -> bool {
        self.wake(Some(SleepCause::Ledger)).unwrap_or(false)
    }

    /// The wake, with the transition lock held; `state` is `Some`. The pool is awake when it
    /// succeeds, asleep with its data on the host when it does not.
    #[allow(unsafe_code)]
    fn wake_locked(&self, state: &mut Option<Box<Saved>>) -> Result<()> {
        let inner = &self.inner;
        let Some(saved) = state.as_mut() else {
            return Ok(());
        };
        // Files of a disk backup that vanished or shrank: refused before a page is mapped.
        saved.host.check()?;
        let started = Instant::now();
        inner.sleep.set_phase(Phase::Waking);
        let moving = Moving::new(&inner.sleep, saved.kept_bytes());
        let unmap_all = |runs: &[(usize, usize)]| {
            for &(addr, len) in runs {
                // SAFETY: mapped by this restore a moment ago; nothing has used them (the
                // pool is asleep: no allocation hands them out), and the copies into them were
                // waited for before this is called.
                let _ = unsafe { inner.vm.unmap(addr, len) };
            }
        };
        let page = inner.vm.page_size();
        let chunks = split_runs(
            &saved.runs,
            inner.vm.map_chunk_bytes().max(page) / page * page,
        );
        // The kept ranges are disjoint and never touch (the offload's range operations merge
        // them), so each is one copy.
        let pieces = &saved.kept;
        let mut next = 0;
        let mut copied = Ok(());
        let mut map_s = 0.0;
        // Map chunk by chunk; the copies into a mapped chunk run (asynchronously on a device)
        // while the next one is mapped.
        for (i, &(addr, len)) in chunks.iter().enumerate() {
            let step = Instant::now();
            let mapped = inner.vm.map(addr, len);
            map_s += step.elapsed().as_secs_f64();
            if let Err(e) = mapped {
                let _ = inner.vm.wait_copies();
                let _ = saved.host.finish(false);
                unmap_all(&chunks[..i]);
                saved.report.failed_restores += 1;
                *inner.sleep.last.lock() = Some(saved.report.clone());
                inner.sleep.set_phase(Phase::Asleep);
                return Err(refused_restore(e, addr, len));
            }
            let end = addr + len;
            while let Some(&(at, size, off)) = pieces.get(next) {
                if at >= end {
                    break;
                }
                if at + size <= addr {
                    next += 1;
                    continue;
                }
                let (lo, hi) = (at.max(addr), (at + size).min(end));
                // SAFETY: `lo .. hi` lies in chunks mapped above and nothing uses them (asleep:
                // allocations are refused, and no block was handed out since the offload); the
                // piece lies inside the copy made at offload, which lives on until after the
                // wait below.
                copied = unsafe {
                    saved.host.copy(
                        inner.vm.as_ref(),
                        Toward::Device,
                        lo,
                        off + (lo - at),
                        hi - lo,
                    )
                };
                if copied.is_err() || at + size > end {
                    break;
                }
                next += 1;
            }
            if copied.is_err() {
                let _ = inner.vm.wait_copies();
                let _ = saved.host.finish(false);
                unmap_all(&chunks[..=i]);
                inner.sleep.set_phase(Phase::Asleep);
                return copied;
            }
        }
        if saved.fill == DiscardFill::Zero {
            for &(addr, size) in &saved.discarded {
                // SAFETY: as for the copies.
                copied = unsafe { inner.vm.fill_zero(addr, size) };
                if copied.is_err() {
                    break;
                }
            }
        }
        let waited = inner.vm.wait_copies();
        let finished = saved.host.finish(false);
        if let Err(e) = copied.and(waited).and(finished) {
            unmap_all(&chunks);
            inner.sleep.set_phase(Phase::Asleep);
            return Err(e);
        }
        let Some(saved) = state.take() else {
            return Ok(());
        };
        let Saved {
            mut host,
            mut report,
            kept,
            ..
        } = *saved;
        let restore_s = started.elapsed().as_secs_f64();
        report.map_s = Some(map_s);
        report.copy_in_s = Some(restore_s - map_s);
        report.restore_s = Some(restore_s);
        *inner.sleep.last.lock() = Some(report);
        match inner.sleep.after_wake() {
            AfterWake::Keep if host.host_bytes() > 0 => {
                *inner.sleep.retained.lock() = Some(Retained { host, kept });
            }
            // Back to the supply (ready for the next sleep) or to the OS; a disk copy's files
            // are removed.
            AfterWake::GiveBack => {
                host.give_back_on_drop();
                drop(host);
            }
            _ => drop(host),
        }
        drop(moving);
        inner.sleep.backing_changed();
        inner.sleep.set_phase(Phase::Awake);
        index::mark_awake(inner.vm.base());
        if let Some(share) = &inner.share {
            share.end_sleep();
        }
        // Pages that became wholly free while asleep (blocks freed then): given back again. A
        // failure leaves them mapped and free (a later trim retries).
        let _ = inner.core.release(0);
        Ok(())
    }
}

/// `runs` cut into pieces of at most `chunk` bytes (whole pages: `chunk` is a multiple of the
/// page size), in order.
fn split_runs(runs: &[(usize, usize)], chunk: usize) -> Vec<(usize, usize)> {
    let chunk = chunk.max(1);
    let mut out = Vec::new();
    for &(addr, len) in runs {
        let mut at = 0;
        while at < len {
            let n = chunk.min(len - at);
            out.push((addr + at, n));
            at += n;
        }
    }
    out
}

/// The error of a restore whose map of `len` bytes at `addr` failed with `e`.
fn refused_restore(e: Error, addr: usize, len: usize) -> Error {
    let text = e.to_string();
    let why = text
        .strip_prefix("std::bad_alloc: out_of_memory: ")
        .unwrap_or(&text);
    let message = format!(
        "expandable: restore could not map {len} bytes at {addr:#x} ({why}); the pool is still \
         asleep with its data on the host: restore() again once the memory is free"
    );
    match e {
        Error::OutOfMemory { .. } => Error::out_of_memory(len, message),
        _ => Error::Logic(message),
    }
}

#[cfg(test)]
mod tests;

/// Lets a published pool's importers attach again when the offload it guards ends with the
/// pool awake (refused, abandoned or undone); a pool left asleep waits for its wake.
struct AwakeAgain<'a>(&'a Inner);

impl Drop for AwakeAgain<'_> {
    fn drop(&mut self) {
        if self.0.sleep.phase() == Phase::Awake {
            if let Some(share) = &self.0.share {
                share.end_sleep();
            }
        }
    }
}
