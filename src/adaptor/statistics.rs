//! An adaptor that counts bytes and allocations, with nested levels (push/pop).

use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::resource::{MemoryResource, SharedResource};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicI64, Ordering};

/// Allocation counters of one level: current, peak and total bytes and counts. Current values
/// can be negative inside a pushed level (memory freed there that was allocated before).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Statistics {
    /// Bytes allocated and not yet freed.
    pub current_bytes: i64,
    /// Allocations not yet freed.
    pub current_count: i64,
    /// The most bytes allocated at once.
    pub peak_bytes: i64,
    /// The most allocations alive at once.
    pub peak_count: i64,
    /// All bytes ever allocated.
    pub total_bytes: i64,
    /// All allocations ever made.
    pub total_count: i64,
}

impl Statistics {
    /// Merges a popped child level into this (its parent), as RMM does:
    /// `peak = max(value + child.peak, peak)`, `value += child.value`, `total += child.total`.
    fn merge(&mut self, child: &Statistics) {
        self.peak_bytes = (self.current_bytes + child.peak_bytes).max(self.peak_bytes);
        self.current_bytes += child.current_bytes;
        self.total_bytes += child.total_bytes;
        self.peak_count = (self.current_count + child.peak_count).max(self.peak_count);
        self.current_count += child.current_count;
        self.total_count += child.total_count;
    }
}

/// One level of counters, updated with atomics under the shared (read) lock, so that
/// allocations on several threads do not serialize on a mutex.
#[derive(Default)]
struct Level {
    current_bytes: AtomicI64,
    current_count: AtomicI64,
    peak_bytes: AtomicI64,
    peak_count: AtomicI64,
    total_bytes: AtomicI64,
    total_count: AtomicI64,
}

impl Level {
    fn from_stats(s: Statistics) -> Self {
        Level {
            current_bytes: AtomicI64::new(s.current_bytes),
            current_count: AtomicI64::new(s.current_count),
            peak_bytes: AtomicI64::new(s.peak_bytes),
            peak_count: AtomicI64::new(s.peak_count),
            total_bytes: AtomicI64::new(s.total_bytes),
            total_count: AtomicI64::new(s.total_count),
        }
    }

    fn add(&self, bytes: i64) {
        // The value after this add is exact, so the max over them is the true peak.
        let now = self.current_bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.peak_bytes.fetch_max(now, Ordering::AcqRel);
        self.total_bytes.fetch_add(bytes, Ordering::AcqRel);
        let count = self.current_count.fetch_add(1, Ordering::AcqRel) + 1;
        self.peak_count.fetch_max(count, Ordering::AcqRel);
        self.total_count.fetch_add(1, Ordering::AcqRel);
    }

    fn remove(&self, bytes: i64) {
        self.current_bytes.fetch_sub(bytes, Ordering::AcqRel);
        self.current_count.fetch_sub(1, Ordering::AcqRel);
    }

    fn load(&self) -> Statistics {
        Statistics {
            current_bytes: self.current_bytes.load(Ordering::Acquire),
            current_count: self.current_count.load(Ordering::Acquire),
            peak_bytes: self.peak_bytes.load(Ordering::Acquire),
            peak_count: self.peak_count.load(Ordering::Acquire),
            total_bytes: self.total_bytes.load(Ordering::Acquire),
            total_count: self.total_count.load(Ordering::Acquire),
        }
    }
}

/// Counts the bytes and allocations that pass through it (RMM's
/// `statistics_resource_adaptor`). `push_counters` starts a new level of counters (for a region
/// of code); `pop_counters` ends it and merges it into the level below.
pub struct StatisticsResourceAdaptor {
    upstream: SharedResource,
    /// The stack of levels; never empty. Allocations take the shared lock and update the top
    /// level's atomics; push and pop take the exclusive lock (RMM's `shared_mutex`).
    levels: RwLock<Vec<Level>>,
}

fn signed(bytes: usize) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

impl StatisticsResourceAdaptor {
    /// An adaptor over `upstream` with one level of zeroed counters.
    pub fn new(upstream: SharedResource) -> Self {
        let mut levels = Vec::with_capacity(4);
        levels.push(Level::default());
        StatisticsResourceAdaptor {
            upstream,
            levels: RwLock::new(levels),
        }
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }

    /// The counters of the current (innermost) level.
    pub fn allocation_counts(&self) -> Statistics {
        let levels = self.levels.read();
        levels.last().map(Level::load).unwrap_or_default()
    }

    /// Starts a new level of zeroed counters; returns the counters of the level that was current
    /// before the push.
    pub fn push_counters(&self) -> Statistics {
        let mut levels = self.levels.write();
        let before = levels.last().map(Level::load).unwrap_or_default();
        levels.push(Level::default());
        before
    }

