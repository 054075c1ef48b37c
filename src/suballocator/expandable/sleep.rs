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
//! drop the host copy (or keep it for the next sleep, [`set_retain_host_copy`]), trim the pages
//! freed while asleep, and clear the flag.
//!
//! [`set_retain_host_copy`]: ExpandableMemoryResource::set_retain_host_copy

use super::ExpandableMemoryResource;
use crate::error::{Error, Result};
use crate::report::snapshot::BlockState;
use crate::resource::{CopyFence, HostCopy, MemoryResource, SharedResource};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

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

/// What a sleep frees: before one, what it would do now ([`sleep_estimate`]); after one, what it
/// did ([`SleepReport`]).
///
/// [`sleep_estimate`]: ExpandableMemoryResource::sleep_estimate
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SleepEstimate {
    /// Physical bytes given back to the driver: every mapped page.
    pub released_bytes: usize,
    /// Bytes of live allocations tagged keep: copied to host memory and back.
    pub copied_bytes: usize,
    /// Bytes of live allocations tagged discard: released without a copy.
    pub discarded_bytes: usize,
    /// Bytes of pages wholly inside free blocks: released without a copy.
    pub free_page_bytes: usize,
    /// Live allocations.
    pub live_blocks: usize,
}

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

/// The pool's sleep state, its tags and its records (one per pool).
#[derive(Debug, Default)]
pub(super) struct SleepGate {
    /// Set from the start of an offload to the end of the restore that wakes the pool (shared
    /// with the growth policy, which refuses to map while it is set).
    pub(super) flag: Arc<AtomicBool>,
    /// The sleep record (`Some` while asleep), held through a whole offload or restore.
    state: Mutex<Option<Box<Saved>>>,
    /// Block start -> tag; only [`SleepTag::Discard`] is stored.
    tags: Mutex<HashMap<usize, SleepTag>>,
    /// `tags.len()`, read by frees without the lock.
    tagged: AtomicUsize,
    retain_host: AtomicBool,
    spare: Mutex<Option<HostCopy>>,
    last: Mutex<Option<SleepReport>>,
    sleeps: AtomicUsize,
}

/// A sleeping pool's record.
#[derive(Debug)]
pub(super) struct Saved {
    /// Page runs unmapped (start, bytes), mapped again at restore.
    runs: Vec<(usize, usize)>,
    /// Live blocks at offload (start -> where its bytes are).
    blocks: BTreeMap<usize, SavedBlock>,
    host: HostCopy,
    fill: DiscardFill,
    report: SleepReport,
}

#[derive(Clone, Copy, Debug)]
struct SavedBlock {
    size: usize,
    /// Offset of its bytes in the host copy; `None` when discarded.
    host_offset: Option<usize>,
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
}

/// Joins `(addr, bytes, host offset)` pieces that touch in both spaces into one copy each.
fn coalesce(pieces: impl Iterator<Item = (usize, usize, usize)>) -> Vec<(usize, usize, usize)> {
    let mut out: Vec<(usize, usize, usize)> = Vec::new();
    for (addr, size, off) in pieces {
        match out.last_mut() {
            Some(last) if last.0 + last.1 == addr && last.2 + last.1 == off => last.1 += size,
            _ => out.push((addr, size, off)),
        }
    }
    out
}

/// The live blocks (start, size), the mapped runs and the bytes of whole free pages, from one
/// snapshot of the pool.
struct View {
    live: Vec<(usize, usize)>,
    runs: Vec<(usize, usize)>,
    free_page_bytes: usize,
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

