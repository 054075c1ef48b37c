//! A failed allocation leaves a resource exactly as it was, whatever the size asked for.
//!
//! Random sequences of ordinary allocations, frees, releases and absurd requests (sizes near
//! the end of the address space, where page or block rounding overflows) on every growth-based
//! suballocator over simulated memory. After every step:
//! 1. an absurd request is an out-of-memory error (never a logic error, never a panic);
//! 2. the figures add up: what the resource says it holds is what the upstream (or the
//!    virtual memory) charged for it, up to the device's granules; free bytes are at most that,
//!    and the largest free block at most the free bytes; there is a free block exactly when
//!    there are free bytes;
//! 3. a failed request changes neither what the resource holds nor what the source charged;
//!
//! and after the sequence every live block is freed, an ordinary allocation succeeds, and a
//! release gives everything back.

use proptest::prelude::*;
use rrmm::resource::{SimulatedVirtualMemory, VirtualMemory, DEFAULT_PAGE_SIZE};
use rrmm::{
    ArenaMemoryResource, BinningMemoryResource, ExpandableMemoryResource, ExpandableSizes,
    FixedSizeMemoryResource, Footprint, MemoryResource, PoolMemoryResource,
    SimulatedMemoryResource, Stream,
};
use std::sync::Arc;

const MIB: usize = 1 << 20;
const CAPACITY: usize = 256 * MIB;

/// Sizes no allocation can have: 2^63, the last page and block below 2^64, the largest
/// address, more than the device, and the first size past the address space's last 256 bytes.
const ABSURD: [usize; 8] = [
    1 << 63,
    usize::MAX - 4095,
    usize::MAX - 255,
    usize::MAX,
    (1 << 63) + 1,
    usize::MAX - (2 << 20) + 1,
    CAPACITY + 1,
    1 << 62,
];

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize),
    Absurd(usize),
    Free(usize),
    Release,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => (1..=8 * MIB).prop_map(Op::Alloc),
        3 => (0..ABSURD.len()).prop_map(|i| Op::Absurd(ABSURD[i])),
        2 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Release),
    ];
    proptest::collection::vec(op, 1..60)
}

/// A resource under test with what it needs for the figures.
struct Subject {
    mr: Arc<dyn MemoryResource>,
    /// Bytes the source of memory has handed to the resource.
    source_used: Box<dyn Fn() -> usize>,
    release: Box<dyn Fn()>,
    /// Largest ordinary request it serves.
    max_request: usize,
}

fn simulated() -> Arc<SimulatedMemoryResource> {
    Arc::new(SimulatedMemoryResource::new(CAPACITY))
}

fn used_of(up: &Arc<SimulatedMemoryResource>) -> Box<dyn Fn() -> usize> {
    let up = up.clone();
    Box::new(move || up.bytes_in_use())
}

fn subject(kind: usize) -> Subject {
    match kind {
        0 => {
            let up = simulated();
            let mr = PoolMemoryResource::new(up.clone(), Some(16 * MIB), None).unwrap();
            Subject {
                mr: Arc::new(mr.clone()),
                source_used: used_of(&up),
                release: Box::new(move || {
                    mr.release().unwrap();
                }),
                max_request: usize::MAX,
            }
        }
        1 => {
            let up = simulated();
            let mr = ArenaMemoryResource::new(up.clone(), Some(128 * MIB), false).unwrap();
            Subject {
                mr: Arc::new(mr),
                source_used: used_of(&up),
                release: Box::new(|| {}),
                max_request: usize::MAX,
            }
        }
        2 => {
            let up = simulated();
            let mr = BinningMemoryResource::with_blocks(up.clone(), Some(10), Some(22), 4).unwrap();
            Subject {
                mr: Arc::new(mr),
                source_used: used_of(&up),
                release: Box::new(|| {}),
                // Larger requests go to the upstream itself, outside the bins' books.
                max_request: 4 * MIB,
            }
        }
        3 => {
            let up = simulated();
            let mr = FixedSizeMemoryResource::new(up.clone(), MIB, 4).unwrap();
            Subject {
                mr: Arc::new(mr),
                source_used: used_of(&up),
                release: Box::new(|| {}),
                max_request: MIB,
            }
        }
        _ => {
            let vm = Arc::new(
                SimulatedVirtualMemory::new(CAPACITY, 4 * CAPACITY, DEFAULT_PAGE_SIZE).unwrap(),
            );
            let mr = ExpandableMemoryResource::new(vm.clone(), ExpandableSizes::default()).unwrap();
            Subject {
                mr: Arc::new(mr.clone()),
                source_used: Box::new(move || vm.mapped_bytes()),
                release: Box::new(move || {
                    mr.trim(0).unwrap();
                }),
                max_request: usize::MAX,
            }
        }
    }
}

const NAMES: [&str; 5] = ["pool", "arena", "binning", "fixed_size", "expandable"];

fn figures(s: &Subject) -> (usize, Footprint) {
    let report = s.mr.report().expect("a suballocator reports");
    ((s.source_used)(), report.footprint())
}

