//! Memory kept for reuse goes back when an allocation elsewhere runs out, and what the process
//! holds of each memory.
//!
//! A resource that keeps freed memory to hand out again (the managed-memory cache,
//! [`ManagedMemoryResource`](crate::ManagedMemoryResource)) registers itself here with the
//! memory it draws from ([`Place`]). When an allocation from that memory fails for want of it
//! (`cuMemAlloc`, `cuMemAllocManaged`, `cuMemAllocAsync` on the device; the simulated device
//! standing in for one), the failing resource calls [`retry_after_relief`]: every registered
//! cache of that place gives back what it keeps, and the allocation is tried once more.
//!
//! # Asking the processes beside this one
//! On a shared GPU ([`crate::shared_gpu`]) the others are asked next, but never from inside the
//! allocation: the source's call may run under a suballocator's lock (growth), and a Python
//! caller may hold the GIL. The source leaves the ask for the allocation's door
//! ([`allocate_asking`]: `DeviceBuffer`, the containers, the frameworks' hooks, every Python
//! call that allocates), which asks with no lock of rrmm held and the GIL released, then tries
//! the allocation again. A Rust program that calls `allocate` itself goes through
//! [`allocate_with_neighbours`] to be served the same way.
//!
//! # Locking
//! The registry's own lock is held only to copy the list (never during a relief). A cache
//! relieves itself only if it can take its own lock at once ([`Relieve::relieve`] must never
//! wait): a cache that is itself growing (the thread that failed holds its lock) or busy on
//! another thread is skipped, so a relief can neither deadlock nor re-enter the cache that
//! asked for it.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// The memory a cache draws from, so that a failure there relieves only the caches that can
/// help.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Place {
    /// Memory of CUDA device `ordinal` (device and managed memory).
    Device(usize),
    /// A simulated device, or another source without a device (host virtual memory), by its
    /// identity ([`MemoryResource::identity`](crate::MemoryResource::identity)).
    Simulated(usize),
}

/// A cache of freed memory that can give it back on demand.
pub trait Relieve: Send + Sync {
    /// Gives back what the cache keeps and is free; the bytes given back. Must never wait for
    /// a lock: a cache that cannot take its own at once returns 0.
    fn relieve(&self) -> usize;

    /// Bytes kept free for reuse now (what [`relieve`](Self::relieve) could give back at most);
    /// an estimate that must never wait for a lock (the last figure read while the cache is
    /// busy): the thread that answers other processes reads it.
    fn cached(&self) -> usize;

    /// Bytes the cache holds straight from the source of its place (the pages an expandable
    /// pool maps, a driver pool's reservation); 0 for a cache over another resource, whose
    /// source counts them.
    fn held(&self) -> usize {
        0
    }
}

/// The processes that share this process's GPU ([`crate::shared_gpu`]): asked after the
/// process's own caches gave nothing.
pub trait Neighbours: Send + Sync {
    /// Asks the other processes to give back memory so that `bytes` more can be allocated;
    /// whether anything was given (worth another try). May wait for their answers (bounded).
    fn ask(&self, bytes: usize) -> bool;

    /// Who holds what of the place, in words, for the message of an allocation refused after
    /// the others were asked.
    fn holders(&self) -> String;

    /// Whether this process may take `bytes` more of the place (its hard limit).
    ///
    /// # Errors
    /// Out of memory naming the limit when it may not.
    fn admit(&self, bytes: usize) -> Result<()>;
}

type Entry = (Place, Weak<dyn Relieve>);

// Why process-wide: memory pressure is the process's: every cache that can give back.
static CACHES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

// Why process-wide: what the process holds of each memory, counted by every source of it.
static HELD: Mutex<Vec<(Place, Weak<AtomicUsize>)>> = Mutex::new(Vec::new());

