//! Tests of the expandable pool on simulated virtual memory.
//!
//! Invariants checked against a model after every step of random operation sequences:
//! 1. Live blocks are 256-byte aligned, inside mapped pages, and never overlap.
//! 2. Bytes are conserved: free bytes + live block bytes = mapped bytes.
//! 3. After `trim(0)`, the mapped pages are exactly the pages the live blocks touch.
//! 4. When everything is freed and merged, one free block per mapped run remains.

use super::*;
use crate::resource::VirtualMemory;
use crate::resource::{SimulatedMemoryResource, SimulatedVirtualMemory, DEFAULT_PAGE_SIZE};
use crate::suballocator::core::FreeList;
use crate::suballocator::{PoolMemoryResource, StreamKey};
use crate::test_support::free_on;
use proptest::prelude::*;
use std::collections::BTreeSet;

const P: usize = DEFAULT_PAGE_SIZE;
const GIB: usize = 1 << 30;

fn sim(capacity: usize, reserve: usize) -> Arc<SimulatedVirtualMemory> {
    Arc::new(SimulatedVirtualMemory::new(capacity, reserve, P).unwrap())
}

fn pool(vm: &Arc<SimulatedVirtualMemory>, max: Option<usize>) -> ExpandableMemoryResource {
    let sizes = ExpandableSizes {
        maximum_pool_size: max,
        ..Default::default()
    };
    ExpandableMemoryResource::new(vm.clone(), sizes).unwrap()
}

/// A pool with no maximum over a new simulated device: the device and the pool.
fn sim_pool(
    capacity: usize,
    reserve: usize,
) -> (Arc<SimulatedVirtualMemory>, ExpandableMemoryResource) {
    let vm = sim(capacity, reserve);
    let mr = pool(&vm, None);
    (vm, mr)
}

const S: Stream = Stream::DEFAULT;

/// A stream key for simulated memory.
#[allow(unsafe_code)]
fn stream(raw: usize) -> Stream {
    // SAFETY: used only with simulated memory, which never passes it to the driver.
    unsafe { Stream::from_raw(raw) }
}

#[test]
fn the_log_that_fails_on_the_pool_fits_here() {
    // 12 GiB, 8 GiB, free the 12, then 20 GiB on a 32 GiB device.
    let (_, mr) = sim_pool(32 * GIB, 128 * GIB);
    let a = mr.allocate(12 * GIB, S).unwrap();
    let b = mr.allocate(8 * GIB, S).unwrap();
    free_on(&mr, a, 12 * GIB, S).unwrap();
    let c = mr.allocate(20 * GIB, S).unwrap();
    assert_eq!(mr.mapped_bytes(), 28 * GIB, "the free 12 GiB were unmapped");
    let stats = mr.report().unwrap().memory_stats().unwrap();
    assert_eq!(stats.num_alloc_retries, 1);
    assert_eq!(stats.num_ooms, 0);
    free_on(&mr, b, 8 * GIB, S).unwrap();
    free_on(&mr, c, 20 * GIB, S).unwrap();

    let up = Arc::new(SimulatedMemoryResource::new(32 * GIB));
    let p = PoolMemoryResource::new(up, None, None).unwrap();
    let a = p.allocate(12 * GIB, S).unwrap();
    let _b = p.allocate(8 * GIB, S).unwrap();
    free_on(&p, a, 12 * GIB, S).unwrap();
    assert!(
        p.allocate(20 * GIB, S).unwrap_err().is_out_of_memory(),
        "the pool cannot coalesce across its chunks"
    );
}

#[test]
fn growth_extends_the_fresh_tail_and_free_blocks_coalesce_across_steps() {
    let (vm, mr) = sim_pool(64 * P, 256 * P);
    let a = mr.allocate(P / 2, S).unwrap();
    assert_eq!(mr.mapped_bytes(), P);
    // Needs more than the P/2 fresh tail: maps one more page right after it.
    let b = mr.allocate(P, S).unwrap();
    assert_eq!(b, a + P / 2, "the new page joined the fresh tail");
    assert_eq!(mr.mapped_bytes(), 2 * P);
    free_on(&mr, a, P / 2, S).unwrap();
    free_on(&mr, b, P, S).unwrap();
    // a and b (which spans both growth steps) coalesce in the stream's list; the fresh tail
    // stays fresh until the lists are merged, but the figures count the two as the one free
    // region they are (a request of 2P succeeds).
    let on_stream = mr.report().unwrap().stream_free(S).unwrap();
    assert_eq!(
        on_stream.this_stream,
        3 * P / 2,
        "the fresh tail kept apart"
    );
    assert_eq!(mr.free_block_count(), 1);
    assert_eq!(mr.largest_free_block(), 2 * P);
    assert_eq!(mr.trim(usize::MAX).unwrap(), 0, "merges, unmaps nothing");
    assert_eq!(
        mr.free_block_count(),
        1,
        "blocks from two growth steps coalesce"
    );
    assert_eq!(mr.largest_free_block(), 2 * P);
    assert_eq!(vm.call_counts().0, 2);
}