fn check(s: &Subject, name: &str) -> Result<(), TestCaseError> {
    let (used, f) = figures(s);
    // The simulated device charges whole granules, so it may count more than was asked of it.
    prop_assert!(
        f.held_bytes <= used,
        "{}: held {} of the source's {}",
        name,
        f.held_bytes,
        used
    );
    prop_assert_eq!(
        f.held_bytes == 0,
        used == 0,
        "{}: held {} of {}",
        name,
        f.held_bytes,
        used
    );
    prop_assert!(f.free_bytes <= f.held_bytes, "{}: {:?}", name, f);
    prop_assert!(f.largest_free_block <= f.free_bytes, "{}: {:?}", name, f);
    prop_assert_eq!(f.free_blocks == 0, f.free_bytes == 0, "{}: {:?}", name, f);
    Ok(())
}

fn run(kind: usize, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let s = subject(kind);
    let name = NAMES[kind];
    let mut live: Vec<(usize, usize)> = Vec::new();
    for op in ops {
        match op {
            Op::Alloc(bytes) => {
                let bytes = bytes.min(s.max_request);
                match s.mr.allocate(bytes, Stream::DEFAULT) {
                    Ok(p) => live.push((p, bytes)),
                    Err(e) => prop_assert!(e.is_out_of_memory(), "{}: {}", name, e),
                }
            }
            Op::Absurd(bytes) => {
                let before = figures(&s);
                let e = s.mr.allocate(bytes, Stream::DEFAULT).unwrap_err();
                prop_assert!(e.is_out_of_memory(), "{}: {} bytes: {}", name, bytes, e);
                let after = figures(&s);
                prop_assert_eq!(before.0, after.0, "{}: a failed request grew", name);
                prop_assert_eq!(
                    before.1.held_bytes,
                    after.1.held_bytes,
                    "{}: a failed request changed the books",
                    name
                );
            }
            Op::Free(pick) if !live.is_empty() => {
                let (p, bytes) = live.swap_remove(pick % live.len());
                // SAFETY: simulated memory, allocated above with this size on this stream.
                unsafe { s.mr.deallocate(p, bytes, Stream::DEFAULT) }.unwrap();
            }
            Op::Free(_) => {}
            Op::Release => (s.release)(),
        }
        check(&s, name)?;
    }
    for (p, bytes) in live.drain(..) {
        // SAFETY: as above.
        unsafe { s.mr.deallocate(p, bytes, Stream::DEFAULT) }.unwrap();
    }
    let p =
        s.mr.allocate(s.max_request.min(4 * MIB), Stream::DEFAULT)
            .unwrap_or_else(|e| panic!("{name}: an ordinary allocation after the sequence: {e}"));
    // SAFETY: as above.
    unsafe {
        s.mr.deallocate(p, s.max_request.min(4 * MIB), Stream::DEFAULT)
    }
    .unwrap();
    check(&s, name)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn failed_requests_leave_every_suballocator_as_it_was(kind in 0..5usize, ops in ops()) {
        run(kind, ops)?;
    }
}

/// The sequence on the expandable pool: after 2^63, then 2^64 - 4096 bytes (both out of
/// memory), every later allocation said "page 0 is already mapped" (the page rounding of the
/// second wrapped to zero bytes, and an empty mapping was recorded at the base).
#[test]
fn expandable_works_after_two_huge_failed_allocations() {
    for (kind, name) in NAMES.iter().enumerate() {
        let s = subject(kind);
        for bytes in [1usize << 63, usize::MAX - 4095] {
            let e = s.mr.allocate(bytes, Stream::DEFAULT).unwrap_err();
            assert!(e.is_out_of_memory(), "{name}: {bytes}: {e}");
        }
        let p =
            s.mr.allocate(MIB, Stream::DEFAULT)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        // SAFETY: simulated memory, allocated just above.
        unsafe { s.mr.deallocate(p, MIB, Stream::DEFAULT) }.unwrap();
    }
}

/// Every resource kind of `rrmm replay` (managed cache and pinned kinds included), built on a
/// simulated device: absurd requests are out of memory, change nothing the resource holds, and
/// an ordinary allocation works after them.
#[test]
fn every_kind_survives_absurd_requests() {
    let options = rrmm::replay::ResourceOptions::default();
    for name in rrmm::replay::resource_names() {
        let built = match rrmm::replay::build(name, Some(1 << 30), &options) {
            Ok(b) => b,
            // Kinds that need a GPU (cuda, cuda_async, pinned) are not built on CPU.
            Err(e) => {
                eprintln!("{name}: not built here: {e}");
                continue;
            }
        };
        let mr = &built.resource;
        let held = || mr.report().map(|r| r.held_bytes());
        let before = held();
        for bytes in ABSURD.into_iter().filter(|&b| b > (1 << 30)) {
            match mr.allocate(bytes, Stream::DEFAULT) {
                Err(e) => assert!(e.is_out_of_memory(), "{name}: {bytes}: {e}"),
                Ok(p) => panic!("{name}: {bytes} bytes allocated at {p:#x}"),
            }
            assert_eq!(
                held(),
                before,
                "{name}: {bytes}: a failed request changed the books"
            );
        }
        let p = mr
            .allocate(MIB, Stream::DEFAULT)
            .unwrap_or_else(|e| panic!("{name}: after absurd requests: {e}"));
        // SAFETY: simulated memory, allocated just above.
        unsafe { mr.deallocate(p, MIB, Stream::DEFAULT) }.unwrap();
    }
}