    /// Tags the live allocation that holds `ptr` (any address inside it) `tag`: [`Keep`]
    /// (offloaded and restored, the default) or [`Discard`] (not copied). The tag holds until
    /// the allocation is freed. Returns the allocation's start. Reads one snapshot of the pool
    /// (O(blocks)). Tagging an allocation while another thread frees it is the caller's race (as
    /// any use after free): the tag may outlive it and apply to the next block at that address.
    ///
    /// [`Keep`]: SleepTag::Keep
    /// [`Discard`]: SleepTag::Discard
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when no live allocation of this pool holds `ptr`.
    pub fn tag(&self, ptr: usize, tag: SleepTag) -> Result<usize> {
        // The start of an allocation (the usual case: the pointer handed out) is looked up in
        // the stream lists; an address inside one needs the ordered view of every block.
        let start = if self.inner.core.allocated_at(ptr) {
            ptr
        } else {
            let live = self.view().live;
            let i = live.partition_point(|&(a, _)| a <= ptr);
            match i.checked_sub(1).map(|i| live[i]) {
                Some((a, size)) if ptr < a + size.max(1) => a,
                _ => {
                    return Err(Error::invalid(
                        "ptr",
                        format!("{ptr:#x} is not inside a live allocation of this expandable pool"),
                    ))
                }
            }
        };
        let gate = &self.inner.sleep;
        let mut tags = gate.tags.lock();
        match tag {
            SleepTag::Keep => tags.remove(&start),
            SleepTag::Discard => tags.insert(start, tag),
        };
        gate.tagged.store(tags.len(), Ordering::Release);
        Ok(start)
    }

    /// The tag of the live allocation that starts at `ptr` ([`SleepTag::Keep`] unless tagged).
    pub fn tag_of(&self, ptr: usize) -> SleepTag {
        self.inner
            .sleep
            .tags
            .lock()
            .get(&ptr)
            .copied()
            .unwrap_or_default()
    }

    /// What an [`offload`](Self::offload) now would release, copy and discard (all zero while
    /// asleep: the memory is released already). Reads one snapshot of the pool.
    pub fn sleep_estimate(&self) -> SleepEstimate {
        if self.inner.sleep.asleep() {
            return SleepEstimate::default();
        }
        let view = self.view();
        let tags = self.inner.sleep.tags.lock();
        let mut out = SleepEstimate {
            released_bytes: self.mapped_bytes(),
            free_page_bytes: view.free_page_bytes,
            live_blocks: view.live.len(),
            ..SleepEstimate::default()
        };
        for (addr, size) in view.live {
            match tags.get(&addr).copied().unwrap_or_default() {
                SleepTag::Keep => out.copied_bytes += size,
                SleepTag::Discard => out.discarded_bytes += size,
            }
        }
        out
    }

    /// Whether the pool is asleep (offloaded, not yet restored).
    pub fn asleep(&self) -> bool {
        self.inner.sleep.asleep()
    }

    /// Bytes of host memory holding the pool's data while asleep (0 when awake).
    pub fn host_copy_bytes(&self) -> usize {
        self.inner
            .sleep
            .hold()
            .as_ref()
            .map_or(0, |s| s.host.host_bytes())
    }

    /// The latest sleep's figures and times (`None` before the first offload).
    pub fn last_sleep(&self) -> Option<SleepReport> {
        self.inner.sleep.last.lock().clone()
    }

    /// Whether a restore keeps the host copy for the next offload (default false: the host
    /// memory is given back at wake). Kept, a second sleep of the same size makes no host pages;
    /// [`drop_host_copy`](Self::drop_host_copy) gives it back.
    pub fn set_retain_host_copy(&self, retain: bool) {
        self.inner
            .sleep
            .retain_host
            .store(retain, Ordering::Relaxed);
        if !retain {
            self.drop_host_copy();
        }
    }

