//! [`SleepWatch`]: the pools whose memory moves below a resource, as a live cell of its link.
//!
//! A watch is made once, with the link: a source that can move holds one over itself
//! ([`SleepWatch::of`]); a resource over several upstreams makes one over theirs
//! ([`SleepWatch::join`]); adaptors and suballocators share their upstream's. When the graph
//! below grows (a tagged resource gains a tag, a binning resource a bin: [`SleepWatch::add_part`])
//! the cells made over the grown one gain its new pools, upwards, by a work list (no recursion
//! over a user's graph), and every tenant admitted to a cell ([`SleepWatch::admit`]) is admitted
//! to the pools it gains: a suballocator built before a tag was added still refuses to hand out
//! that tag's sleeping memory, and the tag's offload still copies only its live blocks.
//!
//! The allocation path reads no cell while nothing in the process moves
//! ([`any_moving`](super::any_moving), one load of a process-wide count), and a watch's
//! [`is_empty`](SleepWatch::is_empty) is one load.

use super::{ByteRange, MovingPool, Tenant};
use crate::error::Result;
use crate::resource::above::Above;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// The pools of a cell, in order (each once, by identity).
type Pools = Arc<[Arc<dyn MovingPool>]>;

struct CellState {
    /// Every pool below, in order: the cell's own and its parts'.
    pools: Pools,
    /// The cells this one is made from (held strongly: the resources below outlive the cell).
    parts: Vec<SleepWatch>,
    /// Suballocators over the cell, admitted to every pool it has and gains (held weakly).
    tenants: Vec<Weak<dyn Tenant>>,
}

struct Cell {
    state: Mutex<CellState>,
    /// `state.pools.len()`, read without the lock.
    count: AtomicUsize,
    /// The cells made from this one, updated when it grows.
    above: Above<Cell>,
}

impl Default for CellState {
    fn default() -> Self {
        CellState {
            pools: Arc::from(Vec::new()),
            parts: Vec::new(),
            tenants: Vec::new(),
        }
    }
}

/// The pools whose memory moves below a resource (none for most stacks: then every check is one
/// load). See the module docs.
#[derive(Clone)]
pub struct SleepWatch(Arc<Cell>);

impl std::fmt::Debug for SleepWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.pools().iter()).finish()
    }
}

impl Default for SleepWatch {
    fn default() -> Self {
        SleepWatch::over(Vec::new(), &[])
    }
}

/// `pools` with those of `more` not in it (by identity) added, in order; whether any was.
fn union_into(pools: &mut Vec<Arc<dyn MovingPool>>, more: &[Arc<dyn MovingPool>]) -> bool {
    let mut grew = false;
    for p in more {
        if !pools.iter().any(|o| o.identity() == p.identity()) {
            pools.push(p.clone());
            grew = true;
        }
    }
    grew
}

impl SleepWatch {
    fn over(own: Vec<Arc<dyn MovingPool>>, parts: &[&SleepWatch]) -> SleepWatch {
        let count = own.len();
        let cell = Arc::new(Cell {
            state: Mutex::new(CellState {
                pools: Arc::from(own),
                parts: parts.iter().map(|&p| p.clone()).collect(),
                tenants: Vec::new(),
            }),
            count: AtomicUsize::new(count),
            above: Above::default(),
        });
        // Listen first, then gather: a part that grows meanwhile either finds this cell in its
        // list or grew before the gathering read it.
        for part in parts {
            part.0.above.listen(&cell);
        }
        Self::settle(cell.clone());
        SleepWatch(cell)
    }

    /// A watch over one pool (the pool's own link).
    pub fn of(pool: Arc<dyn MovingPool>) -> SleepWatch {
        SleepWatch::over(vec![pool], &[])
    }