// Why process-wide: the process's membership of a shared GPU, one per place.
static NEIGHBOURS: Mutex<Vec<(Place, Weak<dyn Neighbours>)>> = Mutex::new(Vec::new());
/// Whether the process ever joined a shared GPU: one load on the driver's allocation path
/// until it does.
// Why process-wide: beside `NEIGHBOURS`, which it summarizes.
static SHARING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Registers `cache`, drawing from `place`, for reliefs until it drops (it is held weakly).
pub fn register(place: Place, cache: Weak<dyn Relieve>) {
    let mut caches = CACHES.lock();
    caches.retain(|(_, c)| c.strong_count() > 0);
    caches.push((place, cache));
}

/// The live caches of `place`, newest first.
fn caches_of(place: Place) -> Vec<Arc<dyn Relieve>> {
    CACHES
        .lock()
        .iter()
        .rev()
        .filter(|(p, _)| *p == place)
        .filter_map(|(_, c)| c.upgrade())
        .collect()
}

/// Asks every live cache of `place` to give back what it keeps, newest first; the bytes given
/// back.
pub fn relieve(place: Place) -> usize {
    caches_of(place).iter().map(|c| c.relieve()).sum()
}

/// A counter of the bytes a source holds of `place`, counted in [`figures`] while it lives:
/// the source adds what it takes from the driver and subtracts what it gives back.
pub fn held_counter(place: Place) -> Arc<AtomicUsize> {
    let counter = Arc::new(AtomicUsize::new(0));
    let mut held = HELD.lock();
    held.retain(|(_, c)| c.strong_count() > 0);
    held.push((place, Arc::downgrade(&counter)));
    counter
}

/// What the process holds of a place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlaceFigures {
    /// Bytes held from the source (in use and cached).
    pub held: usize,
    /// Bytes of those kept free for reuse by the process's pools.
    pub cached: usize,
}

impl PlaceFigures {
    /// Bytes in use: held and not cached.
    pub fn live(&self) -> usize {
        self.held.saturating_sub(self.cached)
    }
}

/// What the process holds of `place` now, and how much of it its pools keep free.
pub fn figures(place: Place) -> PlaceFigures {
    let counted: usize = HELD
        .lock()
        .iter()
        .filter(|(p, _)| *p == place)
        .filter_map(|(_, c)| c.upgrade())
        .map(|c| c.load(Ordering::Relaxed))
        .sum();
    let caches = caches_of(place);
    let held = counted + caches.iter().map(|c| c.held()).sum::<usize>();
    let cached = caches.iter().map(|c| c.cached()).sum::<usize>().min(held);
    PlaceFigures { held, cached }
}

/// Makes `neighbours` the processes asked when `place` runs out (replacing any before).
pub fn set_neighbours(place: Place, neighbours: Weak<dyn Neighbours>) {
    let mut all = NEIGHBOURS.lock();
    all.retain(|(p, n)| *p != place && n.strong_count() > 0);
    all.push((place, neighbours));
    SHARING.store(true, Ordering::Release);
}

fn neighbours_of(place: Place) -> Option<Arc<dyn Neighbours>> {
    NEIGHBOURS
        .lock()
        .iter()
        .find(|(p, _)| *p == place)
        .and_then(|(_, n)| n.upgrade())
}

/// The most times the processes beside this one are asked for one allocation (each answer
/// that gave something is followed by another try).
const NEIGHBOUR_ROUNDS: usize = 3;

