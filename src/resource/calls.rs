//! What calls into a resource may do (the GIL decision), as a field of its [`Link`](super::Link).
//!
//! A [`Calls`] is a shared cell holding a [`CallProfile`]. It is made once, with the link: a
//! source's is fixed ([`Calls::fixed`]); a resource that changes the profile (a suballocator's
//! [`CallProfile::suballocating`], an adaptor's own work, a resource over several) makes one
//! over its upstreams' ([`Calls::suballocating`], [`Calls::and`], [`Link::join`](super::Link::join)), and an adaptor that adds nothing shares its
//! upstream's. A reader holds the cell and pays one relaxed load per call ([`Calls::get`]).
//!
//! A profile can grow after construction: a binning resource gains a bin, a tagged resource a
//! tag ([`Calls::add_part`]). The cells made over a grown one are recomputed then, upwards, by a
//! work list (no recursion over a user's graph): a profile only ever gains what its parts gain
//! (the operations are monotone), so every cell settles after at most two raises of its own,
//! and a reader never keeps a profile smaller than its resource's (which could let a thread hold
//! the GIL while waiting for a lock whose holder needs it).

use super::above::Above;
use super::CallProfile;
use crate::sync::Mutex;
#[cfg(feature = "loom")]
use loom::sync::atomic::{AtomicU8, Ordering};
#[cfg(not(feature = "loom"))]
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

const FOREIGN: u8 = 1;
const BLOCKS: u8 = 2;

fn encode(p: CallProfile) -> u8 {
    (u8::from(p.calls_foreign_code) * FOREIGN) | (u8::from(p.may_block) * BLOCKS)
}

fn decode(bits: u8) -> CallProfile {
    CallProfile {
        calls_foreign_code: bits & FOREIGN != 0,
        may_block: bits & BLOCKS != 0,
    }
}

/// How a cell's profile is made from its parts'.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The parts' together, with the resource's own work.
    And(CallProfile),
    /// A suballocator's over its parts' ([`CallProfile::suballocating`]).
    Suballocating,
}

impl Step {
    fn apply(self, parts: CallProfile) -> CallProfile {
        match self {
            Step::And(own) => parts.and(own),
            Step::Suballocating => parts.suballocating(),
        }
    }
}

#[derive(Debug)]
struct Cell {
    bits: AtomicU8,
    step: Step,
    /// The cells this one is made from (held strongly: the resources below outlive the cell).
    parts: Mutex<Vec<Calls>>,
    /// The cells made from this one, recomputed when it grows.
    above: Above<Cell>,
}

impl Cell {
    fn compute(&self) -> u8 {
        let parts = self
            .parts
            .lock()
            .iter()
            .fold(CallProfile::QUICK, |p, c| p.and(c.get()));
        encode(self.step.apply(parts))
    }
}

/// What calls through a resource may do: a shared cell read with one load (see the module docs).
#[derive(Clone, Debug)]
pub struct Calls(Arc<Cell>);

impl Calls {
    /// A profile that never changes (a source's own).
    pub fn fixed(profile: CallProfile) -> Calls {
        Calls(Arc::new(Cell {
            bits: AtomicU8::new(encode(profile)),
            step: Step::And(profile),
            parts: Mutex::new(Vec::new()),
            above: Above::default(),
        }))
    }

    /// A profile made from `parts`' by `step`, recomputed whenever one of them grows. A new
    /// cell each time, so that [`add_part`](Calls::add_part) on it changes no other.
    pub(crate) fn over(parts: &[&Calls], step: Step) -> Calls {
        if step == Step::And(CallProfile::UNKNOWN) {
            // The largest profile: nothing below can add to it.
            return Calls::fixed(CallProfile::UNKNOWN);
        }
        let cell = Arc::new(Cell {
            bits: AtomicU8::new(0),
            step,
            parts: Mutex::new(parts.iter().map(|&c| c.clone()).collect()),
            above: Above::default(),
        });
        // Listen first, then compute: a part that grows meanwhile either finds this cell in its
        // list or grew before the computation read it (both under the list's lock). Or-ed in,
        // never stored: a part's growth may have raised this cell since the computation read
        // it (found by the loom model in `tests/loom_core.rs`).
        for part in parts {
            part.0.above.listen(&cell);
        }
        cell.bits.fetch_or(cell.compute(), Ordering::Relaxed);
        Calls(cell)
    }

    /// The profile of a resource over all of `parts` that adds no work of its own (a new cell,
    /// which may gain parts later: [`add_part`](Calls::add_part)).
    pub fn join(parts: &[&Calls]) -> Calls {
        Calls::over(parts, Step::And(CallProfile::QUICK))
    }

    /// The same profile with the resource's `own` work added: this cell itself where `own`
    /// adds nothing (an adaptor that only forwards), else a cell over it.
    pub fn and(&self, own: CallProfile) -> Calls {
        if own == CallProfile::QUICK {
            self.clone()
        } else {
            Calls::over(&[self], Step::And(own))
        }
    }

    /// A suballocator's profile over this one ([`CallProfile::suballocating`]).
    pub fn suballocating(&self) -> Calls {
        Calls::over(&[self], Step::Suballocating)
    }

    /// The profile now: one relaxed load.
    #[inline]
    pub fn get(&self) -> CallProfile {
        decode(self.0.bits.load(Ordering::Relaxed))
    }

