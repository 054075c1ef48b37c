//! What a sleep keeps, and where: the host copy's pages (the memory's own kind, or plain
//! pageable pages), where they go at the wake ([`AfterWake`]: to the supply, to the OS, or kept
//! with the pool and readable), a disk backup's files, the bytes of an address range in the
//! copy (an engine's `get_cpu_backup`), and the pool's count and watcher of changes of the
//! physical memory behind its addresses.

use super::movement::MovementState;
use super::ExpandableMemoryResource;
use crate::error::Result;
use crate::resource::host_pages::disk::DiskCopy;
use crate::resource::sleep::{AfterWake, BackingChange, BackingWatcher, SleepPlan};
use crate::resource::HostCopy;
use std::sync::atomic::Ordering;

/// A disk backup's file holds at least this many bytes before the next live block starts a
/// file of its own (so a pool of many small blocks makes few files).
const MIN_FILE_BYTES: usize = 1 << 20;

/// The offset in the copy of the bytes `ptr .. ptr + bytes`, where one kept range of `kept`
/// (address, bytes, offset) holds them all.
fn locate(kept: &[(usize, usize, usize)], ptr: usize, bytes: usize) -> Option<usize> {
    let i = kept
        .partition_point(|&(at, _, _)| at <= ptr)
        .checked_sub(1)?;
    let (at, size, off) = kept[i];
    let end = ptr.checked_add(bytes)?;
    (ptr < at + size && end <= at + size).then_some(off + (ptr - at))
}

/// The lengths of a disk backup's files: the kept ranges cut where a live block starts, once
/// the file so far holds [`MIN_FILE_BYTES`].
fn file_lengths(kept: &[(usize, usize, usize)], live: &[(usize, usize)]) -> Vec<usize> {
    let mut out = Vec::new();
    for &(at, size, _) in kept {
        let end = at + size;
        let mut start = at;
        let first = live.partition_point(|&(a, _)| a <= at);
        for &(a, _) in &live[first..] {
            if a >= end {
                break;
            }
            if a - start >= MIN_FILE_BYTES {
                out.push(a - start);
                start = a;
            }
        }
        out.push(end - start);
    }
    out
}

impl MovementState {
    /// Runs `f` on the copy holding the pool's bytes now and its kept ranges: the sleep's while
    /// asleep, else the one kept with the pool after its wake; `None` when there is none. Holds
    /// the transition lock meanwhile (waits for a transition in flight).
    fn with_copy<T>(
        &self,
        f: impl FnOnce(&[(usize, usize, usize)], &HostCopy) -> Option<T>,
    ) -> Option<T> {
        let state = self.hold();
        if let Some(saved) = state.as_ref() {
            return f(&saved.kept, &saved.host);
        }
        let retained = self.retained.lock();
        retained.as_ref().and_then(|r| f(&r.kept, &r.host))
    }
}

impl ExpandableMemoryResource {
    /// Where a wake puts the host copy: back to the process's supply (the default), to the OS,
    /// or kept with the pool ([`AfterWake`]).
    pub fn set_host_copy_after_wake(&self, after: AfterWake) {
        self.inner
            .sleep
            .after_wake
            .store(after.to_u8(), Ordering::Relaxed);
    }

    /// Where a wake puts the host copy now.
    pub fn host_copy_after_wake(&self) -> AfterWake {
        self.inner.sleep.after_wake()
    }

    /// Whether a restore keeps the host copy's pages for the next offload (default true: they
    /// go back to the process's host page supply, ready, so the next sleep copies at the
    /// link's speed into pages made before; bounded by the supply's keep limit). False gives
    /// them back to the OS at every wake ([`AfterWake::GiveBack`]), and gives back the
    /// supply's free pages and a copy kept with the pool now
    /// ([`drop_host_copy`](Self::drop_host_copy)).
    pub fn set_retain_host_copy(&self, retain: bool) {
        self.set_host_copy_after_wake(match retain {
            true => AfterWake::Supply,
            false => AfterWake::GiveBack,
        });
        if !retain {
            self.drop_host_copy();
        }
    }

    /// Gives the host pages kept for the next sleep back to the OS (the free pages of the
    /// supply this pool's sleeps take from, and a copy kept with the pool); returns their
    /// bytes.
    pub fn drop_host_copy(&self) -> usize {
        let kept = self.inner.sleep.retained.lock().take();
        let mut given = 0;
        if let Some(mut r) = kept {
            given += r.host.host_bytes();
            r.host.give_back_on_drop();
        }
        given + self.inner.vm.host_supply().give_back(0)
    }

    /// Copies to plain pageable host pages (`true`) instead of the memory's own kind (pinned
    /// for a device: page-locked, copied at the link's speed). Plain pages are reclaimable by
    /// the OS while they hold nothing and are given back at the wake like any others; a
    /// device copies them at the pageable speed. The pages kept ready for the next sleep are of
    /// the same kind. Nothing changes for memory whose pages have no bytes (simulated).
    pub fn set_pageable_host_copy(&self, pageable: bool) {
        self.inner
            .ready_ahead
            .pageable
            .store(pageable, Ordering::Relaxed);
    }