#[test]
fn trim_unmaps_free_pages_anywhere_and_regrowth_reuses_the_hole() {
    let (vm, mr) = sim_pool(64 * P, 256 * P);
    let a = mr.allocate(P, S).unwrap();
    let b = mr.allocate(4 * P, S).unwrap();
    // c's growth step maps half of what is mapped (3 pages): c and a fresh tail of 2.
    let c = mr.allocate(P, S).unwrap();
    assert_eq!(mr.mapped_bytes(), 8 * P);
    free_on(&mr, b, 4 * P, S).unwrap();
    assert_eq!(
        mr.trim(0).unwrap(),
        6 * P,
        "the middle pages and the fresh tail go, not a whole chunk"
    );
    assert_eq!(mr.mapped_bytes(), 2 * P);
    assert!(vm.is_mapped(a) && !vm.is_mapped(b) && vm.is_mapped(c));
    let snapshot = mr.report().unwrap().memory_snapshot().unwrap();
    assert_eq!(snapshot.len(), 2, "two mapped runs");
    assert!(snapshot.iter().all(|s| s.expandable));
    // A 3-page block goes into the hole (lowest gap that holds it).
    let d = mr.allocate(3 * P, S).unwrap();
    assert_eq!(d, b);
    assert_eq!(mr.mapped_bytes(), 5 * P);
    for (p, n) in [(a, P), (c, P), (d, 3 * P)] {
        free_on(&mr, p, n, S).unwrap();
    }
    assert_eq!(mr.trim(0).unwrap(), 5 * P);
    assert_eq!((mr.mapped_bytes(), vm.mapped_bytes()), (0, 0));
    assert_eq!(mr.free_bytes(), 0);
}

#[test]
fn trim_to_a_target_keeps_that_much() {
    let (_, mr) = sim_pool(64 * P, 256 * P);
    let a = mr.allocate(8 * P, S).unwrap();
    free_on(&mr, a, 8 * P, S).unwrap();
    assert_eq!(mr.trim(3 * P).unwrap(), 5 * P);
    assert_eq!(mr.mapped_bytes(), 3 * P);
    assert_eq!(mr.free_bytes(), 3 * P);
}

/// `map_to` is `trim`'s opposite: free pages mapped up to a target (whole pages), nothing
/// allocated, up to the maximum and no further, and the mapped pages serve the next
/// allocation.
#[test]
fn map_to_maps_free_pages_up_to_a_target() {
    let vm = sim(64 * P, 256 * P);
    let mr = pool(&vm, Some(8 * P));
    assert_eq!(mr.map_to(3 * P + 1).unwrap(), 4 * P);
    assert_eq!((mr.mapped_bytes(), mr.free_bytes()), (4 * P, 4 * P));
    assert_eq!(mr.map_to(2 * P).unwrap(), 0, "as much is mapped already");
    let stats = mr.report().unwrap().memory_stats().unwrap();
    assert_eq!(stats.allocation.allocated, 0, "nothing allocated");
    assert_eq!(
        mr.map_to(9 * P).unwrap(),
        4 * P,
        "up to the maximum, not past it"
    );
    assert_eq!(mr.mapped_bytes(), 8 * P);
    let a = mr.allocate(8 * P, S).unwrap();
    assert_eq!(mr.mapped_bytes(), 8 * P, "served by the pages mapped ahead");
    free_on(&mr, a, 8 * P, S).unwrap();
    // No growth step ahead: a pool holding 16 pages maps one page for a target one page above
    // (an allocation's growth would map half of what it holds).
    let (_, big) = sim_pool(64 * P, 256 * P);
    let held = [
        big.allocate(8 * P, S).unwrap(),
        big.allocate(8 * P, S).unwrap(),
    ];
    big.trim(0).unwrap();
    let mapped = big.mapped_bytes();
    assert_eq!(big.map_to(mapped + P).unwrap(), P);
    assert_eq!(big.mapped_bytes(), mapped + P);
    for a in held {
        free_on(&big, a, 8 * P, S).unwrap();
    }
}

