//! PyTorch-style counters of a pool (`torch.cuda.memory_stats`): allocated and reserved bytes
//! and counts, now, at the peak, and in total; retries, out-of-memory failures, and calls to the
//! upstream.
//!
//! Allocation figures are kept per stream list ([`ListCounters`]: plain integers under the
//! list's own lock, which the allocate and free paths hold anyway), so counting adds no shared
//! cache line and no lock to the fast path; a read sums the lists. Growth, release and failure
//! figures ([`PoolCounters`]) change only on the pool's slow paths, in relaxed atomics.
//!
//! Peaks: each list keeps its own; the reported peak is the sum of the lists' peaks, exact for a
//! pool used from one stream and an upper bound of the true peak when several streams peak at
//! different times (an exact global peak would need a shared counter on every call).

#![deny(unsafe_code)]

use crate::report::{MemoryStats, Stat};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A counter with a peak, in relaxed atomics.
#[derive(Debug, Default)]
struct AtomicStat {
    current: AtomicU64,
    peak: AtomicU64,
    allocated: AtomicU64,
    freed: AtomicU64,
}

impl AtomicStat {
    #[inline]
    fn add(&self, n: u64) {
        let now = self.current.fetch_add(n, Relaxed).wrapping_add(n);
        self.allocated.fetch_add(n, Relaxed);
        if now > self.peak.load(Relaxed) {
            self.peak.fetch_max(now, Relaxed);
        }
    }

    #[inline]
    fn sub(&self, n: u64) {
        self.current.fetch_sub(n, Relaxed);
        self.freed.fetch_add(n, Relaxed);
    }

    fn get(&self) -> Stat {
        Stat {
            current: self.current.load(Relaxed),
            peak: self.peak.load(Relaxed),
            allocated: self.allocated.load(Relaxed),
            freed: self.freed.load(Relaxed),
        }
    }

    fn reset_peak(&self) {
        self.peak.store(self.current.load(Relaxed), Relaxed);
    }
}

/// Allocation figures of one stream list (or one arena), under its own lock.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ListCounters {
    count: i64,
    bytes: i64,
    peak_count: i64,
    peak_bytes: i64,
    allocated_count: u64,
    allocated_bytes: u64,
    freed_count: u64,
    freed_bytes: u64,
}

impl ListCounters {
    /// A block of `size` bytes was handed out through this list.
    #[inline]
    pub(crate) fn allocated(&mut self, size: usize) {
        self.count += 1;
        self.bytes += size as i64;
        self.peak_count = self.peak_count.max(self.count);
        self.peak_bytes = self.peak_bytes.max(self.bytes);
        self.allocated_count += 1;
        self.allocated_bytes += size as u64;
    }

    /// A block of `size` bytes was freed into this list (it may have been allocated through
    /// another, so a list's own figures may go below zero; their sums do not).
    #[inline]
    pub(crate) fn freed(&mut self, size: usize) {
        self.count -= 1;
        self.bytes -= size as i64;
        self.freed_count += 1;
        self.freed_bytes += size as u64;
    }

    /// Frees into this list so far (never goes down).
    #[inline]
    pub(crate) fn frees(&self) -> u64 {
        self.freed_count
    }

    /// Takes in the figures of `other`, a list (an arena) that goes away: its blocks and totals
    /// are kept (the peak as the sum of the peaks, as [`add_to`](Self::add_to) reads them).
    pub(crate) fn absorb(&mut self, other: &ListCounters) {
        self.count += other.count;
        self.bytes += other.bytes;
        self.peak_count += other.peak_count;
        self.peak_bytes += other.peak_bytes;
        self.allocated_count += other.allocated_count;
        self.allocated_bytes += other.allocated_bytes;
        self.freed_count += other.freed_count;
        self.freed_bytes += other.freed_bytes;
    }

    /// Sets the peaks to the current values.
    pub(crate) fn reset_peaks(&mut self) {
        self.peak_count = self.count;
        self.peak_bytes = self.bytes;
    }

    /// Adds this list's figures to `stats`.
    pub(crate) fn add_to(&self, stats: &mut MemoryStats) {
        let add = |stat: &mut Stat, now: i64, peak: i64, allocated: u64, freed: u64| {
            stat.current = stat.current.wrapping_add(now as u64);
            stat.peak = stat.peak.wrapping_add(peak.max(0) as u64);
            stat.allocated += allocated;
            stat.freed += freed;
        };
        add(
            &mut stats.allocation,
            self.count,
            self.peak_count,
            self.allocated_count,
            self.freed_count,
        );
        add(
            &mut stats.allocated_bytes,
            self.bytes,
            self.peak_bytes,
            self.allocated_bytes,
            self.freed_bytes,
        );
    }
}

/// The live counters of one pool; [`PoolCounters::get`] reads them into [`MemoryStats`].
#[derive(Debug, Default)]
pub(super) struct PoolCounters {
    segment: AtomicStat,
    reserved_bytes: AtomicStat,
    retries: AtomicU64,
    ooms: AtomicU64,
    device_alloc: AtomicU64,
    device_free: AtomicU64,
    sync_all: AtomicU64,
}