    /// The host copy of the next sleep: files for a disk backup ([`SleepPlan::disk`]), else
    /// the copy kept with the pool where it holds `copied` bytes of the pool's kind of pages,
    /// else pages of the supply; and whether its pages were ready. A copy kept with the pool
    /// that does not serve goes back to the supply.
    pub(super) fn take_host_copy(
        &self,
        plan: &SleepPlan,
        kept: &[(usize, usize, usize)],
        live: &[(usize, usize)],
        copied: usize,
    ) -> Result<(HostCopy, bool)> {
        let inner = &self.inner;
        let retained = inner.sleep.retained.lock().take();
        if let Some(target) = &plan.disk {
            drop(retained);
            let Some(spec) = inner.vm.host_pages()? else {
                return Ok((HostCopy::Nothing(copied), false));
            };
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let name = format!(
                "rrmm-backup-{}-{:x}-{stamp:x}",
                std::process::id(),
                inner.vm.base()
            );
            let lengths = file_lengths(kept, live);
            let files = DiskCopy::create(target, inner.vm.host_supply(), spec, &name, &lengths)?;
            return Ok((HostCopy::OnDisk(Box::new(files)), false));
        }
        let spec = inner.ready_ahead.spec(inner.vm.as_ref())?;
        if let Some(r) = retained {
            if r.host.serves(spec, copied) {
                return Ok((r.host, true));
            }
        }
        let host = HostCopy::take(inner.vm.host_supply(), spec, copied)?;
        let ready = host.was_ready();
        Ok((host, ready))
    }

    /// The host addresses `(address, bytes)` that hold the pool's bytes `ptr .. ptr + bytes`
    /// (one piece unless the copy spans two ranges there): while the pool is asleep, in the
    /// sleep's host copy; while awake, in a copy kept with the pool ([`AfterWake::Keep`]), as
    /// of its last sleep. `None` when no host copy holds them all (awake with none kept, a
    /// block that was discarded or freed before the sleep, a disk backup, simulated memory).
    /// The addresses are valid until the next wake (or, for a kept copy, the next sleep):
    /// reading them later is a use after free. Waits for a transition in flight.
    pub fn host_copy_of(&self, ptr: usize, bytes: usize) -> Option<Vec<(usize, usize)>> {
        self.inner
            .sleep
            .with_copy(|kept, host| host.host_spans(locate(kept, ptr, bytes)?, bytes))
    }

    /// Copies the pool's bytes `ptr .. ptr + out.len()` from its host copy (as
    /// [`host_copy_of`](Self::host_copy_of) finds them) into `out`, under the transition lock
    /// (no wake frees the copy meanwhile); whether a host copy held them.
    pub fn read_host_copy(&self, ptr: usize, out: &mut [u8]) -> bool {
        self.inner
            .sleep
            .with_copy(|kept, host| {
                let off = locate(kept, ptr, out.len())?;
                host.read(off, out).then_some(())
            })
            .is_some()
    }

    /// How many times the physical memory behind the pool's addresses changed (every sleep,
    /// wake and promotion that moved pages, whoever asked): code that registered the memory
    /// with another library compares it with the count it registered at.
    pub fn backing_changes(&self) -> u64 {
        self.inner.sleep.backing_changes.load(Ordering::Acquire)
    }

    /// Sets the pool's watcher of the user's sleeps and wakes (`None`: none): called with
    /// [`BackingChange::Sleep`] and the pool's address range before a sleep asked by the user
    /// (an offload, a stack's sleep, an engine's pause) unmaps it, and with
    /// [`BackingChange::Wake`] after a wake of such a sleep mapped it again, or after such a
    /// sleep was refused (the pages unchanged). Called with no lock of the pool held, on the
    /// transition's thread; it may call into rrmm but must not start a transition of this pool.
    /// The shared-GPU ledger's sleeps and the wakes when such memory is used (they may run
    /// inside an allocation) are not told: they count in [`backing_changes`](Self::backing_changes).
    pub fn set_backing_watcher(&self, watcher: Option<BackingWatcher>) {
        *self.inner.sleep.watcher.lock() = watcher;
    }

    /// Tells the watcher of `change` of the pool's whole range (no lock held).
    pub(super) fn tell(&self, change: BackingChange) {
        let vm = &self.inner.vm;
        self.inner
            .sleep
            .tell(change, vm.base(), vm.reserved_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_found_in_one_kept_range_only() {
        let kept = [(100, 50, 0), (200, 10, 50)];
        assert_eq!(locate(&kept, 100, 50), Some(0));
        assert_eq!(locate(&kept, 120, 5), Some(20));
        assert_eq!(locate(&kept, 205, 5), Some(55));
        assert_eq!(locate(&kept, 205, 6), None, "past its end");
        assert_eq!(locate(&kept, 140, 70), None, "across two");
        assert_eq!(locate(&kept, 99, 1), None, "before");
        assert_eq!(locate(&kept, 150, 0), None, "at the end");
        assert_eq!(locate(&kept, usize::MAX, 2), None);
    }

    #[test]
    fn files_are_cut_at_live_blocks_once_they_hold_a_megabyte() {
        const M: usize = MIN_FILE_BYTES;
        let kept = [(0, 3 * M, 0), (10 * M, 100, 3 * M)];
        let live = [(0, M), (M, 10), (M + 10, 2 * M - 10), (10 * M, 100)];
        assert_eq!(file_lengths(&kept, &live), vec![M, 2 * M, 100]);
        assert!(file_lengths(&[], &live).is_empty());
    }
}