#[test]
fn partial_pages_of_a_free_block_stay_mapped() {
    let (_, mr) = sim_pool(64 * P, 256 * P);
    let a = mr.allocate(P / 2, S).unwrap();
    let b = mr.allocate(2 * P, S).unwrap();
    let c = mr.allocate(P, S).unwrap();
    free_on(&mr, b, 2 * P, S).unwrap();
    // b spans [P/2, 5P/2): only the page [P, 2P) lies wholly inside it; c's growth step left
    // a fresh tail [7P/2, 5P), whose page [4P, 5P) goes too.
    assert_eq!(mr.trim(0).unwrap(), 2 * P);
    // What is left of b, and the half page of the tail after c.
    assert_eq!(
        mr.free_bytes(),
        P + P / 2,
        "the carved page left the free lists"
    );
    free_on(&mr, a, P / 2, S).unwrap();
    free_on(&mr, c, P, S).unwrap();
    mr.trim(0).unwrap();
    assert_eq!(mr.mapped_bytes(), 0);
}

#[test]
fn maximum_pool_size_is_honoured() {
    let vm = sim(64 * P, 256 * P);
    let mr = pool(&vm, Some(4 * P));
    let a = mr.allocate(3 * P, S).unwrap();
    let e = mr.allocate(2 * P, S).unwrap_err();
    assert!(e.is_out_of_memory());
    assert!(e.to_string().contains("Maximum pool size exceeded"), "{e}");
    assert!(mr.mapped_bytes() <= 4 * P);
    free_on(&mr, a, 3 * P, S).unwrap();
    let b = mr.allocate(4 * P, S).unwrap();
    free_on(&mr, b, 4 * P, S).unwrap();
    assert_eq!(mr.report().unwrap().memory_stats().unwrap().num_ooms, 1);
    let sizes = ExpandableSizes {
        initial_pool_size: Some(100),
        ..Default::default()
    };
    assert!(ExpandableMemoryResource::new(vm.clone(), sizes).is_err());
    let sizes = ExpandableSizes {
        initial_pool_size: Some(2048),
        maximum_pool_size: Some(1024),
        ..Default::default()
    };
    assert!(ExpandableMemoryResource::new(vm, sizes).is_err());
}

#[test]
fn out_of_physical_memory_is_reported_and_the_pool_still_works() {
    let (_, mr) = sim_pool(4 * P, 256 * P);
    let a = mr.allocate(3 * P, S).unwrap();
    let e = mr.allocate(2 * P, S).unwrap_err();
    assert!(e.is_out_of_memory());
    assert!(e.to_string().contains("expandable: mapping"), "{e}");
    free_on(&mr, a, 3 * P, S).unwrap();
    let b = mr.allocate(4 * P, S).unwrap();
    free_on(&mr, b, 4 * P, S).unwrap();
    assert!(
        free_on(&mr, 0x1234_5600, 256, S).is_err(),
        "a bogus free is an error"
    );
}

#[test]
fn release_threshold_unmaps_on_free() {
    let vm = sim(64 * P, 256 * P);
    let sizes = ExpandableSizes {
        release_threshold: Some(P),
        ..Default::default()
    };
    let mr = ExpandableMemoryResource::new(vm.clone(), sizes).unwrap();
    let a = mr.allocate(6 * P, S).unwrap();
    let b = mr.allocate(P, S).unwrap();
    free_on(&mr, a, 6 * P, S).unwrap();
    assert!(
        mr.free_bytes() <= P,
        "free {} above the threshold",
        mr.free_bytes()
    );
    assert_eq!(mr.mapped_bytes(), 2 * P);
    free_on(&mr, b, P, S).unwrap();
    assert!(mr.mapped_bytes() <= P);
}

