//! Memory kept for reuse goes back when an allocation elsewhere runs out.
//!
//! A resource that keeps freed memory to hand out again (the managed-memory cache,
//! [`ManagedMemoryResource`](crate::ManagedMemoryResource)) registers itself here with the
//! memory it draws from ([`Place`]). When an allocation from that memory fails for want of it
//! (`cuMemAlloc`, `cuMemAllocManaged`, `cuMemAllocAsync` on the device; the simulated device
//! standing in for one), the failing resource calls [`retry_after_relief`]: every registered
//! cache of that place gives back what it keeps, and the allocation is tried once more.
//!
//! # Locking
//! The registry's own lock is held only to copy the list (never during a relief). A cache
//! relieves itself only if it can take its own lock at once ([`Relieve::relieve`] must never
//! wait): a cache that is itself growing (the thread that failed holds its lock) or busy on
//! another thread is skipped, so a relief can neither deadlock nor re-enter the cache that
//! asked for it.

use crate::error::Result;
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// The memory a cache draws from, so that a failure there relieves only the caches that can
/// help.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Place {
    /// Memory of CUDA device `ordinal` (device and managed memory).
    Device(usize),
    /// A simulated device, by its identity ([`MemoryResource::identity`](crate::MemoryResource::identity)).
    Simulated(usize),
}

/// A cache of freed memory that can give it back on demand.
pub trait Relieve: Send + Sync {
    /// Gives back what the cache keeps and is free; the bytes given back. Must never wait for
    /// a lock: a cache that cannot take its own at once returns 0.
    fn relieve(&self) -> usize;
}

type Entry = (Place, Weak<dyn Relieve>);

// Why process-wide: memory pressure is the process's: every cache that can give back.
static CACHES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Registers `cache`, drawing from `place`, for reliefs until it drops (it is held weakly).
pub fn register(place: Place, cache: Weak<dyn Relieve>) {
    let mut caches = CACHES.lock();
    caches.retain(|(_, c)| c.strong_count() > 0);
    caches.push((place, cache));
}

/// Asks every live cache of `place` to give back what it keeps; the bytes given back.
pub fn relieve(place: Place) -> usize {
    let live: Vec<Arc<dyn Relieve>> = CACHES
        .lock()
        .iter()
        .filter(|(p, _)| *p == place)
        .filter_map(|(_, c)| c.upgrade())
        .collect();
    live.iter().map(|c| c.relieve()).sum()
}

/// Runs `allocate`; when it fails for want of memory and a relief of `place` gives anything
/// back, runs it once more.
///
/// # Errors
/// `allocate`'s error (of the second try, where there was one).
pub fn retry_after_relief<T>(place: Place, allocate: impl Fn() -> Result<T>) -> Result<T> {
    match allocate() {
        Err(e) if e.is_out_of_memory() && relieve(place) > 0 => allocate(),
        result => result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Fake {
        held: AtomicUsize,
    }

    impl Relieve for Fake {
        fn relieve(&self) -> usize {
            self.held.swap(0, Ordering::Relaxed)
        }
    }

    #[test]
    fn a_failure_relieves_the_caches_of_its_place_only_and_retries_once() {
        // Places no other test uses.
        let here = Place::Simulated(usize::MAX - 1);
        let there = Place::Simulated(usize::MAX - 2);
        let a: Arc<dyn Relieve> = Arc::new(Fake {
            held: AtomicUsize::new(100),
        });
        let b: Arc<dyn Relieve> = Arc::new(Fake {
            held: AtomicUsize::new(7),
        });
        register(here, Arc::downgrade(&a));
        register(there, Arc::downgrade(&b));
        let tries = AtomicUsize::new(0);
        let result = retry_after_relief(here, || {
            if tries.fetch_add(1, Ordering::Relaxed) == 0 {
                Err(Error::out_of_memory(10, "full"))
            } else {
                Ok(1)
            }
        });
        assert_eq!(result.unwrap(), 1);
        assert_eq!(tries.load(Ordering::Relaxed), 2);
        assert_eq!(relieve(there), 7, "the other place's cache was left alone");
        // Nothing left to give: the failure stands after one try.
        tries.store(0, Ordering::Relaxed);
        let failed: Result<()> = retry_after_relief(here, || Err(Error::out_of_memory(10, "full")));
        assert!(failed.unwrap_err().is_out_of_memory());
        // Other errors are not retried.
        let logic: Result<()> = retry_after_relief(here, || {
            tries.fetch_add(1, Ordering::Relaxed);
            Err(Error::Logic("bad".into()))
        });
        assert!(logic.is_err());
        assert_eq!(tries.load(Ordering::Relaxed), 1);
        // A dropped cache is skipped and pruned.
        drop(a);
        assert_eq!(relieve(here), 0);
    }
}