    /// Ends the current level, merges it into the level below and returns the popped counters.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when only the base level is left.
    pub fn pop_counters(&self) -> Result<Statistics> {
        let mut levels = self.levels.write();
        if levels.len() <= 1 {
            return Err(Error::OutOfRange(
                "cannot pop the last counter pair".to_string(),
            ));
        }
        let child = levels.pop().map(|l| l.load()).unwrap_or_default();
        if let Some(parent) = levels.last_mut() {
            let mut merged = parent.load();
            merged.merge(&child);
            *parent = Level::from_stats(merged);
        }
        Ok(child)
    }

    /// Number of levels (1 when nothing is pushed).
    pub fn depth(&self) -> usize {
        self.levels.read().len()
    }
}

impl MemoryResource for StatisticsResourceAdaptor {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let ptr = self.upstream.allocate(bytes, stream)?;
        if let Some(top) = self.levels.read().last() {
            top.add(signed(bytes));
        }
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract (this resource hands out the upstream's pointers unchanged).
        unsafe { self.upstream.deallocate(ptr, bytes, stream) }?;
        if let Some(top) = self.levels.read().last() {
            top.remove(signed(bytes));
        }
        Ok(())
    }

    forward_upstream_info!();

    fn name(&self) -> &'static str {
        "statistics"
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_send_sync, simulated};
    use super::*;

    #[test]
    fn counts_and_peaks() {
        assert_send_sync::<StatisticsResourceAdaptor>();
        let mr = StatisticsResourceAdaptor::new(simulated());
        let a = mr.allocate(100, Stream::DEFAULT).unwrap();
        let b = mr.allocate(200, Stream::DEFAULT).unwrap();
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(a, 100, Stream::DEFAULT) }.unwrap();
        let s = mr.allocation_counts();
        assert_eq!(
            s,
            Statistics {
                current_bytes: 200,
                current_count: 1,
                peak_bytes: 300,
                peak_count: 2,
                total_bytes: 300,
                total_count: 2
            }
        );
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(b, 200, Stream::DEFAULT) }.unwrap();
        assert_eq!(mr.allocation_counts().current_bytes, 0);
        // Failed allocations are not counted.
        assert!(mr.allocate(2 << 20, Stream::DEFAULT).is_err());
        assert_eq!(mr.allocation_counts().total_count, 2);
    }

    #[test]
    fn push_pop_merges_like_rmm() {
        let mr = StatisticsResourceAdaptor::new(simulated());
        let a = mr.allocate(1000, Stream::DEFAULT).unwrap();
        let before = mr.push_counters();
        assert_eq!(before.current_bytes, 1000);
        assert_eq!(mr.depth(), 2);
        assert_eq!(mr.allocation_counts(), Statistics::default());
        let b = mr.allocate(500, Stream::DEFAULT).unwrap();
        let c = mr.allocate(300, Stream::DEFAULT).unwrap();
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(c, 300, Stream::DEFAULT) }.unwrap();
        // Freeing memory of the outer level makes the inner one negative.
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(a, 1000, Stream::DEFAULT) }.unwrap();
        let inner = mr.allocation_counts();
        assert_eq!(inner.current_bytes, -500);
        assert_eq!(inner.peak_bytes, 800);
        let popped = mr.pop_counters().unwrap();
        assert_eq!(popped, inner);
        let outer = mr.allocation_counts();
        assert_eq!(outer.current_bytes, 500);
        assert_eq!(outer.peak_bytes, 1800);
        assert_eq!(outer.total_bytes, 1800);
        assert_eq!(outer.current_count, 1);
        assert_eq!(outer.peak_count, 3);
        assert_eq!(outer.total_count, 3);
        assert!(matches!(mr.pop_counters(), Err(Error::OutOfRange(_))));
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(b, 500, Stream::DEFAULT) }.unwrap();
    }

    #[test]
    fn concurrent_counts_are_exact() {
        let mr = std::sync::Arc::new(StatisticsResourceAdaptor::new(simulated()));
        std::thread::scope(|s| {
            for _ in 0..4 {
                let mr = mr.clone();
                s.spawn(move || {
                    for _ in 0..200 {
                        let p = mr.allocate(256, Stream::DEFAULT).unwrap();
                        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
                        unsafe { mr.deallocate(p, 256, Stream::DEFAULT) }.unwrap();
                    }
                });
            }
        });
        let s = mr.allocation_counts();
        assert_eq!((s.current_count, s.total_count), (0, 800));
        assert!(s.peak_count <= 4);
    }
}