    /// A new watch over every pool of `watches` (each once, by identity, in order), which
    /// follows them as they grow and may gain parts of its own ([`add_part`](Self::add_part)).
    pub fn join<'a>(watches: impl IntoIterator<Item = &'a SleepWatch>) -> SleepWatch {
        let parts: Vec<&SleepWatch> = watches.into_iter().collect();
        SleepWatch::over(Vec::new(), &parts)
    }

    /// Makes `part` one of this watch's parts (a tag or a bin gained): its pools reach this
    /// watch and every watch made from it, and their tenants are admitted to them.
    pub fn add_part(&self, part: &SleepWatch) {
        self.0.state.lock().parts.push(part.clone());
        part.0.above.listen(&self.0);
        Self::settle(self.0.clone());
    }

    /// Gathers the pools of `start`'s parts into it, and of each cell above one that grew,
    /// until none grows; admits each cell's tenants to the pools it gained. A cell's lock is
    /// never held while another's is taken.
    fn settle(start: Arc<Cell>) {
        let mut work = vec![start];
        while let Some(cell) = work.pop() {
            let parts = cell.state.lock().parts.clone();
            let mut below: Vec<Arc<dyn MovingPool>> = Vec::new();
            for part in &parts {
                union_into(&mut below, &part.pools());
            }
            let (gained, tenants) = {
                let mut state = cell.state.lock();
                let mut pools: Vec<Arc<dyn MovingPool>> = state.pools.to_vec();
                let before = pools.len();
                if !union_into(&mut pools, &below) {
                    continue;
                }
                let gained: Vec<Arc<dyn MovingPool>> = pools[before..].to_vec();
                state.pools = Arc::from(pools);
                cell.count.store(state.pools.len(), Ordering::Release);
                state.tenants.retain(|t| t.strong_count() > 0);
                (gained, state.tenants.clone())
            };
            for pool in &gained {
                for tenant in &tenants {
                    pool.admit(tenant.clone());
                }
            }
            work.extend(cell.above.cells());
        }
    }

    /// The pools now, top first.
    pub fn pools(&self) -> Pools {
        self.0.state.lock().pools.clone()
    }

    /// Whether no pool below can move (one load).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.count.load(Ordering::Acquire) == 0
    }

    /// Whether a pool below sleeps (or falls asleep, or wakes): one process-wide load while
    /// nothing in the process moves.
    #[inline]
    pub fn asleep(&self) -> bool {
        super::any_moving() && !self.is_empty() && self.pools().iter().any(|s| s.asleep())
    }

    /// [`Error::Logic`](crate::Error::Logic) naming `name` while a pool below sleeps; a pool
    /// asleep for the ledger wakes here instead.
    ///
    /// # Errors
    /// As said.
    #[inline]
    pub fn check(&self, name: &str, bytes: usize) -> Result<()> {
        if self.asleep() && !self.wake_for_use() {
            return Err(super::asleep_below_error(name, bytes));
        }
        Ok(())
    }

    /// Wakes every pool below that sleeps for the ledger; whether none sleeps afterwards.
    #[inline(never)]
    pub fn wake_for_use(&self) -> bool {
        self.pools().iter().all(|s| !s.asleep() || s.wake_for_use())
    }

    /// Records `tenant` with every pool below, now and as the watch gains pools.
    pub fn admit(&self, tenant: &Weak<dyn Tenant>) {
        let pools = {
            let mut state = self.0.state.lock();
            state.tenants.retain(|t| t.strong_count() > 0);
            state.tenants.push(tenant.clone());
            state.pools.clone()
        };
        for pool in pools.iter() {
            pool.admit(tenant.clone());
        }
    }

    /// A block starting at `addr` was freed above: its tags go (nothing while no block in the
    /// process is tagged).
    #[inline]
    pub fn forget(&self, addr: usize) {
        if super::index::any_tagged() {
            for s in self.pools().iter() {
                s.forget(addr);
            }
        }
    }

    /// The smallest live block holding `addr` in any pool below, and that pool.
    pub fn block_at(&self, addr: usize) -> Option<(ByteRange, Arc<dyn MovingPool>)> {
        self.pools()
            .iter()
            .filter_map(|s| s.block_at(addr).map(|b| (b, s.clone())))
            .min_by_key(|((_, size), _)| *size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::host_pages::mapped::PromoteReport;
    use crate::resource::sleep::{
        Movement, SleepEstimate, SleepPlan, SleepReport, SleepTag, Sleeper, Spiller,
    };
    use crate::resource::SpillFigures;

    #[derive(Debug)]
    struct FakePool {
        id: usize,
        tenants: Mutex<Vec<Weak<dyn Tenant>>>,
    }

    impl Sleeper for FakePool {
        fn identity(&self) -> usize {
            self.id
        }
        fn place(&self) -> crate::pressure::Place {
            crate::pressure::Place::Simulated(self.id)
        }
        fn asleep(&self) -> bool {
            false
        }
        fn movement(&self) -> Movement {
            Movement::default()
        }
        fn admit(&self, tenant: Weak<dyn Tenant>) {
            self.tenants.lock().push(tenant);
        }
        fn block_at(&self, _addr: usize) -> Option<(usize, usize)> {
            None
        }
        fn tag(&self, _block: (usize, usize), _tag: SleepTag) {}
        fn forget(&self, _addr: usize) {}
        fn offload(&self, _plan: &SleepPlan) -> Result<SleepEstimate> {
            Ok(SleepEstimate::default())
        }
        fn wake(&self, _cause: Option<crate::resource::sleep::SleepCause>) -> Result<bool> {
            Ok(true)
        }
        fn estimate(&self, _plan: &SleepPlan) -> SleepEstimate {
            SleepEstimate::default()
        }
        fn prepare(&self) -> Result<usize> {
            Ok(0)
        }
        fn keep_ready(&self, _on: bool) -> Result<usize> {
            Ok(0)
        }
        fn last_sleep(&self) -> Option<SleepReport> {
            None
        }
    }

    impl Spiller for FakePool {
        fn promote(&self, _r: Option<ByteRange>, _l: Option<usize>) -> Result<PromoteReport> {
            Ok(PromoteReport::default())
        }
        fn spill_figures(&self) -> Option<SpillFigures> {
            None
        }
    }

    struct FakeTenant;
    impl Tenant for FakeTenant {
        fn segments(&self) -> Vec<crate::report::SegmentInfo> {
            Vec::new()
        }
    }

    fn pool(id: usize) -> Arc<FakePool> {
        Arc::new(FakePool {
            id,
            tenants: Mutex::new(Vec::new()),
        })
    }

    #[test]
    fn an_empty_watch_is_awake_and_joins_dedup() {
        let w = SleepWatch::default();
        assert!(w.is_empty() && !w.asleep());
        assert!(w.check("pool", 8).is_ok());
        assert!(SleepWatch::join([&w, &w]).is_empty());
        let a = pool(1);
        let one = SleepWatch::of(a.clone());
        let both = SleepWatch::join([&one, &one]);
        assert_eq!(both.pools().len(), 1, "the same pool once");
    }

    /// Issue 46's "a tag added later": a suballocator built over a tagged resource before a tag
    /// was added sees the tag's pool, and is its tenant.
    #[test]
    fn a_part_added_later_reaches_every_watch_above_and_its_tenants() {
        let first = pool(1);
        let tagged = SleepWatch::join([&SleepWatch::of(first.clone())]);
        // A pool over the tagged resource, an adaptor over that, and a join over both.
        let suballocator = tagged.clone();
        let tenant: Arc<dyn Tenant> = Arc::new(FakeTenant);
        suballocator.admit(&Arc::downgrade(&tenant));
        let other = SleepWatch::default();
        let top = SleepWatch::join([&suballocator, &other]);
        assert_eq!(first.tenants.lock().len(), 1);
        let late = pool(2);
        tagged.add_part(&SleepWatch::of(late.clone()));
        let ids: Vec<usize> = top.pools().iter().map(|p| p.identity()).collect();
        assert_eq!(ids, vec![1, 2], "the join above sees the late pool");
        assert!(!suballocator.is_empty());
        assert_eq!(
            late.tenants.lock().len(),
            1,
            "the tenant was admitted to the late pool"
        );
        // Deep stacks settle without recursion.
        let mut w = SleepWatch::default();
        for _ in 0..1_000 {
            w = SleepWatch::join([&w]);
        }
        let bottom_pool = pool(3);
        let bottom = SleepWatch::default();
        let mut w2 = bottom.clone();
        for _ in 0..1_000 {
            w2 = SleepWatch::join([&w2]);
        }
        bottom.add_part(&SleepWatch::of(bottom_pool));
        assert_eq!(w2.pools().len(), 1);
    }
}