    /// Gives back a host copy kept by [`set_retain_host_copy`](Self::set_retain_host_copy);
    /// returns its bytes.
    pub fn drop_host_copy(&self) -> usize {
        self.inner
            .sleep
            .spare
            .lock()
            .take()
            .map_or(0, |h| h.host_bytes())
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
    /// [`Error::Logic`] when the pool is asleep already (offload twice) or its virtual memory
    /// cannot copy; out of host memory for the copy; CUDA errors. On an error the pool is awake
    /// and unchanged, except when the unmapping failed half-way and undoing it failed too: then
    /// it is asleep (the message says so) and [`restore`](Self::restore) retries.
    #[allow(unsafe_code)]
    pub fn offload_with(&self, fill: DiscardFill) -> Result<SleepEstimate> {
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
        // From here on allocations, growth and trims are refused (see the module docs).
        gate.flag.store(true, Ordering::SeqCst);
        let done = self.offload_flagged(&mut state, fill, started, trimmed);
        if done.is_err() && state.is_none() {
            gate.flag.store(false, Ordering::SeqCst);
        }
        done
    }

    /// The offload once the flag is set; `state` is `None` and held.
    #[allow(unsafe_code)]
    fn offload_flagged(
        &self,
        state: &mut Option<Box<Saved>>,
        fill: DiscardFill,
        started: Instant,
        trimmed: usize,
    ) -> Result<SleepEstimate> {
        let inner = &self.inner;
        let gate = &inner.sleep;
        let view = self.view();
        let sync_trim_s = started.elapsed().as_secs_f64();
        let tags = gate.tags.lock().clone();
        let mut blocks = BTreeMap::new();
        let mut copied = 0usize;
        let mut discarded = 0usize;
        for &(addr, size) in &view.live {
            let host_offset = match tags.get(&addr).copied().unwrap_or_default() {
                SleepTag::Keep => {
                    copied += size;
                    Some(copied - size)
                }
                SleepTag::Discard => {
                    discarded += size;
                    None
                }
            };
            blocks.insert(addr, SavedBlock { size, host_offset });
        }
        let step = Instant::now();
        let spare = gate.spare.lock().take();
        let (mut host, host_reused) = match spare {
            Some(h) if h.len() >= copied => (h, true),
            other => {
                drop(other);
                (inner.vm.host_copy(copied)?, false)
            }
        };
        let host_alloc_s = step.elapsed().as_secs_f64();
        let step = Instant::now();
        let host_base = host.addr();
        let page = inner.vm.page_size();
        let chunks = split_runs(
            &view.runs,
            inner.vm.map_chunk_bytes().max(page) / page * page,
        );
        let pieces = coalesce(
            blocks
                .iter()
                .filter_map(|(&a, b)| b.host_offset.map(|o| (a, b.size, o))),
        );
        let mut unmapped = 0;
        let mut unmap_s = 0.0;
        let copied_out =
            self.copy_out_and_unmap(&chunks, &pieces, host_base, &mut unmapped, &mut unmap_s);
        let mut report = SleepReport {
            estimate: SleepEstimate {
                released_bytes: trimmed + view.runs.iter().map(|&(_, len)| len).sum::<usize>(),
                copied_bytes: copied,
                discarded_bytes: discarded,
                free_page_bytes: trimmed,
                live_blocks: view.live.len(),
            },
            sleeps: gate.sleeps.fetch_add(1, Ordering::Relaxed) as u64 + 1,
            host_bytes: host.host_bytes(),
            host_pinned: host.is_pinned(),
            host_reused,
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
                blocks,
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
            blocks,
            host,
            fill,
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
        host_base: usize,
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
                    // SAFETY: `lo .. hi` lies in a block live at the snapshot, so its pages are
                    // mapped (the flag stops growth and trims since before it) and no work is
                    // queued on it (synchronized; offload's contract); the host range lies in
                    // the host copy (`off + size` is at most its length), which nothing else
                    // uses and which outlives the copy (fenced, or waited for on an error).
                    unsafe { vm.copy_out(lo, host_base + off + (lo - at), hi - lo) }?;
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
        let host_base = saved.host.addr();
        let pieces = coalesce(
            saved
                .blocks
                .iter()
                .filter_map(|(&a, b)| b.host_offset.map(|o| (a, b.size, o))),
        );
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
                // SAFETY: `lo .. hi` lies in chunks mapped above and nothing uses them (asleep:
                // allocations are refused, and no block was handed out since the offload); the
                // host range lies inside the copy made at offload, which lives on until after
                // the wait below.
                copied = unsafe { inner.vm.copy_in(lo, host_base + off + (lo - at), hi - lo) };
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
            for (&addr, b) in saved.blocks.iter().filter(|(_, b)| b.host_offset.is_none()) {
                // SAFETY: as for the copies.
                copied = unsafe { inner.vm.fill_zero(addr, b.size) };
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
            host, mut report, ..
        } = *saved;
        let restore_s = started.elapsed().as_secs_f64();
        report.map_s = Some(map_s);
        report.copy_in_s = Some(restore_s - map_s);
        report.restore_s = Some(restore_s);
        *inner.sleep.last.lock() = Some(report);
        if inner.sleep.retain_host.load(Ordering::Relaxed) && host.host_bytes() > 0 {
            *inner.sleep.spare.lock() = Some(host);
        }
        inner.sleep.flag.store(false, Ordering::SeqCst);
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

/// The expandable pools under `mr` (itself, or below its adaptors and suballocators), found
/// without recursion, each once, top first.
///
/// # Errors
/// [`Error::Logic`] naming `mr` when no expandable pool is under it (sleep needs one), or when
/// the stack has a cycle.
pub fn sleep_targets(mr: &SharedResource) -> Result<Vec<ExpandableMemoryResource>> {
    let mut seen = HashSet::new();
    let mut todo = vec![mr.clone()];
    let mut found = Vec::new();
    while let Some(node) = todo.pop() {
        if !seen.insert(node.identity()) {
            continue;
        }
        if seen.len() > 4 * crate::resource::graph::MAX_STACK_DEPTH {
            return Err(Error::Logic(
                "the resource stack is too large to walk".into(),
            ));
        }
        if let Some(pool) = node
            .as_any()
            .and_then(|a| a.downcast_ref::<ExpandableMemoryResource>())
        {
            found.push(pool.clone());
            continue;
        }
        let mut ups = node.upstreams();
        ups.reverse();
        todo.extend(ups);
    }
    if found.is_empty() {
        return Err(Error::Logic(format!(
            "{}: sleep needs a pool on virtual memory, and this stack has none; build it with \
             rrmm.reinitialize(pool_allocator=\"expandable\") or over \
             rrmm.mr.ExpandableMemoryResource",
            mr.name()
        )));
    }
    Ok(found)
}

/// The sleep flags of the expandable pools under `upstream` (none when it has none), for a
/// suballocator built over it: it refuses to hand out its cached blocks while one sleeps.
pub(crate) fn sleep_flags_under(upstream: &SharedResource) -> Vec<Arc<AtomicBool>> {
    sleep_targets(upstream).map_or_else(
        |_| Vec::new(),
        |pools| pools.iter().map(|p| p.inner.sleep.flag.clone()).collect(),
    )
}

/// Offloads every expandable pool under `mr` ([`sleep_targets`]); when one fails, those
/// offloaded before it are restored. Returns the figures summed.
///
/// # Errors
/// As [`sleep_targets`] and [`ExpandableMemoryResource::offload_with`].
pub fn offload(mr: &SharedResource, fill: DiscardFill) -> Result<SleepEstimate> {
    let pools = sleep_targets(mr)?;
    let mut total = SleepEstimate::default();
    for (i, pool) in pools.iter().enumerate() {
        match pool.offload_with(fill) {
            Ok(e) => {
                total.released_bytes += e.released_bytes;
                total.copied_bytes += e.copied_bytes;
                total.discarded_bytes += e.discarded_bytes;
                total.free_page_bytes += e.free_page_bytes;
                total.live_blocks += e.live_blocks;
            }
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

/// Restores every expandable pool under `mr` that is asleep.
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

/// Whether any expandable pool under `mr` is asleep (false when there is none).
pub fn asleep(mr: &SharedResource) -> bool {
    sleep_targets(mr).is_ok_and(|pools| pools.iter().any(|p| p.asleep()))
}

/// [`ExpandableMemoryResource::sleep_estimate`] summed over the pools under `mr`.
///
/// # Errors
/// As [`sleep_targets`].
pub fn sleep_estimate(mr: &SharedResource) -> Result<SleepEstimate> {
    let mut total = SleepEstimate::default();
    for e in sleep_targets(mr)?.iter().map(|p| p.sleep_estimate()) {
        total.released_bytes += e.released_bytes;
        total.copied_bytes += e.copied_bytes;
        total.discarded_bytes += e.discarded_bytes;
        total.free_page_bytes += e.free_page_bytes;
        total.live_blocks += e.live_blocks;
    }
    Ok(total)
}

#[cfg(test)]
mod tests;
