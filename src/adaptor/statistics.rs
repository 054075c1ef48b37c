//! An adaptor that counts bytes and allocations, with nested levels (push/pop).

use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::resource::{MemoryResource, SharedResource};
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

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

    /// Counts an allocation; whether the current figures stayed exact (no saturation).
    fn add(&self, bytes: i64) -> bool {
        // The value after this add is exact, so the max over them is the true peak.
        let (now, exact_bytes) = saturating_add(&self.current_bytes, bytes);
        self.peak_bytes.fetch_max(now, Ordering::AcqRel);
        saturating_add(&self.total_bytes, bytes);
        let (count, exact_count) = saturating_add(&self.current_count, 1);
        self.peak_count.fetch_max(count, Ordering::AcqRel);
        saturating_add(&self.total_count, 1);
        exact_bytes && exact_count
    }

    /// Counts a free; whether the current figures stayed exact.
    fn remove(&self, bytes: i64, count: i64) -> bool {
        let (_, exact_bytes) = saturating_add(&self.current_bytes, bytes.saturating_neg());
        let (_, exact_count) = saturating_add(&self.current_count, -count);
        exact_bytes && exact_count
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
    /// Whether the current figures are exact: cleared for good when a counter saturated (sizes
    /// beyond `i64`), after which frees are no longer checked against them.
    exact: AtomicBool,
    /// Zero-byte allocations outstanding (each handed out the null pointer).
    zero_byte: AtomicI64,
}

/// Adds `delta` to `counter`, saturating at the ends of `i64` instead of wrapping; the new value
/// and whether it is exact (did not saturate).
fn saturating_add(counter: &AtomicI64, delta: i64) -> (i64, bool) {
    let before = counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            Some(v.saturating_add(delta))
        })
        .unwrap_or_else(|v| v);
    match before.checked_add(delta) {
        Some(now) => (now, true),
        None => (before.saturating_add(delta), false),
    }
}

/// `bytes` as a counter value, and whether it fits.
fn signed(bytes: usize) -> (i64, bool) {
    match i64::try_from(bytes) {
        Ok(b) => (b, true),
        Err(_) => (i64::MAX, false),
    }
}