thread_local! {
    /// The ask a source's allocation that ran out wants made of the processes sharing its
    /// place, and for how many bytes: left for the door above ([`allocate_asking`]), which
    /// asks outside every lock and without the GIL.
    // Why process-wide: the wanted ask is the calling thread's, passed from the source up to
    // the door of its allocation across the resources between, which know nothing of it.
    static WANTED: std::cell::Cell<Option<(Place, usize)>> = const { std::cell::Cell::new(None) };
    /// How deep the calling thread is in doors ([`allocate_asking`]): an inner door leaves the
    /// ask to the outer one (which knows whether it holds the GIL).
    // Why process-wide: per thread, beside `WANTED`.
    static DOORS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs `allocate` (of `bytes` from `place`); when it fails for want of memory and a relief of
/// `place` gives anything back, runs it once more. A process that shares the place with others
/// ([`set_neighbours`]) is first held to its hard limit; when the allocation still fails, the
/// others are not asked here (a suballocator's lock may be held, and a Python caller's GIL): the
/// ask is left for the door of the allocation ([`allocate_asking`]).
///
/// # Errors
/// `allocate`'s error (of the last try); out of memory past the hard limit.
pub fn retry_after_relief<T>(
    place: Place,
    bytes: usize,
    allocate: impl Fn() -> Result<T>,
) -> Result<T> {
    if SHARING.load(Ordering::Acquire) {
        if let Some(n) = neighbours_of(place) {
            n.admit(bytes)?;
        }
    }
    let result = match allocate() {
        Err(e) if e.is_out_of_memory() && relieve(place) > 0 => allocate(),
        result => result,
    };
    if let Err(e) = &result {
        if e.is_out_of_memory() && SHARING.load(Ordering::Acquire) && neighbours_of(place).is_some()
        {
            let bytes = e.requested_bytes().unwrap_or(bytes);
            WANTED.with(|w| w.set(Some((place, bytes))));
        }
    }
    result
}

/// The door of an allocation (a `DeviceBuffer`, a framework's hook, a Python call): runs
/// `allocate`; when it fails for want of memory and a source below left an ask of the processes
/// sharing its place ([`retry_after_relief`]), runs the ask through `wait` (which runs it where
/// waiting is safe: no lock of rrmm is held here, and a Python door releases the GIL) and tries
/// again after each ask that gave something, up to three times. A refusal after asking says who
/// holds what. A door inside another door only allocates: the outer one asks.
///
/// # Errors
/// `allocate`'s error (of the last try), its message extended after an ask.
pub fn allocate_asking<T>(
    allocate: impl Fn() -> Result<T>,
    wait: impl Fn(&(dyn Fn() -> bool + Sync)) -> bool,
) -> Result<T> {
    // A process that never joined a shared GPU has nobody to ask: one load.
    if !SHARING.load(Ordering::Acquire) {
        return allocate();
    }
    let outer = DOORS.with(|d| {
        let depth = d.get();
        d.set(depth + 1);
        depth == 0
    });
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            DOORS.with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
    let _leave = Leave;
    if !outer {
        return allocate();
    }
    WANTED.with(|w| w.set(None));
    let mut result = allocate();
    let mut asked: Option<Arc<dyn Neighbours>> = None;
    for _ in 0..NEIGHBOUR_ROUNDS {
        match &result {
            Err(e) if e.is_out_of_memory() => {}
            _ => break,
        }
        let Some((place, bytes)) = WANTED.with(std::cell::Cell::take) else {
            break;
        };
        let Some(n) = neighbours_of(place) else {
            break;
        };
        let gave = wait(&|| n.ask(bytes));
        asked = Some(n);
        if !gave {
            break;
        }
        result = allocate();
    }
    WANTED.with(|w| w.set(None));
    match (result, asked) {
        // Refused after asking: the message says who holds what.
        (Err(Error::OutOfMemory { requested, message }), Some(n)) => Err(Error::OutOfMemory {
            requested,
            message: format!("{message}; {}", n.holders()),
        }),
        (result, _) => result,
    }
}

/// [`allocate_asking`] for a Rust caller that holds no lock of rrmm: the ask runs on the
/// calling thread.
///
/// # Errors
/// As [`allocate_asking`].
pub fn allocate_with_neighbours<T>(allocate: impl Fn() -> Result<T>) -> Result<T> {
    allocate_asking(allocate, |ask| ask())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Fake {
        held: AtomicUsize,
    }

    impl Relieve for Fake {
        fn relieve(&self) -> usize {
            self.held.swap(0, Ordering::Relaxed)
        }

        fn cached(&self) -> usize {
            self.held.load(Ordering::Relaxed)
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
        let result = retry_after_relief(here, 10, || {
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
        let failed: Result<()> =
            retry_after_relief(here, 10, || Err(Error::out_of_memory(10, "full")));
        assert!(failed.unwrap_err().is_out_of_memory());
        // Other errors are not retried.
        let logic: Result<()> = retry_after_relief(here, 10, || {
            tries.fetch_add(1, Ordering::Relaxed);
            Err(Error::Logic("bad".into()))
        });
        assert!(logic.is_err());
        assert_eq!(tries.load(Ordering::Relaxed), 1);
        // A dropped cache is skipped and pruned.
        drop(a);
        assert_eq!(relieve(here), 0);
    }

    struct FakeNeighbours {
        asks: AtomicUsize,
        limit: usize,
    }

    impl Neighbours for FakeNeighbours {
        fn ask(&self, _bytes: usize) -> bool {
            self.asks.fetch_add(1, Ordering::Relaxed) < 1
        }

        fn holders(&self) -> String {
            "shared GPU: pid 1 holds it all".into()
        }

        fn admit(&self, bytes: usize) -> Result<()> {
            if bytes > self.limit {
                return Err(Error::out_of_memory(bytes, "hard limit"));
            }
            Ok(())
        }
    }

    #[test]
    fn neighbours_are_asked_after_the_own_caches_and_the_hard_limit_comes_first() {
        let here = Place::Simulated(usize::MAX - 3);
        let n = Arc::new(FakeNeighbours {
            asks: AtomicUsize::new(0),
            limit: 100,
        });
        set_neighbours(here, Arc::downgrade(&n) as Weak<dyn Neighbours>);
        let tries = AtomicUsize::new(0);
        // Fails (no cache of its own to relieve); the door asks outside the source's call, the
        // neighbours gave: served.
        let served = allocate_with_neighbours(|| {
            retry_after_relief(here, 10, || {
                if tries.fetch_add(1, Ordering::Relaxed) < 1 {
                    Err(Error::out_of_memory(10, "full"))
                } else {
                    Ok(7)
                }
            })
        });
        assert_eq!(served.unwrap(), 7);
        assert_eq!(n.asks.load(Ordering::Relaxed), 1);
        // Neighbours that give nothing more: the failure stands, asked once more only.
        let failed: Result<()> = allocate_with_neighbours(|| {
            retry_after_relief(here, 10, || Err(Error::out_of_memory(10, "x")))
        });
        let message = failed.unwrap_err().to_string();
        assert!(message.contains("pid 1 holds it all"), "{message}");
        assert_eq!(n.asks.load(Ordering::Relaxed), 2);
        // The source's own call never asks (it may run under a suballocator's lock): without a
        // door nobody is asked.
        let alone: Result<()> = retry_after_relief(here, 10, || Err(Error::out_of_memory(10, "x")));
        assert!(alone.is_err());
        assert_eq!(n.asks.load(Ordering::Relaxed), 2);
        // A door inside a door leaves the ask to the outer one: asked once.
        let nested: Result<()> = allocate_with_neighbours(|| {
            allocate_with_neighbours(|| {
                retry_after_relief(here, 10, || Err(Error::out_of_memory(10, "x")))
            })
        });
        assert!(nested.is_err());
        assert_eq!(n.asks.load(Ordering::Relaxed), 3);
        // Past the hard limit: refused before any try.
        tries.store(0, Ordering::Relaxed);
        let refused: Result<()> = retry_after_relief(here, 101, || {
            tries.fetch_add(1, Ordering::Relaxed);
            Ok(())
        });
        assert!(refused.unwrap_err().to_string().contains("hard limit"));
        assert_eq!(tries.load(Ordering::Relaxed), 0);
        drop(n);
        assert!(neighbours_of(here).is_none(), "held weakly");
    }
}
