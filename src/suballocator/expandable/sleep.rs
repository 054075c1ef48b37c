//! Sleep and wake for the expandable pool: [`offload`](ExpandableMemoryResource::offload)
//! copies the live blocks' bytes to host memory and gives every mapped page back to the driver,
//! keeping the whole address reservation; [`restore`](ExpandableMemoryResource::restore) maps
//! the same pages at the same addresses and copies the bytes back. Live allocations keep their
//! addresses (CUDA graphs, CuPy arrays, PyTorch tensors stay valid) and their data.
//!
//! # The flag (no lock on the allocation path)
//! `offload` and `restore` run under the pool's sleep mutex; the offload sets an `asleep` flag
//! once it has trimmed the free pages, before it reads the blocks (a successful restore clears
//! it last). An allocation reads the flag before and after the
//! core serves it: refused before ([`Error::Logic`]: "the pool is asleep; restore() first");
//! after, a block the core handed out while a sleep began is freed again and refused too. This
//! is sound because the offload's snapshot locks every stream list and the shared state after
//! setting the flag: a block carved after the snapshot read its list is carved under that list's
//! lock, so its allocation sees the flag; a block carved before is live in the snapshot and is
//! copied (an allocation that returns while a sleep begins on another thread is as one that
//! returned just before it). Growth and the growth policy's trim do nothing while the flag is
//! set, so no page is mapped or unmapped behind the offload's back (the offload trims the free
//! pages itself just before it sets the flag). A free never waits: while asleep the block goes
//! back to the lists (its bytes are copied back at wake all the same, into free memory; its
//! whole pages are given back after the wake).
//!
//! # Offload
//! 1. Synchronize every stream the pool has seen (the context): work queued on the pool's memory
//!    finishes first, so the bytes copied are final (offload waits, it never refuses).
//! 2. Unmap every page wholly inside free blocks (a `trim(0)`): never copied. Set the flag.
//! 3. Copy the live blocks not tagged [`SleepTag::Discard`] (adjacent blocks as one copy) to one
//!    [`HostCopy`] (pinned for a device), then unmap the remaining page runs.
//!
//! # Restore
//! Map the recorded page runs again (all or nothing: on a refusal the runs mapped so far are
//! unmapped again, the pool stays asleep with its bytes on the host, and a later restore retries),
//! copy the kept blocks back, zero the discarded ones when asked ([`DiscardFill::Zero`]), then
//! return the host copy's pages to the process's host page supply, where the next sleep takes
//! them ready (or to the OS, [`set_retain_host_copy`]), trim the pages freed while asleep, and
//! clear the flag.
//!
//! [`set_retain_host_copy`]: ExpandableMemoryResource::set_retain_host_copy

use super::ExpandableMemoryResource;
use crate::error::{Error, Result};
use crate::report::snapshot::BlockState;
use crate::resource::sleep::{self as rs, ByteRange, SleepPlan, Sleeper, Tenant, TenantLookup};
use crate::resource::{CopyFence, HostCopy, MemoryResource, SharedResource};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

pub use crate::resource::sleep::{DiscardFill, SleepEstimate, SleepReport, SleepTag};

/// The pool's sleep state, its tags, its tenants and its records (one per pool).
#[derive(Default)]
pub(super) struct SleepGate {
    /// Set from the start of an offload to the end of the restore that wakes the pool (shared
    /// with the growth policy, which refuses to map while it is set).
    pub(super) flag: Arc<AtomicBool>,
    /// The sleep record (`Some` while asleep), held through a whole offload or restore.
    state: Mutex<Option<Box<Saved>>>,
    /// Blocks tagged discard until freed: start -> bytes (a block of the pool's own, or one a
    /// tenant handed out: exactly its bytes).
    tags: Mutex<HashMap<usize, usize>>,
    /// `tags.len()`, read by frees without the lock.
    tagged: AtomicUsize,
    /// The suballocators over the pool (see `crate::resource::sleep::Tenant`), while they live.
    tenants: Mutex<Vec<Weak<dyn Tenant>>>,
    /// Whether a wake gives the host copy's pages back to the OS instead of to the process's
    /// host page supply (where the next sleep takes them again, ready).
    give_back_host: AtomicBool,
    /// Whether the sleep under way wakes when the pool is next used
    /// ([`SleepPlan::wake_on_use`]).
    wake_on_use: AtomicBool,
    last: Mutex<Option<SleepReport>>,
    sleeps: AtomicUsize,
}

