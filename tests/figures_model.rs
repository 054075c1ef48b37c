//! The figures a suballocator reports (free bytes, largest free block, free blocks,
//! fragmentation, snapshots) against a model of its state, after every step of random
//! sequences, and under threads.
//!
//! - pool and expandable (coalescing lists): the free regions are the gaps between live blocks
//!   inside each segment; free blocks of different streams' lists (or a freed block and fresh
//!   memory) that touch are one region, since a request of their joint size succeeds. So free
//!   bytes, the largest free block, the free block count and fragmentation are those of the
//!   gaps, and a pool whose memory is all free reports one block per segment and no
//!   fragmentation.
//! - binning (no coalescing): per bin, held minus live blocks, in blocks of the bin's size.
//! - arena: free bytes are the arena minus the live blocks, and an arena with nothing live
//!   reports no fragmentation.
//! - snapshots taken while other threads allocate and free (on their own streams and across
//!   streams) have segments whose blocks tile the segment exactly.

use proptest::prelude::*;
use rrmm::report::BlockState;
use rrmm::resource::{SimulatedVirtualMemory, DEFAULT_PAGE_SIZE};
use rrmm::{
    ArenaMemoryResource, BinningMemoryResource, ExpandableMemoryResource, ExpandableSizes,
    Footprint, MemoryResource, PoolMemoryResource, SegmentInfo, SimulatedMemoryResource, Stream,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const MIB: usize = 1 << 20;

fn stream(i: usize) -> Stream {
    match i {
        0 => Stream::DEFAULT,
        // SAFETY: a key only: simulated memory never passes it to the driver.
        _ => unsafe { Stream::from_raw(0x1000 + i) },
    }
}

fn round(bytes: usize) -> usize {
    bytes.div_ceil(256) * 256
}

/// Free bytes, largest free block and free blocks of the gaps between `live` blocks inside
/// `segments`.
fn gaps(segments: &[(usize, usize)], live: &BTreeMap<usize, usize>) -> (usize, usize, usize) {
    let (mut bytes, mut largest, mut count) = (0, 0, 0);
    for &(start, size) in segments {
        let end = start + size;
        let mut at = start;
        let mut gap = |from: usize, to: usize| {
            if to > from {
                bytes += to - from;
                largest = largest.max(to - from);
                count += 1;
            }
        };
        for (&addr, &len) in live.range(start..end) {
            gap(at, addr);
            at = addr + len;
        }
        gap(at, end);
    }
    (bytes, largest, count)
}

fn segments_of(mr: &dyn MemoryResource) -> Vec<(usize, usize)> {
    mr.report()
        .unwrap()
        .memory_snapshot()
        .unwrap()
        .iter()
        .map(|s| (s.address, s.total_size))
        .collect()
}

fn check_tiles(segments: &[SegmentInfo]) -> Result<(), String> {
    for s in segments {
        let mut at = s.address;
        for b in &s.blocks {
            if b.address != at {
                return Err(format!(
                    "segment {:#x}+{}: block at {:#x}, expected {at:#x}: {:?}",
                    s.address, s.total_size, b.address, s.blocks
                ));
            }
            at += b.size;
        }
        if at != s.address + s.total_size {
            return Err(format!(
                "segment {:#x}+{}: blocks add up to {}",
                s.address,
                s.total_size,
                at - s.address
            ));
        }
    }
    Ok(())
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { stream: usize, bytes: usize },
    Free { pick: usize, stream: usize },
}

fn ops(max: usize) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (0..3usize, 1..=max).prop_map(|(stream, bytes)| Op::Alloc { stream, bytes }),
        2 => (any::<usize>(), 0..3usize).prop_map(|(pick, stream)| Op::Free { pick, stream }),
    ];
    proptest::collection::vec(op, 1..80)
}

fn assert_figures(
    f: Footprint,
    want: (usize, usize, usize),
    what: &str,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(
        (f.free_bytes, f.largest_free_block, f.free_blocks),
        want,
        "{}: (free bytes, largest free block, free blocks)",
        what
    );
    let fragmentation = if want.0 == 0 {
        0.0
    } else {
        1.0 - want.1 as f64 / want.0 as f64
    };
    prop_assert!(
        (f.fragmentation() - fragmentation).abs() < 1e-12,
        "{}: {:?}",
        what,
        f
    );
    Ok(())
}