impl PoolCounters {
    /// A segment of `bytes` was taken from the upstream (or mapped).
    pub(crate) fn segment_added(&self, bytes: usize) {
        self.segment.add(1);
        self.reserved_bytes.add(bytes as u64);
        self.device_alloc.fetch_add(1, Relaxed);
    }

    /// A segment of `bytes` went back to the upstream (or was unmapped).
    pub(crate) fn segment_removed(&self, bytes: usize) {
        self.segment.sub(1);
        self.reserved_bytes.sub(bytes as u64);
        self.device_free.fetch_add(1, Relaxed);
    }

    /// `bytes` were mapped into a segment that grows in place (no new segment).
    pub(crate) fn mapped(&self, bytes: usize) {
        self.reserved_bytes.add(bytes as u64);
        self.device_alloc.fetch_add(1, Relaxed);
    }

    /// `bytes` were unmapped from a segment that grows in place.
    pub(crate) fn unmapped(&self, bytes: usize) {
        self.reserved_bytes.sub(bytes as u64);
        self.device_free.fetch_add(1, Relaxed);
    }

    /// Sets the number of segments (strategies that keep their own, such as mapped runs).
    /// The change counts as segments made or given back, so that made - given back = current
    /// (issue 29: the expandable pool reported one segment, none ever made).
    pub(crate) fn set_segments(&self, n: usize) {
        let n = n as u64;
        let old = self.segment.current.swap(n, Relaxed);
        if n > old {
            self.segment.allocated.fetch_add(n - old, Relaxed);
        } else {
            self.segment.freed.fetch_add(old - n, Relaxed);
        }
        self.segment.peak.fetch_max(n, Relaxed);
    }

    /// An allocation freed cached memory and tried again.
    pub(crate) fn retried(&self) {
        self.retries.fetch_add(1, Relaxed);
    }

    /// An allocation failed with out-of-memory.
    pub(crate) fn out_of_memory(&self) {
        self.ooms.fetch_add(1, Relaxed);
    }

    /// Every stream was synchronized.
    pub(crate) fn synchronized_all(&self) {
        self.sync_all.fetch_add(1, Relaxed);
    }

    /// Sets every peak to its current value (`torch.cuda.reset_peak_memory_stats`).
    pub(crate) fn reset_peaks(&self) {
        for stat in [&self.segment, &self.reserved_bytes] {
            stat.reset_peak();
        }
    }

    /// The pool-wide figures; the allocation ones come from the lists ([`ListCounters::add_to`])
    /// and the `inactive_split` ones from the pool, which knows its blocks.
    pub(crate) fn get(&self) -> MemoryStats {
        MemoryStats {
            allocation: Stat::default(),
            allocated_bytes: Stat::default(),
            segment: self.segment.get(),
            reserved_bytes: self.reserved_bytes.get(),
            inactive_split: 0,
            inactive_split_bytes: 0,
            num_alloc_retries: self.retries.load(Relaxed),
            num_ooms: self.ooms.load(Relaxed),
            num_device_alloc: self.device_alloc.load(Relaxed),
            num_device_free: self.device_free.load(Relaxed),
            num_sync_all_streams: self.sync_all.load(Relaxed),
            offloaded_bytes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_track_current_peak_and_totals() {
        let c = PoolCounters::default();
        c.segment_added(4096);
        let (mut a, mut b) = (ListCounters::default(), ListCounters::default());
        a.allocated(256);
        a.allocated(512);
        a.freed(256);
        b.freed(512);
        let mut s = c.get();
        a.add_to(&mut s);
        b.add_to(&mut s);
        assert_eq!(
            s.allocated_bytes,
            Stat {
                current: 0,
                peak: 768,
                allocated: 768,
                freed: 768
            }
        );
        assert_eq!((s.allocation.current, s.allocation.peak), (0, 2));
        assert_eq!((s.segment.current, s.reserved_bytes.current), (1, 4096));
        assert_eq!(s.num_device_alloc, 1);
        a.reset_peaks();
        let mut s = c.get();
        a.add_to(&mut s);
        assert_eq!(s.allocated_bytes.peak, 512);
        c.segment_removed(4096);
        c.retried();
        c.out_of_memory();
        let s = c.get();
        assert_eq!((s.reserved_bytes.current, s.reserved_bytes.peak), (0, 4096));
        assert_eq!(
            (s.num_device_free, s.num_alloc_retries, s.num_ooms),
            (1, 1, 1)
        );
    }

    #[test]
    fn keys_are_pytorchs() {
        let pairs = MemoryStats::default().to_pairs();
        let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
        for key in [
            "allocated_bytes.all.current",
            "allocated_bytes.all.peak",
            "reserved_bytes.all.allocated",
            "active_bytes.all.freed",
            "inactive_split_bytes.all.current",
            "segment.all.current",
            "allocation.all.peak",
            "num_alloc_retries",
            "num_ooms",
            "num_device_alloc",
            "num_device_free",
        ] {
            assert!(keys.contains(&key), "{key} missing");
        }
        let unique: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len(), "no key twice");
    }
}