#[test]
fn initial_size_is_mapped_at_once() {
    let vm = sim(64 * P, 256 * P);
    let sizes = ExpandableSizes {
        initial_pool_size: Some(3 * P),
        ..Default::default()
    };
    let mr = ExpandableMemoryResource::new(vm.clone(), sizes).unwrap();
    assert_eq!(mr.mapped_bytes(), 3 * P);
    assert_eq!(mr.reserved_bytes(), 256 * P);
    assert_eq!(mr.name(), "expandable");
    assert_eq!(mr.kind(), MemoryKind::Simulated);
    let stats = mr.report().unwrap().memory_stats().unwrap();
    assert_eq!(stats.reserved_bytes.current, 3 * P as u64);
    assert_eq!(mr.memory_info(), Some((64 * P, 64 * P)));
}

#[test]
fn stats_and_snapshot_describe_the_blocks() {
    let (_, mr) = sim_pool(64 * P, 256 * P);
    let a = mr.allocate(1000, S).unwrap();
    let b = mr.allocate(P, S).unwrap();
    free_on(&mr, a, 1000, S).unwrap();
    let s = mr.report().unwrap().memory_stats().unwrap();
    assert_eq!(s.allocation.current, 1);
    assert_eq!(s.allocation.peak, 2);
    assert_eq!(s.allocated_bytes.current, P as u64);
    assert_eq!(s.allocated_bytes.allocated, (P + 1024) as u64);
    assert_eq!(s.reserved_bytes.current, 2 * P as u64);
    assert_eq!(s.inactive_split_bytes, P as u64);
    let segs = mr.report().unwrap().memory_snapshot().unwrap();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].total_size, 2 * P);
    assert_eq!(segs[0].allocated_size(), P);
    mr.report().unwrap().reset_peak_memory_stats();
    assert_eq!(
        mr.report().unwrap().memory_stats().unwrap().allocation.peak,
        1
    );
    free_on(&mr, b, P, S).unwrap();
}

/// One step of a random sequence.
#[derive(Clone, Debug)]
enum Op {
    Alloc { stream: usize, size: usize },
    Free { index: usize },
    Trim,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3usize, 1..(3 * P)).prop_map(|(stream, size)| Op::Alloc { stream, size }),
        3 => any::<usize>().prop_map(|index| Op::Free { index }),
        1 => Just(Op::Trim),
    ]
}

fn pages_touched(live: &[(usize, usize, usize)]) -> usize {
    let mut pages = BTreeSet::new();
    for &(ptr, size, _) in live {
        let size = size.div_ceil(256) * 256;
        for page in ptr / P..(ptr + size).div_ceil(P) {
            pages.insert(page);
        }
    }
    pages.len() * P
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_sequences_keep_the_invariants(ops in proptest::collection::vec(op(), 1..120)) {
        let (vm, mr) = sim_pool(48 * P, 512 * P);
        let streams = [Stream::DEFAULT, stream(0x1000), stream(0x2000)];
        let mut live: Vec<(usize, usize, usize)> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { stream, size } => match mr.allocate(size, streams[stream]) {
                    Ok(p) => live.push((p, size, stream)),
                    Err(e) => prop_assert!(e.is_out_of_memory(), "{e}"),
                },
                Op::Free { index } if !live.is_empty() => {
                    let (p, size, stream) = live.swap_remove(index % live.len());
                    free_on(&mr, p, size, streams[stream]).unwrap();
                }
                Op::Free { .. } => {}
                Op::Trim => {
                    mr.trim(0).unwrap();
                    // 3. mapped pages are exactly those the live blocks touch.
                    prop_assert_eq!(mr.mapped_bytes(), pages_touched(&live));
                }
            }
            // 1. aligned, mapped, disjoint.
            let mut sorted: Vec<(usize, usize)> =
                live.iter().map(|&(p, s, _)| (p, s.div_ceil(256) * 256)).collect();
            sorted.sort_unstable();
            for w in sorted.windows(2) {
                prop_assert!(w[0].0 + w[0].1 <= w[1].0, "overlap {:?}", w);
            }
            for &(p, s) in &sorted {
                prop_assert_eq!(p % 256, 0);
                prop_assert!(vm.is_mapped(p) && vm.is_mapped(p + s - 1));
            }
            // 2. conservation.
            let used: usize = sorted.iter().map(|&(_, s)| s).sum();
            prop_assert_eq!(mr.free_bytes() + used, mr.mapped_bytes());
            prop_assert_eq!(mr.mapped_bytes(), vm.mapped_bytes());
        }
        for (p, size, stream) in live.drain(..) {
            free_on(&mr, p, size, streams[stream]).unwrap();
        }
        mr.trim(usize::MAX).unwrap();
        // 4. everything free and merged: one free block per mapped run.
        let runs = mr.report().unwrap().memory_snapshot().unwrap().len();
        prop_assert_eq!(mr.free_block_count(), runs);
        mr.trim(0).unwrap();
        prop_assert_eq!(mr.mapped_bytes(), 0);
    }
}