/// Runs `ops` on a coalescing suballocator, checking its figures against the gaps model.
fn run_coalescing(mr: &dyn MemoryResource, ops: Vec<Op>, what: &str) -> Result<(), TestCaseError> {
    // addr -> (requested, rounded)
    let mut live: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    for op in ops {
        match op {
            Op::Alloc { stream: s, bytes } => match mr.allocate(bytes, stream(s)) {
                Ok(p) => {
                    live.insert(p, (bytes, round(bytes)));
                }
                Err(e) => prop_assert!(e.is_out_of_memory(), "{}", e),
            },
            Op::Free { pick, stream: s } if !live.is_empty() => {
                let addr = *live.keys().nth(pick % live.len()).unwrap();
                let (bytes, _) = live.remove(&addr).unwrap();
                // SAFETY: simulated memory, allocated above with this size.
                unsafe { mr.deallocate(addr, bytes, stream(s)) }.unwrap();
            }
            Op::Free { .. } => {}
        }
        let sizes: BTreeMap<usize, usize> = live.iter().map(|(&a, &(_, r))| (a, r)).collect();
        let segments = segments_of(mr);
        let f = mr.report().unwrap().footprint();
        assert_figures(f, gaps(&segments, &sizes), what)?;
        let snapshot = mr.report().unwrap().memory_snapshot().unwrap();
        check_tiles(&snapshot).map_err(TestCaseError::fail)?;
        let free_in_snapshot = snapshot
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == BlockState::Free)
            .count();
        prop_assert_eq!(
            free_in_snapshot,
            f.free_blocks,
            "{}: snapshot's free blocks",
            what
        );
    }
    Ok(())
}

fn pool() -> PoolMemoryResource {
    let up = Arc::new(SimulatedMemoryResource::new(64 * MIB));
    PoolMemoryResource::new(up, Some(4 * MIB), None).unwrap()
}

fn expandable() -> ExpandableMemoryResource {
    let vm = Arc::new(SimulatedVirtualMemory::new(64 * MIB, 256 * MIB, DEFAULT_PAGE_SIZE).unwrap());
    ExpandableMemoryResource::new(vm, ExpandableSizes::default()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn pool_figures_follow_the_model(ops in ops(3 * MIB)) {
        run_coalescing(&pool(), ops, "pool")?;
    }

    #[test]
    fn expandable_figures_follow_the_model(ops in ops(3 * MIB)) {
        run_coalescing(&expandable(), ops, "expandable")?;
    }

    #[test]
    fn binning_figures_follow_the_model(ops in ops(64 << 10)) {
        let up = Arc::new(SimulatedMemoryResource::new(256 * MIB));
        let mr = BinningMemoryResource::with_blocks(up, Some(10), Some(16), 8).unwrap();
        let mut live: BTreeMap<usize, usize> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Alloc { stream: s, bytes } => {
                    let p = mr.allocate(bytes, stream(s)).unwrap();
                    live.insert(p, bytes);
                }
                Op::Free { pick, stream: s } if !live.is_empty() => {
                    let addr = *live.keys().nth(pick % live.len()).unwrap();
                    let bytes = live.remove(&addr).unwrap();
                    // SAFETY: simulated memory, allocated above with this size.
                    unsafe { mr.deallocate(addr, bytes, stream(s)) }.unwrap();
                }
                Op::Free { .. } => {}
            }
            let (mut free, mut largest, mut count) = (0, 0, 0);
            for (size, bin) in mr.bins() {
                let held = bin.report().unwrap().footprint().held_bytes;
                let smaller =
                    mr.bins().iter().map(|(s, _)| *s).filter(|&s| s < size).max().unwrap_or(0);
                let in_bin = live.values().filter(|&&b| b > smaller && b <= size).count();
                let bin_free = held - in_bin * size;
                free += bin_free;
                count += bin_free / size;
                if bin_free > 0 {
                    largest = largest.max(size);
                }
            }
            assert_figures(mr.report().unwrap().footprint(), (free, largest, count), "binning")?;
        }
    }

    #[test]
    fn arena_figures_follow_the_model(ops in ops(3 * MIB)) {
        let up = Arc::new(SimulatedMemoryResource::new(256 * MIB));
        let mr = ArenaMemoryResource::new(up, Some(64 * MIB), false).unwrap();
        let mut live: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Alloc { stream: s, bytes } => match mr.allocate(bytes, stream(s)) {
                    Ok(p) => { live.insert(p, (bytes, round(bytes))); }
                    Err(e) => prop_assert!(e.is_out_of_memory(), "{}", e),
                },
                Op::Free { pick, stream: s } if !live.is_empty() => {
                    let addr = *live.keys().nth(pick % live.len()).unwrap();
                    let (bytes, _) = live.remove(&addr).unwrap();
                    // SAFETY: simulated memory, allocated above with this size.
                    unsafe { mr.deallocate(addr, bytes, stream(s)) }.unwrap();
                }
                Op::Free { .. } => {}
            }
            let f = mr.report().unwrap().footprint();
            let used: usize = live.values().map(|&(_, r)| r).sum();
            prop_assert_eq!(f.free_bytes, f.held_bytes - used);
            prop_assert!(f.largest_free_block <= f.free_bytes);
            prop_assert_eq!(f.free_blocks == 0, f.free_bytes == 0);
            if live.is_empty() {
                prop_assert_eq!(f.largest_free_block, f.free_bytes, "arena all free: {:?}", f);
                prop_assert_eq!(f.free_blocks, 1, "arena all free: {:?}", f);
            }
        }
    }
}

