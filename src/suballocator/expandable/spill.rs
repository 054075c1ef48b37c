//! Spilling and promotion: an expandable pool over virtual memory that spills
//! ([`CudaVirtualMemory::with_host_spill`](crate::resource::CudaVirtualMemory::with_host_spill))
//! maps host pages under its own addresses when the device is full, and [`promote`] moves
//! them to device memory at the same addresses once the device has room again: every pointer,
//! CuPy array and PyTorch tensor stays valid, and data read many times is read from device
//! memory after the move instead of over the link on every pass.
//!
//! [`promote`]: ExpandableMemoryResource::promote

use super::ExpandableMemoryResource;
use crate::error::{Error, Result};
use crate::resource::host_pages::mapped::PromoteReport;
use crate::resource::sleep::ByteRange;
use crate::resource::SpillFigures;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// When an expandable pool that spills moves its spilled pages back to the device on its own
/// (none of these where it never spills; [`promote`](ExpandableMemoryResource::promote) any
/// time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AutoPromote {
    /// At the safe points rrmm knows of, where no work runs on the pool's memory by their
    /// contract: its wake from a sleep, a declared rest
    /// ([`promote_at_safe_point`](ExpandableMemoryResource::promote_at_safe_point): rrmm's
    /// `at_rest()`, the ledger's busy declaration, the Dask plugin between tasks). The default.
    #[default]
    SafePoints,
    /// Also after a free that leaves room on the device: the user promises that no work of
    /// another thread runs on the pool's memory while one thread frees (a single-threaded
    /// CuPy pipeline); the promotion synchronizes every stream the pool has seen first.
    Frees,
    /// Only when asked ([`promote`](ExpandableMemoryResource::promote)).
    Off,
}

impl AutoPromote {
    /// Its byte in the movement state.
    pub(super) fn to_u8(self) -> u8 {
        match self {
            AutoPromote::SafePoints => 0,
            AutoPromote::Frees => 1,
            AutoPromote::Off => 2,
        }
    }

    fn from_u8(b: u8) -> Self {
        match b {
            0 => AutoPromote::SafePoints,
            1 => AutoPromote::Frees,
            _ => AutoPromote::Off,
        }
    }
}

impl std::str::FromStr for AutoPromote {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "safe_points" => Ok(AutoPromote::SafePoints),
            "frees" => Ok(AutoPromote::Frees),
            "off" => Ok(AutoPromote::Off),
            other => Err(Error::invalid(
                "auto_promote",
                format!("{other:?} is not \"safe_points\", \"frees\" or \"off\""),
            )),
        }
    }
}

/// While it lives, the virtual memory lends the device pages it unmaps to a promotion; at its
/// end, the pages the promotion did not take are released.
struct Lending<'a>(&'a dyn crate::resource::VirtualMemory);

impl Drop for Lending<'_> {
    fn drop(&mut self) {
        self.0.lend_unmapped(false);
    }
}

impl ExpandableMemoryResource {
    /// When spilled pages move back to the device on their own.
    pub fn auto_promote(&self) -> AutoPromote {
        AutoPromote::from_u8(self.inner.sleep.auto_promote.load(Ordering::Relaxed))
    }

    /// Sets when spilled pages move back to the device on their own ([`AutoPromote`]).
    pub fn set_auto_promote(&self, when: AutoPromote) {
        self.inner
            .sleep
            .promote_tried_at
            .store(0, Ordering::Relaxed);
        self.inner
            .sleep
            .auto_promote
            .store(when.to_u8(), Ordering::Relaxed);
    }

    /// A safe point (no work runs on the pool's memory until this returns, by the caller's
    /// contract): the spilled pages move back to the device as far as it has room, unless
    /// auto promotion is [`AutoPromote::Off`]. Nothing happens (no synchronization) when
    /// nothing has spilled or the pool sleeps.
    ///
    /// # Errors
    /// As [`promote`](Self::promote)'s (pages not moved keep their bytes on the host).
    pub fn promote_at_safe_point(&self) -> Result<PromoteReport> {
        if self.auto_promote() == AutoPromote::Off
            || self.inner.sleep.asleep()
            || !matches!(self.spill_figures(), Some(f) if f.spilled > 0)
        {
            return Ok(PromoteReport::default());
        }
        self.promote(None, None)
    }

