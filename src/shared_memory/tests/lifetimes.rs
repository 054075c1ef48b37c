//! Lifetimes against a model, on a live exporter and importers over real sockets.
//!
//! The exporter hands out blocks of one memory file from a free list (the allocator), writes
//! each new block's own pattern, and exports it under a new name; it frees names at random,
//! giving the block back to the free list in the free's callback. Three importers resolve,
//! release and die (their socket closes without a word) at random.
//!
//! Invariants, checked after every step:
//! 1. A block an importer holds is not in the free list, and reads, through the importer's map,
//!    the pattern written when it was exported: it was not reused.
//! 2. A free runs at once exactly when no importer holds the name; otherwise it waits, and the
//!    figures count it, until the last holder releases or dies.
//! 3. Every block is in the free list, exported, or freed and waiting: none is lost.
//!
//! At the end every importer dies, and every freed block is back in the free list.

use super::super::*;
use super::{bytes_at, pattern, TempLedger};
use parking_lot::Mutex;
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

const BLOCKS: usize = 10;
const BLOCK: u64 = 4096;
const IMPORTERS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    /// The exporter exports a new block.
    Export,
    /// The exporter frees an exported name.
    Free(prop::sample::Index),
    /// An importer resolves an exported name.
    Resolve(usize, prop::sample::Index),
    /// An importer releases a name it holds.
    Release(usize, prop::sample::Index),
    /// An importer dies (its socket closes), and another takes its place.
    Die(usize),
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Export),
        2 => any::<prop::sample::Index>().prop_map(Op::Free),
        4 => (0..IMPORTERS, any::<prop::sample::Index>()).prop_map(|(i, n)| Op::Resolve(i, n)),
        2 => (0..IMPORTERS, any::<prop::sample::Index>()).prop_map(|(i, n)| Op::Release(i, n)),
        1 => (0..IMPORTERS).prop_map(Op::Die),
    ]
}

/// A name as the model knows it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Block {
    name: String,
    slot: usize,
    stamp: u64,
}

struct World {
    _ledger: TempLedger,
    exp: Exporter,
    segment: SegmentId,
    free_list: Arc<Mutex<Vec<usize>>>,
    exported: Vec<Block>,
    /// Freed while held: waiting for their holders.
    waiting: BTreeSet<Block>,
    importers: Vec<Attachment>,
    holds: Vec<Vec<(Block, Resolved)>>,
    next: u64,
}

impl World {
    fn new() -> World {
        let ledger = TempLedger::new("lifetimes");
        let exp = Exporter::in_ledger(&ledger.dir, "e", ExportOptions::default()).unwrap();
        let segment = exp.add_segment(MemfdSegment::new(BLOCK * BLOCKS as u64, true).unwrap());
        let importers = (0..IMPORTERS)
            .map(|_| Attachment::in_ledger(&ledger.dir, "e", AttachOptions::default()).unwrap())
            .collect();
        World {
            _ledger: ledger,
            exp,
            segment,
            free_list: Arc::new(Mutex::new((0..BLOCKS).rev().collect())),
            exported: Vec::new(),
            waiting: BTreeSet::new(),
            importers,
            holds: vec![Vec::new(); IMPORTERS],
            next: 0,
        }
    }

    fn held_by_anyone(&self, name: &str) -> bool {
        self.holds.iter().flatten().any(|(b, _)| b.name == name)
    }

    fn leases(&self) -> u64 {
        self.holds.iter().map(|h| h.len() as u64).sum()
    }

    /// Waits until the exporter has seen every importer's socket as the model has it, and
    /// has run the frees that no longer wait (a dead importer's run on the exporter's thread
    /// just after its figures change).
    fn settle(&self) -> bool {
        let leases = self.leases();
        let waiting = self.waiting.len() as u64;
        let accounted = BLOCKS - self.exported.len() - self.waiting.len();
        self.exp.wait_for(Duration::from_secs(5), |f| {
            f.importers == IMPORTERS as u64
                && f.leases == leases
                && f.deferred_frees == waiting
                && self.free_list.lock().len() == accounted
        })
    }

    fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Export => {
                let Some(slot) = self.free_list.lock().pop() else {
                    return Ok(());
                };
                self.next += 1;
                let block = Block {
                    name: format!("b{}", self.next),
                    slot,
                    stamp: self.next,
                };
                let seg = self.exp.segment(self.segment).unwrap();
                let offset = slot as u64 * BLOCK;
                seg.host()
                    .unwrap()
                    .write(offset, &pattern(block.stamp, BLOCK as usize))
                    .unwrap();
                self.exp
                    .publish(&block.name, bytes_at(self.segment, offset, BLOCK, false))
                    .unwrap();
                self.exported.push(block);
            }
            Op::Free(i) => {
                if self.exported.is_empty() {
                    return Ok(());
                }
                let block = self.exported.remove(i.index(self.exported.len()));
                let free_list = self.free_list.clone();
                let slot = block.slot;
                let outcome = self
                    .exp
                    .free(&block.name, move || free_list.lock().push(slot))
                    .unwrap();
                let held = self.held_by_anyone(&block.name);
                prop_assert_eq!(matches!(outcome, FreeOutcome::Now), !held);
                if held {
                    self.waiting.insert(block);
                }
            }
            Op::Resolve(k, i) => {
                if self.exported.is_empty() {
                    return Ok(());
                }
                let block = self.exported[i.index(self.exported.len())].clone();
                let r = self.importers[k].resolve(&block.name).unwrap();
                if !self.holds[k].iter().any(|(b, _)| *b == block) {
                    self.holds[k].push((block, r));
                }
            }
            Op::Release(k, i) => {
                if self.holds[k].is_empty() {
                    return Ok(());
                }
                let at = i.index(self.holds[k].len());
                let (block, _) = self.holds[k].remove(at);
                prop_assert_eq!(self.importers[k].release(&[&block.name]).unwrap(), 1);
                self.forget_if_free(&block);
            }
            Op::Die(k) => {
                let path = self.exp.path().to_path_buf();
                self.importers[k] = Attachment::attach(&path, AttachOptions::default()).unwrap();
                for (block, _) in std::mem::take(&mut self.holds[k]) {
                    self.forget_if_free(&block);
                }
            }
        }
        prop_assert!(
            self.settle(),
            "the exporter's figures: {:?}",
            self.exp.figures()
        );
        self.check()
    }

    fn forget_if_free(&mut self, block: &Block) {
        if !self.held_by_anyone(&block.name) {
            self.waiting.remove(block);
        }
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let free: BTreeSet<usize> = self.free_list.lock().iter().copied().collect();
        for (k, holds) in self.holds.iter().enumerate() {
            for (block, r) in holds {
                prop_assert!(!free.contains(&block.slot), "{:?} held and free", block);
                prop_assert_eq!(
                    self.importers[k].read(r).unwrap(),
                    pattern(block.stamp, BLOCK as usize),
                    "{:?} reused while importer {} maps it",
                    block,
                    k
                );
            }
        }
        let mut slots: Vec<usize> = free.iter().copied().collect();
        slots.extend(self.exported.iter().map(|b| b.slot));
        slots.extend(self.waiting.iter().map(|b| b.slot));
        slots.sort_unstable();
        prop_assert_eq!(slots, (0..BLOCKS).collect::<Vec<_>>(), "every block once");
        let f = self.exp.figures();
        prop_assert_eq!(f.names, self.exported.len() as u64);
        prop_assert_eq!(f.deferred_frees, self.waiting.len() as u64);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn no_block_is_reused_while_an_importer_maps_it(ops in prop::collection::vec(any_op(), 1..60)) {
        let mut world = World::new();
        for op in ops {
            world.step(op)?;
        }
        // Every importer dies: every free that waited runs.
        for k in 0..IMPORTERS {
            world.step(Op::Die(k))?;
        }
        prop_assert!(world.waiting.is_empty());
        prop_assert_eq!(world.free_list.lock().len(), BLOCKS - world.exported.len());
        let f = world.exp.figures();
        prop_assert_eq!(f.deferred_total, f.frees_after_wait);
    }
}