/// The example: a 1 GiB pool on a 16 GiB device, 4,000,000 bytes allocated and freed,
/// reported two free blocks (the freed block on the stream's list, the fresh rest) and the
/// largest 1,069,741,824 of 1,073,741,824 free: fragmentation on a pool whose memory is all free.
#[test]
fn a_fully_free_pool_reports_one_block_and_no_fragmentation() {
    for s in [stream(0), stream(1), Stream::PER_THREAD] {
        let up = Arc::new(SimulatedMemoryResource::new(16 << 30));
        let mr = PoolMemoryResource::new(up, Some(1 << 30), None).unwrap();
        let p = mr.allocate(4_000_000, s).unwrap();
        // SAFETY: simulated memory, allocated just above.
        unsafe { mr.deallocate(p, 4_000_000, s) }.unwrap();
        let f = mr.report().unwrap().footprint();
        assert_eq!(
            (f.free_bytes, f.largest_free_block, f.free_blocks),
            (1 << 30, 1 << 30, 1)
        );
        assert_eq!(f.fragmentation(), 0.0);
    }
}

/// Snapshots (and footprints) taken while other threads allocate and free, on their own streams
/// and across streams: every segment is tiled exactly by its blocks, and free bytes never pass
/// what is held.
#[test]
fn snapshots_under_threads_are_consistent() {
    let pool = pool();
    let expandable = expandable();
    let resources: [Arc<dyn MemoryResource>; 2] = [Arc::new(pool), Arc::new(expandable)];
    for mr in resources {
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..3)
            .map(|t| {
                let (mr, stop) = (mr.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(t + 1);
                    let mut live: Vec<(usize, usize)> = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let bytes = (x as usize % (MIB / 2)) + 1;
                        if live.len() < 16 && x % 3 != 0 {
                            if let Ok(p) = mr.allocate(bytes, stream(t as usize)) {
                                live.push((p, bytes));
                            }
                        } else if !live.is_empty() {
                            let (p, b) = live.swap_remove(x as usize % live.len());
                            // Frees on another stream half of the time (a cross-stream free).
                            let on = stream((t as usize + (x as usize >> 8) % 2) % 3);
                            // SAFETY: simulated memory, allocated above with this size.
                            unsafe { mr.deallocate(p, b, on) }.unwrap();
                        }
                    }
                    for (p, b) in live {
                        // SAFETY: as above.
                        unsafe { mr.deallocate(p, b, stream(t as usize)) }.unwrap();
                    }
                })
            })
            .collect();
        let report = mr.report().unwrap();
        for _ in 0..400 {
            let snapshot = report.memory_snapshot().unwrap();
            if let Err(e) = check_tiles(&snapshot) {
                stop.store(true, Ordering::Relaxed);
                panic!("{}: {e}", mr.name());
            }
            let f = report.footprint();
            assert!(f.free_bytes <= f.held_bytes, "{}: {f:?}", mr.name());
        }
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
    }
}