    /// After a free, with [`AutoPromote::Frees`]: the spilled pages move back when the free
    /// left the pool a page or more of free memory beyond what the last promotion that moved
    /// nothing found (so a device full of other memory is not tried at every free). Never
    /// beside a transition, never while asleep; a failure leaves the bytes on the host.
    pub(super) fn promote_after_free(&self) {
        let state = &self.inner.sleep;
        if state.auto_promote.load(Ordering::Relaxed) != AutoPromote::Frees.to_u8() {
            return;
        }
        let free = self.inner.core.free_bytes();
        if free < self.page_size()
            || free <= state.promote_tried_at.load(Ordering::Relaxed)
            || state.phase() != crate::resource::sleep::Phase::Awake
            || !matches!(self.spill_figures(), Some(f) if f.spilled > 0)
        {
            return;
        }
        let moved = self.promote(None, None).map_or(0, |r| r.promoted);
        let tried_at = if moved == 0 { free } else { 0 };
        state.promote_tried_at.store(tried_at, Ordering::Relaxed);
    }

    /// The figures of the host pages the pool spills to (`None`: its memory never spills).
    pub fn spill_figures(&self) -> Option<SpillFigures> {
        self.inner.vm.spill_figures()
    }

    /// Bytes of the pool's mapped pages that lie on the host now.
    pub fn spilled_bytes(&self) -> usize {
        self.inner.vm.spilled_runs().iter().map(|&(_, b)| b).sum()
    }