/// Simulated virtual memory that notes the event log's sequence number at each unmap.
#[derive(Debug)]
struct SpyVm {
    inner: SimulatedVirtualMemory,
    events: Arc<crate::suballocator::RecordingStreamEvents>,
    unmapped_at: parking_lot::Mutex<Vec<u64>>,
}

impl VirtualMemory for SpyVm {
    forward_vm_figures!();
    fn map(&self, addr: usize, bytes: usize) -> Result<()> {
        self.inner.map(addr, bytes)
    }
    #[allow(unsafe_code)]
    unsafe fn unmap(&self, addr: usize, bytes: usize) -> Result<()> {
        self.unmapped_at.lock().push(self.events.tick());
        // SAFETY: the caller's precondition, passed on.
        unsafe { self.inner.unmap(addr, bytes) }
    }
}

#[test]
fn pages_are_unmapped_only_after_every_stream_was_synchronized() {
    use crate::suballocator::{EventCall, RecordingStreamEvents};
    let events = RecordingStreamEvents::new();
    let vm = Arc::new(SpyVm {
        inner: SimulatedVirtualMemory::new(64 * P, 256 * P, P).unwrap(),
        events: events.clone(),
        unmapped_at: parking_lot::Mutex::new(Vec::new()),
    });
    let mr = ExpandableMemoryResource::with_stream_events(
        vm.clone(),
        ExpandableSizes::default(),
        events.clone(),
    )
    .unwrap();
    let (a_stream, b_stream) = (stream(0x1000), stream(0x2000));
    let a = mr.allocate(3 * P, a_stream).unwrap();
    free_on(&mr, a, 3 * P, a_stream).unwrap();
    // B takes A's freed block only after waiting on an event recorded on A after the free
    // (none was: B gets other memory).
    let b = mr.allocate(3 * P, b_stream).unwrap();
    let waited = events
        .log()
        .iter()
        .any(|c| matches!(c, EventCall::Wait { stream, .. } if *stream == StreamKey::of(b_stream)));
    assert!(b != a || waited);
    free_on(&mr, b, 3 * P, b_stream).unwrap();
    let mapped = mr.mapped_bytes();
    assert_eq!(mr.trim(0).unwrap(), mapped);
    let last_sync = events
        .log()
        .iter()
        .filter_map(|c| match c {
            EventCall::SynchronizeAll { seq } => Some(*seq),
            _ => None,
        })
        .max()
        .expect("trim synchronized");
    let unmaps = vm.unmapped_at.lock().clone();
    assert!(!unmaps.is_empty());
    assert!(
        unmaps.iter().all(|&at| at > last_sync),
        "{unmaps:?} vs {last_sync}"
    );
}

#[test]
fn the_call_profile_is_the_virtual_memory_s() {
    let mr = pool(&sim(64 * P, 256 * P), None);
    assert_eq!(mr.call_profile(), CallProfile::QUICK, "bookkeeping only");
    let spy = Arc::new(SpyVm {
        inner: SimulatedVirtualMemory::new(64 * P, 256 * P, P).unwrap(),
        events: crate::suballocator::RecordingStreamEvents::new(),
        unmapped_at: parking_lot::Mutex::new(Vec::new()),
    });
    let mr = ExpandableMemoryResource::new(spy.clone(), ExpandableSizes::default()).unwrap();
    assert_eq!(
        mr.call_profile(),
        CallProfile::UNKNOWN.suballocating(),
        "a virtual memory that does not say is assumed to call anything; without a release \
         threshold the pool only grows through it"
    );
    assert!(mr.call_profile().release_gil(), "foreign code below");
    let sizes = ExpandableSizes {
        release_threshold: Some(0),
        ..Default::default()
    };
    let trimming = ExpandableMemoryResource::new(spy, sizes).unwrap();
    assert_eq!(
        trimming.call_profile(),
        CallProfile::UNKNOWN,
        "a free may trim, which synchronizes: the virtual memory's own profile"
    );
}