impl StatisticsResourceAdaptor {
    /// An adaptor over `upstream` with one level of zeroed counters.
    pub fn new(upstream: SharedResource) -> Self {
        let mut levels = Vec::with_capacity(4);
        levels.push(Level::default());
        StatisticsResourceAdaptor {
            upstream,
            levels: RwLock::new(levels),
            exact: AtomicBool::new(true),
            zero_byte: AtomicI64::new(0),
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
        let (amount, fits) = signed(bytes);
        if bytes == 0 {
            self.zero_byte.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(top) = self.levels.read().last() {
            if !(top.add(amount) && fits) {
                self.exact.store(false, Ordering::Relaxed);
            }
        }
        Ok(ptr)
    }

    /// Frees through the upstream and counts the free in the current level.
    ///
    /// A null pointer frees nothing: with a size of 0 it ends a zero-byte allocation (counted as
    /// one allocation of 0 bytes, as RMM counts it) while one is outstanding; with any other size
    /// it changes nothing. (RMM's adaptor subtracts the size of a null free from its counters,
    /// which leaves them wrong for good.)
    ///
    /// # Errors
    /// [`Error::Logic`] (the upstream is not called) when more bytes or more allocations would
    /// be freed than are outstanding over all levels: the size cannot be an allocation's, or it
    /// is a double free (checked while the counters are exact). The upstream's errors otherwise.
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        let (amount, fits) = signed(bytes);
        if ptr == 0 {
            let ends_a_zero_byte_allocation = bytes == 0
                && self
                    .zero_byte
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                        (n > 0).then(|| n - 1)
                    })
                    .is_ok();
            if ends_a_zero_byte_allocation {
                if let Some(top) = self.levels.read().last() {
                    top.remove(0, 1);
                }
            }
            // Forwarded, so a counting resource below ends its zero-byte allocation too.
            // SAFETY: a null pointer is never a live allocation: freeing it is a no-op for
            // every resource (the trait's contract).
            return unsafe { self.upstream.deallocate(0, bytes, stream) };
        }
        let (count, outstanding) = {
            // A level's counts may be negative (frees of what an outer level allocated); their
            // sum over the levels is what is outstanding.
            let levels = self.levels.read();
            levels.iter().fold((0i64, 0i64), |(c, b), l| {
                (
                    c.saturating_add(l.current_count.load(Ordering::Acquire)),
                    b.saturating_add(l.current_bytes.load(Ordering::Acquire)),
                )
            })
        };
        if self.exact.load(Ordering::Relaxed) && (count <= 0 || !fits || amount > outstanding) {
            return Err(Error::Logic(format!(
                "statistics_resource_adaptor: deallocate of {ptr:#x} with size {bytes}, but \
                 {count} allocations of {outstanding} bytes are outstanding (wrong size or \
                 double free)"
            )));
        }
        // SAFETY: the caller's contract (this resource hands out the upstream's pointers unchanged).
        unsafe { self.upstream.deallocate(ptr, bytes, stream) }?;
        if let Some(top) = self.levels.read().last() {
            if !(top.remove(amount, 1) && fits) {
                self.exact.store(false, Ordering::Relaxed);
            }
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
    fn frees_beyond_what_is_outstanding_are_logic_errors() {
        let mr = StatisticsResourceAdaptor::new(simulated());
        let a = mr.allocate(100, Stream::DEFAULT).unwrap();
        // SAFETY: the adaptor refuses this free before the upstream sees it.
        let err = unsafe { mr.deallocate(a, 1 << 20, Stream::DEFAULT) }.unwrap_err();
        assert!(
            matches!(&err, Error::Logic(m) if m.contains("size 1048576")),
            "{err}"
        );
        assert_eq!(mr.allocation_counts().current_bytes, 100);
        mr.push_counters();
        // SAFETY: `a` is live with 100 bytes (allocated in the outer level).
        unsafe { mr.deallocate(a, 100, Stream::DEFAULT) }.unwrap();
        // SAFETY: refused by the adaptor: nothing is outstanding.
        assert!(unsafe { mr.deallocate(a, 100, Stream::DEFAULT) }.is_err());
        assert_eq!(mr.allocation_counts().current_count, -1);
        mr.pop_counters().unwrap();
        let base = mr.allocation_counts();
        assert_eq!((base.current_bytes, base.current_count), (0, 0));
        assert!(mr.allocate(10, Stream::DEFAULT).is_ok());
    }

    #[test]
    fn counters_saturate_instead_of_wrapping() {
        let c = AtomicI64::new(i64::MAX - 1);
        assert_eq!(saturating_add(&c, 10), (i64::MAX, false));
        let d = AtomicI64::new(i64::MIN + 1);
        assert_eq!(saturating_add(&d, -10), (i64::MIN, false));
        assert_eq!(saturating_add(&AtomicI64::new(5), -3), (2, true));
    }

    /// Issue 18: one null free poisoned the adaptor; every later correct free was refused.
    #[test]
    fn null_frees_change_nothing_and_zero_byte_allocations_balance() {
        let mr = StatisticsResourceAdaptor::new(simulated());
        for bytes in [1000, 0, usize::MAX] {
            // SAFETY: a null pointer; nothing is freed.
            unsafe { mr.deallocate(0, bytes, Stream::DEFAULT) }.unwrap();
        }
        assert_eq!(mr.allocation_counts(), Statistics::default());
        let a = mr.allocate(1000, Stream::DEFAULT).unwrap();
        // SAFETY: allocated just above with this size, freed once.
        unsafe { mr.deallocate(a, 1000, Stream::DEFAULT) }.unwrap();
        let z = mr.allocate(0, Stream::DEFAULT).unwrap();
        assert_eq!((z, mr.allocation_counts().current_count), (0, 1));
        // SAFETY: the zero-byte allocation's null pointer.
        unsafe { mr.deallocate(z, 0, Stream::DEFAULT) }.unwrap();
        // SAFETY: as above, once more: nothing is outstanding any more.
        unsafe { mr.deallocate(z, 0, Stream::DEFAULT) }.unwrap();
        let s = mr.allocation_counts();
        assert_eq!((s.current_bytes, s.current_count, s.total_count), (0, 0, 2));
    }

    /// Issue 18: counters that saturated refused correct frees afterwards.
    #[test]
    fn saturated_counters_stop_checking_instead_of_refusing() {
        use crate::resource::CallbackMemoryResource;
        // An upstream that "allocates" any size at a distinct address, from no memory (the
        // blocks must not overlap: the callback resource refuses overlapping blocks).
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(1 << 20));
        let up: SharedResource = std::sync::Arc::new(CallbackMemoryResource::new(
            Box::new(move |bytes, _| Ok(next.fetch_add(bytes, Ordering::Relaxed))),
            Box::new(|_, _, _| Ok(())),
            crate::MemoryKind::Simulated,
        ));
        let mr = StatisticsResourceAdaptor::new(up);
        let huge = 1usize << 62;
        let ptrs: Vec<usize> = (0..3)
            .map(|_| mr.allocate(huge, Stream::DEFAULT).unwrap())
            .collect();
        for p in ptrs {
            // SAFETY: each allocated above with `huge` bytes, freed once.
            unsafe { mr.deallocate(p, huge, Stream::DEFAULT) }.unwrap();
        }
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