    /// Moves the pool's spilled pages (those in `range` where given: (address, bytes), any
    /// part of a page) to device memory at the same addresses, lowest first, at most `limit`
    /// bytes (rounded up to pages), as far as the device has room. First it synchronizes every
    /// stream the pool has seen, and unmaps free pages, as many as the move lacks room for
    /// (free device pages are the room;
    /// free host pages are kept for the next spill); while the pages move no block is handed
    /// out of the pool's free lists.
    ///
    /// Like a sleep, it moves memory under the users' pointers: call it between phases, with no
    /// work of other threads on the pool's memory until it returns. Nothing happens (no
    /// synchronization) when nothing in the range is spilled.
    ///
    /// # Errors
    /// [`Error::Logic`] while the pool sleeps for its user (one asleep for the ledger wakes
    /// first); CUDA errors of the synchronization, the mapping
    /// or the copies (pages moved before stay moved, the others keep their bytes on the host).
    // The virtual memory's promote is unsafe: this body provides its precondition (below).
    #[allow(unsafe_code)]
    pub fn promote(&self, range: Option<ByteRange>, limit: Option<usize>) -> Result<PromoteReport> {
        let started = Instant::now();
        let inner = &self.inner;
        // A promotion is a use: a pool asleep for the ledger wakes first.
        self.wake_for_use();
        // The transition lock: no sleep, wake or other promotion meanwhile.
        let _transition = inner.sleep.hold();
        if inner.sleep.asleep() {
            return Err(Error::Logic(
                "expandable: promote() of a pool that is asleep; restore() it first".into(),
            ));
        }
        let page = inner.vm.page_size();
        let (lo, hi) = match range {
            Some((addr, bytes)) => (
                addr / page * page,
                addr.saturating_add(bytes)
                    .div_ceil(page)
                    .saturating_mul(page),
            ),
            None => (0, usize::MAX),
        };
        let in_range = |&(addr, bytes): &(usize, usize)| addr < hi && addr + bytes > lo;
        let spilled = inner.vm.spilled_runs();
        if !spilled.iter().any(in_range) {
            return Ok(PromoteReport {
                spilled: spilled.iter().map(|&(_, b)| b).sum(),
                ..PromoteReport::default()
            });
        }
        let mut budget = limit.map_or(usize::MAX, |l| l.div_ceil(page).saturating_mul(page));
        let in_range: usize = spilled
            .iter()
            .map(|&(a, b)| (a + b).min(hi).saturating_sub(a.max(lo)))
            .sum();
        let _moving = super::movement::Moving::new(&inner.sleep, in_range.min(budget));
        let mut trim_s = 0.0;
        let need = in_range.min(budget);
        // Free device pages the trim unmaps are lent to the move where the memory lends them
        // (copied into where they lie, then mapped in place of the host pages: no device
        // memory made, no second mapping), released after it otherwise or when not taken.
        let _lending = Lending(inner.vm.as_ref());
        // Only as many free pages unmapped as the move needs: as many as it lacks room for on
        // the device where the memory does not lend (every free page unmapped took most of a
        // promotion's time: 68 GB to move 23), the whole move where it does. A trim may unmap
        // free host pages too (they make no room): the spilled bytes are counted as if all of
        // them were free.
        let keep = || {
            let mapped = inner.vm.mapped_bytes();
            let room = if inner.vm.lend_unmapped(true) {
                0
            } else {
                inner.vm.memory_info().map_or(0, |(free, _)| free)
            };
            let lack = need
                .saturating_sub(room)
                .div_ceil(page)
                .saturating_mul(page);
            if lack == 0 {
                return mapped;
            }
            let spilled: usize = inner.vm.spilled_runs().iter().map(|&(_, b)| b).sum();
            mapped.saturating_sub(lack.saturating_add(spilled))
        };
        let (trimmed, promoted) = inner.core.trim_then(keep, || {
            trim_s = started.elapsed().as_secs_f64();
            let mut promoted = 0;
            for (addr, bytes) in inner.vm.spilled_runs() {
                let (a, b) = (addr.max(lo), (addr + bytes).min(hi));
                if a >= b {
                    continue;
                }
                let want = (b - a).min(budget);
                if want == 0 {
                    break;
                }
                // SAFETY: every stream was synchronized and the shared free lists are held,
                // so no block is handed out on these pages while they move; work of other
                // threads on the pool's memory is excluded by this method's contract (as an
                // offload's).
                let moved = unsafe { inner.vm.promote(a, want) }?;
                promoted += moved;
                if moved > 0 && promoted == moved {
                    // Once per promotion: device pages replaced host pages under the addresses.
                    inner.sleep.backing_changed();
                }
                budget -= moved;
                if moved < want {
                    break;
                }
            }
            Ok(promoted)
        })?;
        Ok(PromoteReport {
            promoted,
            spilled: self.spilled_bytes(),
            trimmed,
            seconds: started.elapsed().as_secs_f64(),
            trim_s,
        })
    }

    /// Makes host pages for a spill of `bytes` ahead of need, on `threads` threads, and keeps
    /// them (the driver makes them at a few GB/s: make them before the work that spills);
    /// returns the bytes made.
    ///
    /// # Errors
    /// [`Error::Logic`] for a pool whose memory never spills (built without `spill_to_host`:
    /// nothing would ever use the pages); out of memory when the host has no room; CUDA errors.
    pub fn prepare_spill(&self, bytes: usize, threads: usize) -> Result<usize> {
        if !matches!(self.spill_figures(), Some(f) if f.limit > 0) {
            return Err(Error::Logic(format!(
                "prepare_spill({bytes}): this pool never spills to host memory (it was built \
                 without spill_to_host), so no page made now would be used; build it with \
                 ExpandableMemoryResource(..., spill_to_host=SIZE) or \
                 reinitialize(pool_allocator=\"expandable\", spill_to_host=SIZE)"
            )));
        }
        self.inner.vm.prepare_spill(bytes, threads)
    }

    /// Gives the kept spill pages back to the OS until at most `keep` bytes stay kept; returns
    /// the bytes given back.
    pub fn give_back_spill(&self, keep: usize) -> usize {
        self.inner.vm.give_back_spill(keep)
    }
}

#[cfg(test)]
mod tests;
