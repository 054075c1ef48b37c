//! A shareable pool's blocks against a model, with importers over real sockets.
//!
//! The exporter allocates blocks of one to three pages' worth from the pool (each filled with
//! its own pattern), names them, frees them and trims the pool at random; three importers
//! resolve, release and die (their socket closes without a word) at random.
//!
//! Invariants, checked after every step:
//! 1. A block an importer holds is not reused: no block the pool hands out overlaps it, and it
//!    reads, through the importer's map, the pattern written when it was allocated.
//! 2. Its pages stay mapped in the exporter, whatever the trims; a block named later on a page
//!    exported before reads bit-exact too (the page was not made again under the importers).
//! 3. A free of a held block waits (the figures count it) until the last holder releases or
//!    dies; then the block goes back to the pool.
//!
//! At the end every importer dies, every free has run, and nothing is allocated.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

const IMPORTERS: usize = 3;
const SIZES: [usize; 4] = [4096, PAGE / 2, PAGE + 4096, 2 * PAGE + 100];

#[derive(Debug, Clone)]
enum Op {
    Alloc(usize),
    Name(prop::sample::Index),
    Free(prop::sample::Index),
    Trim,
    Resolve(usize, prop::sample::Index),
    Release(usize, prop::sample::Index),
    Die(usize),
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..SIZES.len()).prop_map(Op::Alloc),
        3 => any::<prop::sample::Index>().prop_map(Op::Name),
        2 => any::<prop::sample::Index>().prop_map(Op::Free),
        2 => Just(Op::Trim),
        4 => (0..IMPORTERS, any::<prop::sample::Index>()).prop_map(|(i, n)| Op::Resolve(i, n)),
        2 => (0..IMPORTERS, any::<prop::sample::Index>()).prop_map(|(i, n)| Op::Release(i, n)),
        1 => (0..IMPORTERS).prop_map(Op::Die),
    ]
}

/// A block as the model knows it.
#[derive(Debug)]
struct Modeled {
    ptr: usize,
    size: usize,
    seed: u64,
    /// Its names while exported (withdrawn at the free).
    names: Vec<String>,
    /// Freed by the exporter (its free waits for holders).
    freed: bool,
}

struct World {
    pool: ExpandableMemoryResource,
    vm: Arc<HostVirtualMemory>,
    publication: PoolExport,
    blocks: Vec<Modeled>,
    importers: Vec<Option<Attachment>>,
    /// Each importer's held names and what they resolved to.
    held: Vec<BTreeMap<String, Resolved>>,
    next: u64,
    _sock: TempSocket,
}

use crate::shared_memory::Resolved;

impl World {
    fn new() -> World {
        // A socket of its own per case (cases run one after another; the clock tells them apart).
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let sock = TempSocket::new(&format!("life{since_epoch}"));
        let (pool, vm) = pool(64);
        let publication = pool
            .publish(&sock.path(), ExportOptions::default())
            .unwrap();
        World {
            pool,
            vm,
            publication,
            blocks: Vec::new(),
            importers: (0..IMPORTERS).map(|_| None).collect(),
            held: vec![BTreeMap::new(); IMPORTERS],
            next: 0,
            _sock: sock,
        }
    }

    fn holders_of(&self, block: &Modeled) -> usize {
        self.held
            .iter()
            .filter(|h| h.keys().any(|n| block.names.contains(n)))
            .count()
    }

    /// Drops the blocks freed that nobody holds now: their frees ran.
    fn settle(&mut self) {
        let held: Vec<bool> = self.blocks.iter().map(|b| self.holders_of(b) > 0).collect();
        let mut i = 0;
        self.blocks.retain(|b| {
            let keep = !b.freed || held[i];
            i += 1;
            keep
        });
    }

    /// The blocks not freed, by index.
    fn live(&self) -> Vec<usize> {
        (0..self.blocks.len())
            .filter(|&k| !self.blocks[k].freed)
            .collect()
    }

