//! The process's index of sleeping pools: the address ranges of pools that are asleep (or falling
//! asleep, or waking), for the checks of rrmm's copies ([`check_awake`]) and for the ledger's
//! wakes and figures ([`pools_asleep`]); and the counts the allocation and free paths read
//! ([`any_moving`], [`any_tagged`]).
//!
//! An index, not a state: each entry names the pool, whose own [`Movement`](super::Movement)
//! decides what a copy into it does (wake it, or refuse).

use super::{MovingPool, SleepCause};
use crate::error::{Error, Result};
use crate::pressure::Place;
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// A counter on a cache line of its own: the allocation and free paths of every thread read
/// `ASLEEP_COUNT` and `TAGGED`, which change only when a pool moves or a block is tagged, and no
/// write of another static (`COPIES`, on every copy) may evict them.
#[repr(align(128))]
struct Line(AtomicUsize);

/// A sleeping pool's range: its end, its name, the pool (held weakly: a pool dropped while
/// asleep leaves the index as it drops).
type AsleepRange = (usize, &'static str, Weak<dyn MovingPool>);

/// The address ranges of sleeping pools: start -> range.
// Why process-wide: an address may be copied from anywhere (a raw pointer, a buffer of another
// resource); a copy of a sleeping pool's memory must be refused (or wake it) whoever asks.
static ASLEEP: RwLock<BTreeMap<usize, AsleepRange>> = RwLock::new(BTreeMap::new());
/// `ASLEEP.len()`, read without the lock: the allocation and copy paths' one load while nothing
/// in the process moves.
// Why process-wide: the count of `ASLEEP`, beside it.
static ASLEEP_COUNT: Line = Line(AtomicUsize::new(0));
/// Blocks tagged discard in every pool of the process: a free forgets a tag only while some
/// block is tagged.
// Why process-wide: a free above a pool reads it without reaching the pool.
static TAGGED: Line = Line(AtomicUsize::new(0));

/// rrmm's copies of bytes in flight (queued or running on the host), anywhere in the process.
// Why process-wide: a copy may touch any pool's memory; an offload waits for the copies that
// began before it was seen (they count themselves here before they look at the index).
static COPIES: Line = Line(AtomicUsize::new(0));

/// One of rrmm's copies, counted while it is queued ([`begin_copy`]); an offload that began
/// meanwhile waits for it before it reads the pool.
#[must_use = "the copy is counted while the guard lives"]
pub struct CopyGuard(());

impl Drop for CopyGuard {
    fn drop(&mut self) {
        COPIES.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether `[ptr, ptr + bytes)` touches a pool in the index that is not awake now.
fn touches_a_sleeping_pool(ptr: usize, bytes: usize) -> bool {
    let end = ptr.saturating_add(bytes);
    ASLEEP
        .read()
        .range(..end)
        .next_back()
        .filter(|(_, (stop, _, _))| *stop > ptr)
        .and_then(|(_, (_, _, pool))| pool.upgrade())
        .is_some_and(|pool| pool.asleep())
}

/// Begins one of rrmm's copies of the ranges `(argument, ptr, bytes)`: counts it (an offload
/// that begins meanwhile waits for it, `wait_for_copies`) once no range touches a sleeping
/// pool; a pool asleep for the ledger wakes first, one asleep for its user refuses. The copy
/// is counted until the guard drops (its queueing done).
///
/// # Errors
/// As [`check_awake`] for the first range in a sleeping pool's memory.
pub fn begin_copy(ranges: &[(&str, usize, usize)]) -> Result<CopyGuard> {
    loop {
        COPIES.0.fetch_add(1, Ordering::SeqCst);
        let guard = CopyGuard(());
        if !any_moving()
            || !ranges
                .iter()
                .any(|&(_, ptr, bytes)| bytes > 0 && touches_a_sleeping_pool(ptr, bytes))
        {
            return Ok(guard);
        }
        // Not counted while it wakes a pool (the wake waits for the offload, which waits for
        // the copies counted).
        drop(guard);
        for &(name, ptr, bytes) in ranges {
            check_awake(name, ptr, bytes)?;
        }
    }
}

/// Waits for rrmm's copies counted before the caller's pool entered the index (an offload, once
/// its phase is set: copies that begin after it see the pool and wake it or refuse).
pub(crate) fn wait_for_copies() {
    while COPIES.0.load(Ordering::SeqCst) != 0 {
        std::thread::yield_now();
    }
}

/// Whether any pool of the process is asleep, falling asleep or waking (one load). A pool
/// enters the index before it refuses anything and leaves it after it is awake, so a reader
/// that finds 0 after its own carve may hand the block out (the carve and the offload's view of
/// the lists are ordered by the lists' locks).
#[inline(always)]
pub fn any_moving() -> bool {
    ASLEEP_COUNT.0.load(Ordering::Acquire) != 0
}

/// Whether any block of the process is tagged (one load).
#[inline(always)]
pub fn any_tagged() -> bool {
    TAGGED.0.load(Ordering::Acquire) != 0
}

/// Counts tagged blocks: `added` more, `removed` fewer.
pub(crate) fn count_tags(added: usize, removed: usize) {
    if added > 0 {
        TAGGED.0.fetch_add(added, Ordering::AcqRel);
    }
    if removed > 0 {
        TAGGED.0.fetch_sub(removed, Ordering::AcqRel);
    }
}

/// Marks `[start, start + bytes)` as the memory of `pool`, which is falling asleep (from the
/// start of its offload to the end of its wake).
pub(crate) fn mark_asleep(
    start: usize,
    bytes: usize,
    name: &'static str,
    pool: Weak<dyn MovingPool>,
) {
    let mut map = ASLEEP.write();
    map.insert(start, (start.saturating_add(bytes), name, pool));
    ASLEEP_COUNT.0.store(map.len(), Ordering::SeqCst);
}

/// Marks the range that starts at `start` awake again.
pub(crate) fn mark_awake(start: usize) {
    let mut map = ASLEEP.write();
    map.remove(&start);
    ASLEEP_COUNT.0.store(map.len(), Ordering::SeqCst);
}

/// The pools of `place` in the index that sleep for `cause` now.
pub fn pools_asleep(place: Place, cause: SleepCause) -> Vec<Arc<dyn MovingPool>> {
    let pools: Vec<Arc<dyn MovingPool>> = ASLEEP
        .read()
        .values()
        .filter_map(|(_, _, p)| p.upgrade())
        .collect();
    pools
        .into_iter()
        .filter(|p| p.place() == place && p.movement().cause == Some(cause))
        .collect()
}

/// An error when `[ptr, ptr + bytes)` touches a sleeping pool's memory: a copy there would
/// touch pages the sleep gave back. A pool asleep for the ledger wakes instead. `name` is the
/// argument, for the message.
///
/// # Errors
/// [`Error::Logic`] naming the argument, the address and the sleep.
#[inline]
pub fn check_awake(name: &str, ptr: usize, bytes: usize) -> Result<()> {
    if bytes == 0 || !any_moving() {
        return Ok(());
    }
    let end = ptr.saturating_add(bytes);
    let hit = ASLEEP
        .read()
        .range(..end)
        .next_back()
        .filter(|(_, (stop, _, _))| *stop > ptr)
        .map(|(_, (_, pool_name, pool))| (*pool_name, pool.upgrade()));
    match hit {
        None | Some((_, None)) => Ok(()),
        Some((_, Some(pool))) if pool.wake_for_use() => Ok(()),
        Some((pool, _)) => Err(Error::Logic(format!(
            "{name}={ptr:#x} ({bytes} bytes) lies in the memory of an {pool} pool that is asleep \
             (offloaded to host memory; its pages are given back): restore() it first, or wait \
             for the end of rrmm.sleep()"
        ))),
    }
}