impl std::fmt::Debug for SleepGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SleepGate")
            .field("asleep", &self.asleep())
            .field("tagged", &self.tagged)
            .field("tenants", &self.tenants.lock().len())
            .finish_non_exhaustive()
    }
}

/// A sleeping pool's record.
#[derive(Debug)]
pub(super) struct Saved {
    /// Page runs unmapped (start, bytes), mapped again at restore.
    runs: Vec<(usize, usize)>,
    /// Kept ranges (address, bytes, offset in the host copy), copied back at restore.
    kept: Vec<(usize, usize, usize)>,
    /// Discarded ranges (address, bytes), zeroed at restore when the fill asks.
    discarded: Vec<(usize, usize)>,
    host: HostCopy,
    fill: DiscardFill,
    report: SleepReport,
}

/// The error of an allocation while asleep.
pub(super) fn asleep_error(bytes: usize) -> Error {
    Error::Logic(format!(
        "expandable: the pool is asleep (offloaded to host memory); restore() it first \
         (allocation of {bytes} bytes refused)"
    ))
}

impl SleepGate {
    /// Whether the pool is asleep, or falling asleep or waking (one load).
    #[inline]
    pub(super) fn asleep(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// The sleep record, held: no offload or restore runs meanwhile.
    pub(super) fn hold(&self) -> parking_lot::MutexGuard<'_, Option<Box<Saved>>> {
        self.state.lock()
    }