    fn waiting(&self) -> u64 {
        self.blocks.iter().filter(|b| b.freed).count() as u64
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Alloc(s) => {
                let size = SIZES[s];
                let ptr = self.pool.allocate(size, Stream::DEFAULT).unwrap();
                for b in &self.blocks {
                    assert!(
                        ptr + size <= b.ptr || ptr >= b.ptr + b.size,
                        "a block in use or held was handed out again"
                    );
                }
                self.next += 1;
                fill(ptr, &pattern(self.next, size));
                self.blocks.push(Modeled {
                    ptr,
                    size,
                    seed: self.next,
                    names: Vec::new(),
                    freed: false,
                });
            }
            Op::Name(i) => {
                let live = self.live();
                if live.is_empty() {
                    return;
                }
                let b = &mut self.blocks[live[i.index(live.len())]];
                self.next += 1;
                let name = format!("n{}", self.next);
                self.publication
                    .name(&name, b.ptr, b.size, "|u1", &[b.size as u64], false)
                    .unwrap();
                b.names.push(name);
            }
            Op::Free(i) => {
                let live = self.live();
                if live.is_empty() {
                    return;
                }
                let k = live[i.index(live.len())];
                let (ptr, size) = (self.blocks[k].ptr, self.blocks[k].size);
                free(&self.pool, ptr, size);
                self.blocks[k].freed = true;
                self.settle();
            }
            Op::Trim => {
                self.pool.trim(0).unwrap();
            }
            Op::Resolve(j, i) => {
                let names: Vec<String> = self
                    .blocks
                    .iter()
                    .filter(|b| !b.freed)
                    .flat_map(|b| b.names.iter().cloned())
                    .collect();
                if names.is_empty() {
                    return;
                }
                let name = names[i.index(names.len())].clone();
                let path = self.publication.path().unwrap();
                let imp = self.importers[j].get_or_insert_with(|| attach(&path));
                let r = imp.resolve(&name).unwrap();
                self.held[j].insert(name, r);
            }
            Op::Release(j, i) => {
                let Some(imp) = self.importers[j].as_mut() else {
                    return;
                };
                let names: Vec<String> = self.held[j].keys().cloned().collect();
                if names.is_empty() {
                    return;
                }
                let name = names[i.index(names.len())].clone();
                imp.release(&[name.as_str()]).unwrap();
                self.held[j].remove(&name);
                self.settle();
            }
            Op::Die(j) => {
                if self.importers[j].take().is_some() {
                    self.held[j].clear();
                    self.settle();
                    let live = self.importers.iter().flatten().count() as u64;
                    wait(&self.pool, |f| f.export.importers == live);
                }
            }
        }
        self.check();
    }

    fn check(&self) {
        // The frees of dead importers' blocks run on the exporter's thread: waited for.
        let waiting = self.waiting();
        wait(&self.pool, |f| f.deferred_free_blocks == waiting);
        let runs = self.vm.runs();
        for (j, held) in self.held.iter().enumerate() {
            let Some(imp) = &self.importers[j] else {
                continue;
            };
            for (name, r) in held {
                let b = self
                    .blocks
                    .iter()
                    .find(|b| b.names.contains(name))
                    .expect("a held name's block is known");
                assert_eq!(
                    imp.read(r).unwrap(),
                    pattern(b.seed, b.size),
                    "importer {j} reads {name} bit-exact"
                );
                let page = self.pool.page_size();
                for p in (b.ptr / page * page..b.ptr + b.size).step_by(page) {
                    assert!(
                        runs.iter().any(|&(s, l)| s <= p && p + page <= s + l),
                        "a held page was unmapped"
                    );
                }
            }
        }
        // The exporter's own view of live blocks is unchanged too.
        for b in self.blocks.iter().filter(|b| !b.freed) {
            assert_eq!(
                peek(b.ptr, b.size.min(4096)),
                pattern(b.seed, b.size.min(4096))
            );
        }
    }

    fn finish(mut self) {
        for j in 0..IMPORTERS {
            self.step(Op::Die(j));
        }
        let live: Vec<(usize, usize)> = self
            .blocks
            .iter()
            .filter(|b| !b.freed)
            .map(|b| (b.ptr, b.size))
            .collect();
        for (ptr, size) in live {
            free(&self.pool, ptr, size);
        }
        wait(&self.pool, |f| f.deferred_free_blocks == 0);
        assert_eq!(allocated(&self.pool), 0, "every free ran");
        self.publication.close();
        self.pool.trim(0).unwrap();
        assert_eq!(self.pool.mapped_bytes(), 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn leased_blocks_are_never_reused_or_unmapped(ops in prop::collection::vec(any_op(), 1..40)) {
        let mut world = World::new();
        for op in ops {
            world.step(op);
        }
        world.finish();
    }
}