    /// Makes `part` one of this cell's parts (a bin a binning resource gained), and recomputes
    /// this cell and every cell made from it whose profile grows.
    pub fn add_part(&self, part: &Calls) {
        self.0.parts.lock().push(part.clone());
        part.0.above.listen(&self.0);
        Self::settle(self.0.clone());
    }

    /// Recomputes `start`, and each cell above one that changed, until none changes.
    fn settle(start: Arc<Cell>) {
        let mut work = vec![start];
        while let Some(cell) = work.pop() {
            let bits = cell.compute();
            let old = cell.bits.fetch_or(bits, Ordering::Relaxed);
            if old | bits != old {
                work.extend(cell.above.cells());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_adaptor_that_adds_nothing_shares_the_cell_and_sees_it_grow() {
        let source = Calls::fixed(CallProfile::QUICK);
        let binning = Calls::over(&[&source], Step::And(CallProfile::QUICK));
        let statistics = binning.and(CallProfile::QUICK);
        let pool = statistics.suballocating();
        let logging = pool.and(CallProfile::BLOCKING);
        assert_eq!(pool.get(), CallProfile::QUICK);
        assert_eq!(logging.get(), CallProfile::BLOCKING);
        binning.add_part(&Calls::fixed(CallProfile::UNKNOWN));
        assert_eq!(statistics.get(), CallProfile::UNKNOWN);
        assert_eq!(
            pool.get(),
            CallProfile::UNKNOWN.suballocating(),
            "foreign code below a pool still counts"
        );
        assert_eq!(logging.get(), CallProfile::UNKNOWN);
        assert_eq!(source.get(), CallProfile::QUICK, "a part never changes");
    }

    #[test]
    fn a_dropped_cell_above_is_forgotten() {
        let source = Calls::over(&[], Step::And(CallProfile::QUICK));
        for _ in 0..100 {
            let _ = source.suballocating();
        }
        let _kept = source.suballocating();
        assert!(source.0.above.len() <= 2);
    }

    #[test]
    fn parts_added_from_many_threads_all_count() {
        let root = Calls::over(&[], Step::And(CallProfile::QUICK));
        let top = root.suballocating().and(CallProfile::QUICK);
        std::thread::scope(|s| {
            for i in 0..8 {
                let root = &root;
                s.spawn(move || {
                    let p = if i == 7 {
                        CallProfile::UNKNOWN
                    } else {
                        CallProfile::QUICK
                    };
                    root.add_part(&Calls::fixed(p));
                    let _ = root.suballocating();
                });
            }
        });
        assert_eq!(root.get(), CallProfile::UNKNOWN);
        assert_eq!(top.get(), CallProfile::UNKNOWN.suballocating());
    }

    fn profile() -> impl Strategy<Value = CallProfile> {
        (any::<bool>(), any::<bool>()).prop_map(|(f, b)| CallProfile {
            calls_foreign_code: f,
            may_block: b,
        })
    }

    #[derive(Clone, Debug)]
    enum Op {
        Fixed(CallProfile),
        Over(Vec<usize>, Option<CallProfile>),
        AddPart(usize, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            profile().prop_map(Op::Fixed),
            (
                proptest::collection::vec(any::<usize>(), 0..3),
                proptest::option::of(profile())
            )
                .prop_map(|(p, s)| Op::Over(p, s)),
            (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Op::AddPart(a, b)),
        ]
    }

    proptest! {
        /// Any graph of cells, grown in any order, reads what a fold over the graph computes.
        #[test]
        fn every_cell_reads_the_fold_of_its_graph(ops in proptest::collection::vec(op(), 1..40)) {
            // The model: each node's parts (indices of earlier nodes) and step.
            let mut model: Vec<(Vec<usize>, Step)> = Vec::new();
            let mut cells: Vec<Calls> = Vec::new();
            for op in ops {
                match op {
                    Op::Fixed(p) => {
                        model.push((Vec::new(), Step::And(p)));
                        cells.push(Calls::fixed(p));
                    }
                    Op::Over(parts, step) if !cells.is_empty() => {
                        let parts: Vec<usize> = parts.iter().map(|i| i % cells.len()).collect();
                        let step = step.map_or(Step::Suballocating, Step::And);
                        let refs: Vec<&Calls> = parts.iter().map(|&i| &cells[i]).collect();
                        let cell = Calls::over(&refs, step);
                        model.push((parts, step));
                        cells.push(cell);
                    }
                    // A cell gains parts only from cells made before it (no cycles).
                    Op::AddPart(a, b) if cells.len() >= 2 => {
                        let to = 1 + a % (cells.len() - 1);
                        let part = b % to;
                        cells[to].add_part(&cells[part]);
                        if model[to].1 != Step::And(CallProfile::UNKNOWN) {
                            model[to].0.push(part);
                        }
                    }
                    _ => {}
                }
                let mut want: Vec<CallProfile> = Vec::new();
                for (parts, step) in &model {
                    let below = parts.iter().fold(CallProfile::QUICK, |p, &i| p.and(want[i]));
                    want.push(step.apply(below));
                }
                for (i, c) in cells.iter().enumerate() {
                    prop_assert_eq!(c.get(), want[i], "cell {}", i);
                }
            }
        }
    }
}