    /// As [`hold`](Self::hold), `None` when an offload or restore holds it now.
    pub(super) fn try_hold(&self) -> Option<parking_lot::MutexGuard<'_, Option<Box<Saved>>>> {
        self.state.try_lock()
    }

    /// Forgets the tag of the block at `ptr` (it was freed): a later block at that address
    /// starts as keep. A load of one counter when nothing is tagged.
    pub(super) fn forget(&self, ptr: usize) {
        if self.tagged.load(Ordering::Acquire) > 0 {
            let mut tags = self.tags.lock();
            tags.remove(&ptr);
            self.tagged.store(tags.len(), Ordering::Release);
        }
    }

    /// The live tenants' segments (dropped tenants forgotten).
    fn tenant_segments(&self) -> Vec<Vec<crate::report::SegmentInfo>> {
        let mut tenants = self.tenants.lock();
        tenants.retain(|t| t.strong_count() > 0);
        let live: Vec<Arc<dyn Tenant>> = tenants.iter().filter_map(Weak::upgrade).collect();
        drop(tenants);
        live.iter().map(|t| t.segments()).collect()
    }
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
    /// and the plan's `discard`; every live byte with `discard_all`) are discarded, every other
    /// live byte is kept.
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
        CopyPlan {
            kept: rs::subtract(&used, &tagged),
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
        self.set_tag(block, tag);
        Ok(block.0)
    }

    fn set_tag(&self, (start, bytes): (usize, usize), tag: SleepTag) {
        let gate = &self.inner.sleep;
        let mut tags = gate.tags.lock();
        match tag {
            SleepTag::Keep => tags.remove(&start),
            SleepTag::Discard => tags.insert(start, bytes),
        };
        gate.tagged.store(tags.len(), Ordering::Release);
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

    fn estimate_with(&self, plan: &SleepPlan) -> SleepEstimate {
        if self.inner.sleep.asleep() {
            return SleepEstimate::default();
        }
        let view = self.view();
        let plan = self.copy_plan(&view.live, plan);
        SleepEstimate {
            released_bytes: self.mapped_bytes(),
            copied_bytes: rs::total(&plan.kept),
            discarded_bytes: rs::total(&plan.discarded),
            free_page_bytes: view.free_page_bytes,
            cached_free_bytes: plan.cached_free,
            live_blocks: view.live.len(),
        }
    }

    /// Whether the pool is asleep (offloaded, not yet restored).
    pub fn asleep(&self) -> bool {
        self.inner.sleep.asleep()
    }

    /// Bytes of the pool's data held in host memory while asleep (0 when awake, and for
    /// simulated memory, whose pages have no bytes). The host range that holds them may be
    /// larger (a range of the supply made for a larger sleep): [`SleepReport::host_bytes`].
    pub fn host_copy_bytes(&self) -> usize {
        self.inner.sleep.hold().as_ref().map_or(0, |s| {
            let copied: usize = s.kept.iter().map(|&(_, bytes, _)| bytes).sum();
            copied.min(s.host.host_bytes())
        })
    }

    /// The latest sleep's figures and times (`None` before the first offload).
    pub fn last_sleep(&self) -> Option<SleepReport> {
        self.inner.sleep.last.lock().clone()
    }

    /// Whether a restore keeps the host copy's pages for the next offload (default true: they
    /// go back to the process's host page supply, ready, so the next sleep copies at the
    /// link's speed into pages made before; bounded by the supply's keep limit). False gives
    /// them back to the OS at every wake, and gives back the supply's free pages now
    /// ([`drop_host_copy`](Self::drop_host_copy)).
    pub fn set_retain_host_copy(&self, retain: bool) {
        self.inner
            .sleep
            .give_back_host
            .store(!retain, Ordering::Relaxed);
        if !retain {
            self.drop_host_copy();
        }
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
        let Some(spec) = vm.host_pages()? else {
            return Ok(0);
        };
        let bytes = self.mapped_bytes();
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
        vm.host_pages()?;
        let ready = &self.inner.ready_ahead;
        ready.on.store(on, Ordering::Relaxed);
        if !on {
            ready.prepared_for.store(0, Ordering::Relaxed);
            return Ok(0);
        }
        Ok(ready.keep_up(vm.as_ref(), self.mapped_bytes()))
    }

    /// Gives the host pages kept for the next sleep back to the OS (the free pages of the
    /// supply this pool's sleeps take from); returns their bytes.
    pub fn drop_host_copy(&self) -> usize {
        self.inner.vm.host_supply().give_back(0)
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
    /// sleep only. A suballocator's chunk over the pool is copied as its live blocks (its free
    /// ranges are not copied); a tagged block's bytes exactly are not copied.
    ///
    /// # Errors
    /// [`Error::Logic`] when the pool is asleep already (offload twice) or its virtual memory
    /// cannot copy; out of host memory for the copy; CUDA errors. On an error the pool is awake
    /// and unchanged, except when the unmapping failed half-way and undoing it failed too: then
    /// it is asleep (the message says so) and [`restore`](Self::restore) retries.
    pub fn offload_plan(&self, plan: &SleepPlan) -> Result<SleepEstimate> {
        let inner = &self.inner;
        let gate = &inner.sleep;
        let mut state = gate.hold();
        if state.is_some() {
            return Err(Error::Logic(
                "expandable: offload() of a pool that is asleep already; restore() it first".into(),
            ));
        }
        let started = Instant::now();
        inner.events.synchronize_all()?;
        let trimmed = inner.core.release(0)?;
        // From here on allocations, growth and trims are refused (see the module docs), here
        // and in every suballocator over the pool; copies of its memory too.
        gate.wake_on_use.store(plan.wake_on_use, Ordering::SeqCst);
        gate.flag.store(true, Ordering::SeqCst);
        let waker = plan
            .wake_on_use
            .then(|| Arc::new(self.clone()) as Arc<dyn Sleeper>);
        rs::mark_asleep(
            inner.vm.base(),
            inner.vm.reserved_bytes(),
            "expandable",
            waker,
        );
        let done = self.offload_flagged(&mut state, plan, started, trimmed);
        if done.is_err() && state.is_none() {
            gate.flag.store(false, Ordering::SeqCst);
            rs::mark_awake(inner.vm.base());
        }
        done
    }

    /// The offload once the flag is set; `state` is `None` and held.
    fn offload_flagged(
        &self,
        state: &mut Option<Box<Saved>>,
        plan: &SleepPlan,
        started: Instant,
        trimmed: usize,
    ) -> Result<SleepEstimate> {
        let inner = &self.inner;
        let gate = &inner.sleep;
        let view = self.view();
        let copy = self.copy_plan(&view.live, plan);
        let sync_trim_s = started.elapsed().as_secs_f64();
        let mut kept = Vec::with_capacity(copy.kept.len());
        let mut copied = 0usize;
        for &(addr, size) in &copy.kept {
            kept.push((addr, size, copied));
            copied += size;
        }
        let step = Instant::now();
        let host = HostCopy::take(inner.vm.host_supply(), inner.vm.host_pages()?, copied)?;
        let host_reused = host.was_ready();
        let host_alloc_s = step.elapsed().as_secs_f64();
        let step = Instant::now();
        let page = inner.vm.page_size();
        let chunks = split_runs(
            &view.runs,
            inner.vm.map_chunk_bytes().max(page) / page * page,
        );
        let mut unmapped = 0;
        let mut unmap_s = 0.0;
        let copied_out =
            self.copy_out_and_unmap(&chunks, &kept, &host, &mut unmapped, &mut unmap_s);
        let mut report = SleepReport {
            estimate: SleepEstimate {
                released_bytes: trimmed + view.runs.iter().map(|&(_, len)| len).sum::<usize>(),
                copied_bytes: copied,
                discarded_bytes: rs::total(&copy.discarded),
                free_page_bytes: trimmed,
                cached_free_bytes: copy.cached_free,
                live_blocks: view.live.len(),
            },
            sleeps: gate.sleeps.fetch_add(1, Ordering::Relaxed) as u64 + 1,
            host_bytes: host.host_bytes(),
            host_pinned: host.is_pinned(),
            host_reused,
            host_ranges: host.ranges(),
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
            // Undo: the chunks unmapped so far are a sleep of their own; wake it.
            *state = Some(Box::new(Saved {
                runs: chunks[..unmapped].to_vec(),
                kept,
                discarded: Vec::new(),
                host,
                fill: DiscardFill::Undefined,
                report,
            }));
            return match self.wake_locked(state) {
                Ok(()) => Err(e),
                Err(again) => Err(Error::Logic(format!(
                    "expandable: offload failed half-way ({e}) and mapping back failed \
                     ({again}): the pool is asleep with its data on the host; restore() \
                     again once memory is free"
                ))),
            };
        }
        report.offload_s = started.elapsed().as_secs_f64();
        let estimate = report.estimate;
        *gate.last.lock() = Some(report.clone());
        *state = Some(Box::new(Saved {
            runs: view.runs,
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
                // the flag), and the pages are mapped again before any allocation is handed out.
                unsafe { vm.unmap(addr, len) }?;
                *unmap_s += step.elapsed().as_secs_f64();
                *unmapped += 1;
            }
            Ok(())
        };
        let mut next = 0;
        for &(addr, len) in chunks {
            let end = addr + len;
            while let Some(&(at, size, off)) = pieces.get(next) {
                if at >= end {
                    break;
                }
                if at + size > addr {
                    let (lo, hi) = (at.max(addr), (at + size).min(end));
                    let mut dev = lo;
                    for (to, n) in host.spans(off + (lo - at), hi - lo) {
                        // SAFETY: `dev .. dev + n` lies in a block live at the snapshot, so its
                        // pages are mapped (the flag stops growth and trims since before it)
                        // and no work is queued on it (synchronized; offload's contract); the
                        // host piece lies in the host copy (`off + size` is at most its
                        // length), which nothing else uses and which outlives the copy
                        // (fenced, or waited for on an error).
                        unsafe { vm.copy_out(dev, to, n) }?;
                        dev += n;
                    }
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
        Ok(())
    }

    /// Wakes the pool: maps its pages again at the same addresses, copies the kept allocations
    /// back and zeroes the discarded ones when the offload asked, and releases the host copy.
    ///
    /// # Errors
    /// [`Error::Logic`] when the pool is awake (restore without offload); out of memory when the
    /// driver cannot map the pages again (another process took the memory): nothing is lost,
    /// the pool stays asleep with its data on the host and a later restore retries; CUDA errors
    /// of the copies (the pool stays asleep too).
    pub fn restore(&self) -> Result<()> {
        let mut state = self.inner.sleep.hold();
        if state.is_none() {
            return Err(Error::Logic(
                "expandable: restore() of a pool that is awake (no offload() to undo)".into(),
            ));
        }
        self.wake_locked(&mut state)
    }

    /// Wakes the pool if it sleeps until used ([`SleepPlan::wake_on_use`]); whether it is awake
    /// afterwards.
    pub fn wake_for_use(&self) -> bool {
        let gate = &self.inner.sleep;
        if !gate.asleep() {
            return true;
        }
        if !gate.wake_on_use.load(Ordering::Acquire) {
            return false;
        }
        let mut state = gate.hold();
        if state.is_some() {
            let _ = self.wake_locked(&mut state);
        }
        !gate.asleep()
    }

    /// The restore, with the sleep record held; `state` is `Some`. Clears the flag when it
    /// succeeds.
    #[allow(unsafe_code)]
    fn wake_locked(&self, state: &mut Option<Box<Saved>>) -> Result<()> {
        let inner = &self.inner;
        let Some(saved) = state.as_mut() else {
            return Ok(());
        };
        let started = Instant::now();
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
                unmap_all(&chunks[..i]);
                saved.report.failed_restores += 1;
                *inner.sleep.last.lock() = Some(saved.report.clone());
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
                let mut dev = lo;
                for (from, n) in saved.host.spans(off + (lo - at), hi - lo) {
                    // SAFETY: `dev .. dev + n` lies in chunks mapped above and nothing uses
                    // them (asleep: allocations are refused, and no block was handed out since
                    // the offload); the host piece lies inside the copy made at offload, which
                    // lives on until after the wait below.
                    copied = unsafe { inner.vm.copy_in(dev, from, n) };
                    if copied.is_err() {
                        break;
                    }
                    dev += n;
                }
                if copied.is_err() || at + size > end {
                    break;
                }
                next += 1;
            }
            if copied.is_err() {
                let _ = inner.vm.wait_copies();
                unmap_all(&chunks[..=i]);
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
        if let Err(e) = copied.and(waited) {
            unmap_all(&chunks);
            return Err(e);
        }
        let Some(saved) = state.take() else {
            return Ok(());
        };
        let Saved {
            mut host,
            mut report,
            ..
        } = *saved;
        let restore_s = started.elapsed().as_secs_f64();
        report.map_s = Some(map_s);
        report.copy_in_s = Some(restore_s - map_s);
        report.restore_s = Some(restore_s);
        *inner.sleep.last.lock() = Some(report);
        if inner.sleep.give_back_host.load(Ordering::Relaxed) {
            host.give_back_on_drop();
        }
        // Back to the supply (ready for the next sleep) or to the OS.
        drop(host);
        inner.sleep.wake_on_use.store(false, Ordering::SeqCst);
        inner.sleep.flag.store(false, Ordering::SeqCst);
        rs::mark_awake(inner.vm.base());
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

impl Sleeper for ExpandableMemoryResource {
    fn identity(&self) -> usize {
        MemoryResource::identity(self)
    }

    fn asleep(&self) -> bool {
        self.inner.sleep.asleep()
    }

    fn admit(&self, tenant: Weak<dyn Tenant>) {
        let mut tenants = self.inner.sleep.tenants.lock();
        tenants.retain(|t| t.strong_count() > 0);
        tenants.push(tenant);
    }

    fn block_at(&self, addr: usize) -> Option<(usize, usize)> {
        self.live_block_at(addr)
    }

    fn tag(&self, block: (usize, usize), tag: SleepTag) {
        self.set_tag(block, tag);
    }

    fn forget(&self, addr: usize) {
        self.inner.sleep.forget(addr);
    }

    fn offload(&self, plan: &SleepPlan) -> Result<SleepEstimate> {
        self.offload_plan(plan)
    }

    fn restore(&self) -> Result<()> {
        ExpandableMemoryResource::restore(self)
    }

    fn wake_for_use(&self) -> bool {
        ExpandableMemoryResource::wake_for_use(self)
    }

    fn prepare(&self) -> Result<usize> {
        self.prepare_sleep()
    }

    fn keep_ready(&self, on: bool) -> Result<usize> {
        self.keep_sleep_ready(on)
    }

    fn promote(
        &self,
        range: Option<ByteRange>,
        limit: Option<usize>,
    ) -> Result<crate::resource::host_spill::PromoteReport> {
        ExpandableMemoryResource::promote(self, range, limit)
    }

    fn spill_figures(&self) -> Option<crate::resource::SpillFigures> {
        ExpandableMemoryResource::spill_figures(self)
    }

    fn estimate(&self, plan: &SleepPlan) -> SleepEstimate {
        self.estimate_with(plan)
    }
}

/// The pools that can sleep under `mr` (itself, or below its adaptors and suballocators), from
/// its link, top first.
///
/// # Errors
/// [`Error::Logic`] naming `mr` when no pool under it can sleep.
pub fn sleep_targets(mr: &SharedResource) -> Result<Vec<Arc<dyn Sleeper>>> {
    let link = mr.link();
    if link.sleep.is_empty() {
        return Err(Error::Logic(format!(
            "{}: sleep needs a pool on virtual memory, and this stack has none; build it with \
             rrmm.reinitialize(pool_allocator=\"expandable\") or over \
             rrmm.mr.ExpandableMemoryResource",
            mr.name()
        )));
    }
    Ok(link.sleep.sleepers().to_vec())
}

/// Resolves `discard` (addresses with the buffer's size where known) to the exact blocks of the
/// pools under `mr`: each pool's own share of a [`SleepPlan`]. Nothing is tagged.
///
/// # Errors
/// As [`Link::block_for_tag`](crate::resource::Link::block_for_tag), for the first address no
/// pool holds.
pub fn plan_discards(
    mr: &SharedResource,
    discard: &[(usize, Option<usize>)],
) -> Result<Vec<(usize, usize)>> {
    let link = mr.link();
    discard
        .iter()
        .map(|&(ptr, size)| link.block_for_tag(ptr, size).map(|(block, _)| block))
        .collect()
}

/// Tags the block of `ptr` (with the buffer's `size` where known) `tag` in the pool under `mr`
/// that holds it; returns the block's start.
///
/// # Errors
/// As [`Link::block_for_tag`](crate::resource::Link::block_for_tag).
pub fn tag(mr: &SharedResource, ptr: usize, size: Option<usize>, tag: SleepTag) -> Result<usize> {
    let link = mr.link();
    let (block, pool) = link.block_for_tag(ptr, size)?;
    pool.tag(block, tag);
    Ok(block.0)
}

/// Offloads every pool under `mr` that can sleep with `plan` (its fill, this sleep's `discard`
/// ranges from [`plan_discards`], or `discard_all`); when one fails, those offloaded before it
/// are restored. Returns the figures summed.
///
/// # Errors
/// As [`sleep_targets`] and [`ExpandableMemoryResource::offload_plan`].
pub fn offload_discarding(mr: &SharedResource, plan: SleepPlan) -> Result<SleepEstimate> {
    let pools = sleep_targets(mr)?;
    let mut total = SleepEstimate::default();
    for (i, pool) in pools.iter().enumerate() {
        match pool.offload(&plan) {
            Ok(e) => total = total.plus(e),
            Err(e) => {
                for done in &pools[..i] {
                    let _ = done.restore();
                }
                return Err(e);
            }
        }
    }
    Ok(total)
}

/// [`offload_discarding`] with the persistent tags only.
///
/// # Errors
/// As [`offload_discarding`].
pub fn offload(mr: &SharedResource, fill: DiscardFill) -> Result<SleepEstimate> {
    offload_discarding(mr, SleepPlan::with_fill(fill))
}

/// Restores every pool under `mr` that is asleep.
///
/// # Errors
/// As [`sleep_targets`]; [`Error::Logic`] when none is asleep; the first restore's error (the
/// others are still tried, so one refusal leaves only its pool asleep).
pub fn restore(mr: &SharedResource) -> Result<()> {
    let pools = sleep_targets(mr)?;
    let mut first = None;
    let mut any = false;
    for pool in pools.iter().filter(|p| p.asleep()) {
        any = true;
        if let Err(e) = pool.restore() {
            first.get_or_insert(e);
        }
    }
    if !any {
        return Err(Error::Logic(format!(
            "{}: restore() of a pool that is awake (no offload() to undo)",
            mr.name()
        )));
    }
    first.map_or(Ok(()), Err)
}

/// Makes the host pages of the next sleep of every pool under `mr` ready ahead of need, in the
/// background ([`ExpandableMemoryResource::prepare_sleep`]); returns the bytes asked for.
///
/// # Errors
/// As [`sleep_targets`]; where a pool's memory cannot be copied to the host.
pub fn prepare(mr: &SharedResource) -> Result<usize> {
    sleep_targets(mr)?
        .iter()
        .try_fold(0usize, |sum, p| Ok(sum + p.prepare()?))
}

/// Keeps the next sleep's host pages ready as every pool under `mr` grows (`on`)
/// ([`ExpandableMemoryResource::keep_sleep_ready`]); returns the bytes asked for now.
///
/// # Errors
/// As [`sleep_targets`]; where a pool's memory cannot be copied to the host.
pub fn keep_ready(mr: &SharedResource, on: bool) -> Result<usize> {
    sleep_targets(mr)?
        .iter()
        .try_fold(0usize, |sum, p| Ok(sum + p.keep_ready(on)?))
}

/// Moves the pages spilled to the host of every pool under `mr` (those in `range` where
/// given) back to device memory at the same addresses, at most `limit` bytes in all
/// ([`ExpandableMemoryResource::promote`]); the figures summed. A stack with no pool on
/// virtual memory has nothing spilled: an empty report.
///
/// # Errors
/// As [`ExpandableMemoryResource::promote`].
pub fn promote(
    mr: &SharedResource,
    range: Option<ByteRange>,
    limit: Option<usize>,
) -> Result<crate::resource::host_spill::PromoteReport> {
    let mut total = crate::resource::host_spill::PromoteReport::default();
    let mut budget = limit;
    for pool in mr.link().sleep.sleepers() {
        let report = pool.promote(range, budget)?;
        budget = budget.map(|b| b.saturating_sub(report.promoted));
        total = total.plus(report);
    }
    Ok(total)
}

/// The spill figures summed over the pools under `mr` that spill to host pages; `None` where
/// none does.
pub fn spill_figures(mr: &SharedResource) -> Option<crate::resource::SpillFigures> {
    mr.link()
        .sleep
        .sleepers()
        .iter()
        .filter_map(|p| p.spill_figures())
        .reduce(crate::resource::SpillFigures::plus)
}

/// Whether any pool under `mr` is asleep (false when there is none).
pub fn asleep(mr: &SharedResource) -> bool {
    mr.link().asleep()
}

/// The sleep estimate summed over the pools under `mr`.
///
/// # Errors
/// As [`sleep_targets`].
pub fn sleep_estimate(mr: &SharedResource) -> Result<SleepEstimate> {
    Ok(sleep_targets(mr)?
        .iter()
        .map(|p| p.estimate(&SleepPlan::default()))
        .fold(SleepEstimate::default(), SleepEstimate::plus))
}

#[cfg(test)]
mod tests;