/// Issue 29: a pool on host memory larger than the host can hold is out of memory before any
/// page is touched (a pinned one faulted pages in until the kernel killed the process; this is
/// the pageable path, which runs without a driver), and the memory keeps working.
#[test]
fn a_host_pool_larger_than_the_host_is_refused_before_anything_is_touched() {
    use crate::resource::{HostVirtualMemory, HOST_PAGE_SIZE};
    let room = crate::os::host_pages::available_host_memory().unwrap();
    let too_much = (room.available + room.swap_free + GIB).next_multiple_of(HOST_PAGE_SIZE);
    let vm = Arc::new(HostVirtualMemory::new(2 * too_much, None, false, None).unwrap());
    let sizes = ExpandableSizes {
        initial_pool_size: Some(too_much),
        ..Default::default()
    };
    let e = ExpandableMemoryResource::new(vm.clone(), sizes).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("bytes asked for") && text.contains("available"),
        "{text}"
    );
    assert_eq!(vm.mapped_bytes(), 0);
    let mr = ExpandableMemoryResource::new(vm.clone(), ExpandableSizes::default()).unwrap();
    let p = mr.allocate(1 << 20, S).unwrap();
    free_on(&mr, p, 1 << 20, S).unwrap();
    let e = mr.allocate(too_much, S).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let q = mr.allocate(1 << 20, S).unwrap();
    free_on(&mr, q, 1 << 20, S).unwrap();
}

/// What a growth or a trim read of the fresh list: issue 39's `--fit` of expandable took a
/// minute because each failed request read (and sorted, and hashed) every free block twice.
struct ReadCounter<'a> {
    list: &'a mut CoalescingFreeList,
    /// Calls of `ranges()`, the read of every block.
    full_reads: std::cell::Cell<usize>,
    /// Blocks handed out by `ranges_at_least`, and the smallest `min` asked for.
    blocks_read: std::cell::Cell<usize>,
    smallest_min: std::cell::Cell<usize>,
    /// Calls of `ending_at`.
    ends_asked: std::cell::Cell<usize>,
}

impl<'a> ReadCounter<'a> {
    fn new(list: &'a mut CoalescingFreeList) -> Self {
        ReadCounter {
            list,
            full_reads: std::cell::Cell::new(0),
            blocks_read: std::cell::Cell::new(0),
            smallest_min: std::cell::Cell::new(usize::MAX),
            ends_asked: std::cell::Cell::new(0),
        }
    }
}

impl FreeRanges for ReadCounter<'_> {
    fn ranges(&self) -> Vec<Block> {
        self.full_reads.set(self.full_reads.get() + 1);
        self.list.free_ranges()
    }
    fn ranges_at_least(&self, min: usize) -> Vec<Block> {
        self.smallest_min.set(self.smallest_min.get().min(min));
        let out = self.list.free_ranges_at_least(min);
        self.blocks_read.set(self.blocks_read.get() + out.len());
        out
    }
    fn ending_at(&self, end: usize) -> Option<Block> {
        self.ends_asked.set(self.ends_asked.get() + 1);
        self.list.free_block_ending_at(end)
    }
    fn take_range(&mut self, addr: usize, size: usize) -> bool {
        self.list.remove_range(addr, size)
    }
    fn put_back(&mut self, block: Block) {
        self.list.insert(block);
    }
}

/// Page of the growth tests (small, so runs hold many blocks).
const GP: usize = 64 << 10;

/// A growth over fresh simulated virtual memory with `runs` mapped (gap pages, run pages) from
/// its base, each run cut into pieces of the given granules (cycled), free and allocated in
/// turn: the growth and its fresh list.
fn fragmented(runs: &[(usize, usize)], pieces: &[usize]) -> (ExpandableGrowth, CoalescingFreeList) {
    let vm: Arc<dyn VirtualMemory> =
        Arc::new(SimulatedVirtualMemory::new(1 << 30, 1 << 30, GP).unwrap());
    let growth = ExpandableGrowth {
        phase: Arc::new(std::sync::atomic::AtomicU8::new(0)),
        identity: 0,
        vm: vm.clone(),
        maximum: None,
        mapped: Mutex::new(BTreeMap::new()),
        ready_ahead: Arc::default(),
        share: None,
    };
    let base = vm.base();
    let mut fresh = CoalescingFreeList::empty();
    let mut at = base;
    let mut piece = pieces.iter().cycle();
    let mut free = false;
    for &(gap, len) in runs {
        at += gap * GP;
        vm.map(at, len * GP).unwrap();
        add_run(&mut growth.mapped.lock(), at, len * GP);
        let end = at + len * GP;
        while at < end {
            let size = (piece.next().unwrap() * 256).min(end - at);
            if free {
                fresh.insert(Block {
                    addr: at,
                    size,
                    region: base,
                });
            }
            free = !free;
            at += size;
        }
    }
    (growth, fresh)
}

