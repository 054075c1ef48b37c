//! PyTorch-style counters of a pool (`torch.cuda.memory_stats`): allocated, requested and
//! reserved bytes and counts, now, at the peak, and in total; retries, out-of-memory failures,
//! and calls to the upstream.
//!
//! The counters are relaxed atomics updated beside the pool's own bookkeeping: an allocate or a
//! free adds to four of them and reads a peak (a `fetch_max` only when the peak moves), so no
//! lock is taken for them. Growth and release figures change only on the pool's rare paths.

#![deny(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One PyTorch figure: its value now, its peak, and what was added and removed in total.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// The value now.
    pub current: u64,
    /// The highest value since creation or the last peak reset.
    pub peak: u64,
    /// Everything ever added.
    pub allocated: u64,
    /// Everything ever removed.
    pub freed: u64,
}

/// A pool's figures in PyTorch's terms (`torch.cuda.memory_stats()` keys, pool "all").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Live allocations (`allocation.all.*`; `active.all.*` is the same here).
    pub allocation: Stat,
    /// Bytes of live blocks, 256-byte rounded (`allocated_bytes.all.*`, `active_bytes.all.*`).
    pub allocated_bytes: Stat,
    /// Bytes the callers asked for (`requested_bytes.all.*`).
    pub requested_bytes: Stat,
    /// Chunks held from the upstream (`segment.all.*`); for the expandable pool, `current` and
    /// `peak` count runs of mapped pages and the totals stay 0.
    pub segment: Stat,
    /// Bytes held from the upstream or mapped (`reserved_bytes.all.*`).
    pub reserved_bytes: Stat,
    /// Free blocks inside segments that are in use (`inactive_split.all.current`).
    pub inactive_split: u64,
    /// Bytes of those blocks (`inactive_split_bytes.all.current`).
    pub inactive_split_bytes: u64,
    /// Allocations that had to free cached memory and try again (`num_alloc_retries`).
    pub num_alloc_retries: u64,
    /// Allocations that failed with out-of-memory (`num_ooms`).
    pub num_ooms: u64,
    /// Successful upstream allocations, or growth steps that mapped pages (`num_device_alloc`).
    pub num_device_alloc: u64,
    /// Upstream frees, or trims that unmapped pages (`num_device_free`).
    pub num_device_free: u64,
    /// Times every stream was synchronized (`num_sync_all_streams`).
    pub num_sync_all_streams: u64,
}

impl MemoryStats {
    /// The figures under PyTorch's key names, in PyTorch's order of families.
    pub fn to_pairs(&self) -> Vec<(String, u64)> {
        let mut out = Vec::with_capacity(48);
        let families: [(&str, &Stat); 7] = [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.allocation),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.allocated_bytes),
            ("requested_bytes", &self.requested_bytes),
        ];
        for (family, stat) in families {
            for (metric, value) in [
                ("current", stat.current),
                ("peak", stat.peak),
                ("allocated", stat.allocated),
                ("freed", stat.freed),
            ] {
                out.push((format!("{family}.all.{metric}"), value));
            }
        }
        out.push(("inactive_split.all.current".into(), self.inactive_split));
        out.push((
            "inactive_split_bytes.all.current".into(),
            self.inactive_split_bytes,
        ));
        for (key, value) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
            ("num_sync_all_streams", self.num_sync_all_streams),
        ] {
            out.push((key.into(), value));
        }
        out
    }
}

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

/// The live counters of one pool; [`PoolCounters::get`] reads them into [`MemoryStats`].
#[derive(Debug, Default)]
pub(crate) struct PoolCounters {
    allocation: AtomicStat,
    allocated_bytes: AtomicStat,
    requested_bytes: AtomicStat,
    segment: AtomicStat,
    reserved_bytes: AtomicStat,
    retries: AtomicU64,
    ooms: AtomicU64,
    device_alloc: AtomicU64,
    device_free: AtomicU64,
    sync_all: AtomicU64,
}

impl PoolCounters {
    /// A block of `size` bytes was handed out for a request of `requested` bytes.
    #[inline]
    pub(crate) fn allocated(&self, requested: usize, size: usize) {
        self.allocation.add(1);
        self.allocated_bytes.add(size as u64);
        self.requested_bytes.add(requested as u64);
    }

    /// A block of `size` bytes asked for as `requested` bytes came back.
    #[inline]
    pub(crate) fn freed(&self, requested: usize, size: usize) {
        self.allocation.sub(1);
        self.allocated_bytes.sub(size as u64);
        self.requested_bytes.sub(requested as u64);
    }

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
    pub(crate) fn set_segments(&self, n: usize) {
        let n = n as u64;
        self.segment.current.store(n, Relaxed);
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
        for stat in [
            &self.allocation,
            &self.allocated_bytes,
            &self.requested_bytes,
            &self.segment,
            &self.reserved_bytes,
        ] {
            stat.reset_peak();
        }
    }

    /// The figures now; `inactive_split` ones are filled in by the pool, which knows its blocks.
    pub(crate) fn get(&self) -> MemoryStats {
        MemoryStats {
            allocation: self.allocation.get(),
            allocated_bytes: self.allocated_bytes.get(),
            requested_bytes: self.requested_bytes.get(),
            segment: self.segment.get(),
            reserved_bytes: self.reserved_bytes.get(),
            inactive_split: 0,
            inactive_split_bytes: 0,
            num_alloc_retries: self.retries.load(Relaxed),
            num_ooms: self.ooms.load(Relaxed),
            num_device_alloc: self.device_alloc.load(Relaxed),
            num_device_free: self.device_free.load(Relaxed),
            num_sync_all_streams: self.sync_all.load(Relaxed),
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
        c.allocated(100, 256);
        c.allocated(300, 512);
        c.freed(100, 256);
        let s = c.get();
        assert_eq!(
            s.allocated_bytes,
            Stat {
                current: 512,
                peak: 768,
                allocated: 768,
                freed: 256
            }
        );
        assert_eq!(s.requested_bytes.current, 300);
        assert_eq!(s.allocation.peak, 2);
        assert_eq!((s.segment.current, s.reserved_bytes.current), (1, 4096));
        assert_eq!(s.num_device_alloc, 1);
        c.reset_peaks();
        assert_eq!(c.get().allocated_bytes.peak, 512);
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
            "requested_bytes.all.current",
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