/// The fresh list answering every question by reading all its blocks, as the growth did
/// before issue 39: the model the lookups' answers are compared with.
struct FullRead<'a>(&'a CoalescingFreeList);

impl FreeRanges for FullRead<'_> {
    fn ranges(&self) -> Vec<Block> {
        self.0.free_ranges()
    }
    fn ranges_at_least(&self, min: usize) -> Vec<Block> {
        self.ranges()
            .into_iter()
            .filter(|b| b.size >= min)
            .collect()
    }
    fn ending_at(&self, end: usize) -> Option<Block> {
        self.ranges().into_iter().find(|b| b.end() == end)
    }
    fn take_range(&mut self, _addr: usize, _size: usize) -> bool {
        false
    }
    fn put_back(&mut self, _block: Block) {}
}

fn runs_strategy() -> impl Strategy<Value = Vec<(usize, usize)>> {
    proptest::collection::vec((0..3usize, 1..6usize), 1..12)
}

fn pieces_strategy() -> impl Strategy<Value = Vec<usize>> {
    // Mostly blocks far below a page (GP is 256 granules), some of a page or more.
    proptest::collection::vec(prop_oneof![6 => 1..64usize, 1 => 200..900usize], 1..24)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The growth's placement asks the fresh list only for the block ending at each run's end
    /// (never a read of every block) and places exactly as the read of every block did.
    #[test]
    fn placement_reads_one_block_per_run_and_matches_the_model(
        runs in runs_strategy(),
        pieces in pieces_strategy(),
        size in 1..(8 * GP),
    ) {
        let size = size.next_multiple_of(256);
        let (growth, mut fresh) = fragmented(&runs, &pieces);
        let model = growth.placement(&growth.mapped.lock(), &FullRead(&fresh), size);
        let run_count = growth.mapped.lock().len();
        let counter = ReadCounter::new(&mut fresh);
        let got = growth.placement(&growth.mapped.lock(), &counter, size);
        prop_assert_eq!(got, model);
        prop_assert_eq!(counter.full_reads.get(), 0);
        prop_assert!(counter.ends_asked.get() <= run_count);
    }

    /// A trim reads only the free blocks of a page or more (a smaller one holds no whole page)
    /// and unmaps exactly the whole free pages a read of every block found, up to its target.
    #[test]
    fn trim_reads_only_blocks_of_a_page_and_unmaps_the_whole_free_pages(
        runs in runs_strategy(),
        pieces in pieces_strategy(),
        keep_pages in 0..40usize,
    ) {
        let (growth, mut fresh) = fragmented(&runs, &pieces);
        let mapped_before = growth.vm.mapped_bytes();
        let all = fresh.free_ranges();
        let base = growth.vm.base();
        // The model: every whole page inside a free block, lowest blocks first, until the
        // mapped bytes reach the target.
        let keep = keep_pages * GP;
        let mut mapped = mapped_before;
        let mut expected = 0;
        for b in &all {
            if mapped <= keep {
                break;
            }
            let lo = base + (b.addr - base).next_multiple_of(GP);
            let hi = base + (b.end() - base) / GP * GP;
            if hi > lo {
                let len = (hi - lo).min((mapped - keep).next_multiple_of(GP));
                mapped -= len;
                expected += len;
            }
        }
        let mut counter = ReadCounter::new(&mut fresh);
        let (released, outcome) = growth.trim(&mut counter, keep);
        outcome.unwrap();
        prop_assert_eq!(counter.full_reads.get(), 0);
        prop_assert!(counter.smallest_min.get() >= GP);
        let large = all.iter().filter(|b| b.size >= GP).count();
        prop_assert!(counter.blocks_read.get() <= large);
        prop_assert_eq!(released, expected);
        prop_assert_eq!(growth.vm.mapped_bytes(), mapped_before - released);
        prop_assert_eq!(fresh.free_bytes(), all.iter().map(|b| b.size).sum::<usize>() - released);
    }
}
