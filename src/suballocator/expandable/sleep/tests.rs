//! Tests of sleep and wake on host virtual memory (real bytes, so the data is checked) and on
//! simulated virtual memory (figures and addresses), with map failures injected.
//!
//! The model test checks after every step of random sequences of allocations, frees, writes,
//! tags and sleeps: every live block keeps its address, a kept block's bytes survive every wake,
//! a discarded block with the zero fill reads zeros, nothing is mapped while asleep, the copied
//! bytes are the kept live bytes, and the estimate before a sleep is what the sleep did.
#![allow(unsafe_code)]

use super::*;
use crate::adaptor::StatisticsResourceAdaptor;
use crate::cuda::Stream;
use crate::resource::host_pages::registered::{HostPageSupply, PageSpec};
use crate::resource::sleep::stack::*;
use crate::resource::sleep::{Phase, SleepCause};
use crate::resource::{
    HostVirtualMemory, MemoryKind, SimulatedMemoryResource, SimulatedVirtualMemory, VirtualMemory,
};
use crate::resource::{MemoryResource, SharedResource};
use crate::suballocator::ExpandableSizes;
use crate::test_support::free;
use proptest::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

const PAGE: usize = 2 << 20;
const S: Stream = Stream::DEFAULT;

/// Host virtual memory whose maps can be refused on demand (another process took the memory).
#[derive(Debug)]
struct FlakyVm {
    inner: HostVirtualMemory,
    refuse_maps: AtomicBool,
    refused: AtomicUsize,
    /// Maps allowed before the next ones are refused (`usize::MAX`: no limit).
    maps_left: AtomicUsize,
    /// Unmaps allowed before the next ones fail (`usize::MAX`: no limit).
    unmaps_left: AtomicUsize,
    supply: &'static HostPageSupply,
}

/// Takes one from a countdown (`usize::MAX`: none); whether the call may go on.
fn count_down(left: &AtomicUsize) -> bool {
    let n = left.load(Ordering::SeqCst);
    if n != usize::MAX {
        left.store(n.saturating_sub(1), Ordering::SeqCst);
    }
    n != 0
}

impl FlakyVm {
    fn new(reserve: usize) -> Arc<Self> {
        Arc::new(FlakyVm {
            inner: HostVirtualMemory::new(reserve, Some(PAGE), false, None).unwrap(),
            refuse_maps: AtomicBool::new(false),
            refused: AtomicUsize::new(0),
            maps_left: AtomicUsize::new(usize::MAX),
            unmaps_left: AtomicUsize::new(usize::MAX),
            supply: Box::leak(Box::default()),
        })
    }
}

impl VirtualMemory for FlakyVm {
    forward_vm_figures!();
    fn map(&self, addr: usize, bytes: usize) -> Result<()> {
        let allowed = count_down(&self.maps_left);
        if self.refuse_maps.load(Ordering::SeqCst) || !allowed {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(Error::out_of_memory(
                bytes,
                "injected: another process took it",
            ));
        }
        self.inner.map(addr, bytes)
    }
    unsafe fn unmap(&self, addr: usize, bytes: usize) -> Result<()> {
        if !count_down(&self.unmaps_left) {
            return Err(Error::Logic("injected: unmap failed".into()));
        }
        // SAFETY: the caller's precondition, passed on.
        unsafe { self.inner.unmap(addr, bytes) }
    }
    fn host_pages(&self) -> Result<Option<PageSpec>> {
        self.inner.host_pages()
    }

    /// A supply of its own: the process's is shared by every test.
    fn host_supply(&self) -> &'static HostPageSupply {
        self.supply
    }
    unsafe fn copy_out(&self, addr: usize, dst: usize, bytes: usize) -> Result<()> {
        // SAFETY: the caller's preconditions, passed on.
        unsafe { self.inner.copy_out(addr, dst, bytes) }
    }
    unsafe fn copy_in(&self, addr: usize, src: usize, bytes: usize) -> Result<()> {
        // SAFETY: the caller's preconditions, passed on.
        unsafe { self.inner.copy_in(addr, src, bytes) }
    }
    unsafe fn fill_zero(&self, addr: usize, bytes: usize) -> Result<()> {
        // SAFETY: the caller's precondition, passed on.
        unsafe { self.inner.fill_zero(addr, bytes) }
    }
    fn wait_copies(&self) -> Result<()> {
        self.inner.wait_copies()
    }
    /// Small chunks, so the restore's chunked mapping and copies that cross chunks are tested.
    fn map_chunk_bytes(&self) -> usize {
        2 * PAGE
    }
}

fn host_pool(reserve: usize) -> (Arc<FlakyVm>, ExpandableMemoryResource) {
    let vm = FlakyVm::new(reserve);
    let mr = ExpandableMemoryResource::new(vm.clone(), ExpandableSizes::default()).unwrap();
    (vm, mr)
}

/// The pattern of block `seed` at byte `i` (it repeats every 256 bytes).
fn pattern(seed: u64, i: usize) -> u8 {
    (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as u8 ^ (i as u8).wrapping_mul(31)
}

/// One period of block `seed`'s pattern: bytes 0 to 255 (the tests run unoptimized: whole
/// periods are copied and compared as slices, not computed byte by byte).
fn period(seed: u64) -> [u8; 256] {
    std::array::from_fn(|i| pattern(seed, i))
}

fn write(ptr: usize, size: usize, seed: u64) {
    // SAFETY: `ptr .. ptr + size` is a live block of an awake host pool (the tests' callers).
    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, size) };
    let one = period(seed);
    for chunk in bytes.chunks_mut(256) {
        chunk.copy_from_slice(&one[..chunk.len()]);
    }
}

/// The first byte of the block that differs from its pattern (`None`: all match).
fn mismatch(ptr: usize, size: usize, seed: u64) -> Option<usize> {
    // SAFETY: as `write`.
    let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, size) };
    let one = period(seed);
    let chunk = bytes
        .chunks(256)
        .position(|chunk| chunk != &one[..chunk.len()])?;
    let start = chunk * 256;
    bytes[start..]
        .iter()
        .zip(start..)
        .position(|(&b, i)| b != pattern(seed, i))
        .map(|at| start + at)
}

/// Allocates a block of each size and writes block `i` with the pattern of `seed + i`:
/// (pointer, size, seed) of each.
fn written_blocks(
    mr: &ExpandableMemoryResource,
    sizes: &[usize],
    seed: u64,
) -> Vec<(usize, usize, u64)> {
    let blocks: Vec<_> = sizes
        .iter()
        .zip(seed..)
        .map(|(&s, seed)| (mr.allocate(s, S).unwrap(), s, seed))
        .collect();
    for &(p, s, seed) in &blocks {
        write(p, s, seed);
    }
    blocks
}

/// Asserts that every block of [`written_blocks`] still holds its pattern.
fn assert_intact(blocks: &[(usize, usize, u64)]) {
    for (i, &(p, s, seed)) in blocks.iter().enumerate() {
        assert_eq!(mismatch(p, s, seed), None, "block {i} at {p:#x}");
    }
}

fn all_zero(ptr: usize, size: usize) -> bool {
    // SAFETY: as `write`.
    unsafe { std::slice::from_raw_parts(ptr as *const u8, size) }
        .iter()
        .all(|&b| b == 0)
}

#[test]
fn a_sleep_gives_every_page_back_and_a_wake_brings_the_bytes_back_at_the_same_addresses() {
    let (vm, mr) = host_pool(64 * PAGE);
    let blocks = written_blocks(&mr, &[1000, PAGE + 300, 3 * PAGE, 256], 0);
    // A free block of whole pages between live ones: released, never copied.
    let hole = mr.allocate(4 * PAGE, S).unwrap();
    let tail = mr.allocate(100, S).unwrap();
    free(&mr, hole, 4 * PAGE).unwrap();
    let reserved = mr.reserved_bytes();
    let before = mr.sleep_estimate();
    assert_eq!(before.live_blocks, 5);
    assert_eq!(before.released_bytes, mr.mapped_bytes());
    assert!(before.free_page_bytes >= 3 * PAGE, "{before:?}");
    let did = mr.offload().unwrap();
    assert_eq!(did, before, "the estimate is what the sleep does");
    assert!(mr.asleep());
    assert_eq!(vm.mapped_bytes(), 0, "every page given back");
    assert_eq!(mr.reserved_bytes(), reserved, "the addresses stay reserved");
    assert_eq!(mr.host_copy_bytes(), did.copied_bytes);
    assert_eq!(mr.sleep_estimate(), SleepEstimate::default());
    let segments = |mr: &ExpandableMemoryResource| {
        mr.report()
            .and_then(|r| r.memory_snapshot())
            .expect("the pool lays out its segments")
    };
    let asleep = segments(&mr);
    assert!(
        !asleep.is_empty() && asleep.iter().all(|s| s.offloaded),
        "{asleep:?}"
    );
    let e = mr.allocate(64, S).unwrap_err();
    assert!(
        matches!(e, Error::Logic(_)) && e.to_string().contains("asleep"),
        "{e}"
    );
    assert!(mr.offload().is_err(), "offload twice is an error");
    assert_eq!(mr.trim(0).unwrap(), 0, "nothing to trim while asleep");
    mr.restore().unwrap();
    assert!(!mr.asleep());
    assert!(mr.restore().is_err(), "restore while awake is an error");
    assert_intact(&blocks);
    assert!(segments(&mr).iter().all(|s| !s.offloaded));
    assert_eq!(mr.host_copy_bytes(), 0, "the host copy is released");
    let report = mr.last_sleep().unwrap();
    assert!(report.restore_s.is_some() && report.sleeps == 1);
    // The pool works on: allocations, frees, and the hole's pages are mapped again on demand.
    let again = mr.allocate(2 * PAGE, S).unwrap();
    write(again, 2 * PAGE, 99);
    assert_eq!(mismatch(again, 2 * PAGE, 99), None);
    for &(p, s, _) in &blocks {
        free(&mr, p, s).unwrap();
    }
    free(&mr, again, 2 * PAGE).unwrap();
    free(&mr, tail, 100).unwrap();
}

#[test]
fn discarded_blocks_are_not_copied_and_read_zero_when_asked() {
    let (_vm, mr) = host_pool(64 * PAGE);
    let keep = mr.allocate(PAGE, S).unwrap();
    let drop_me = mr.allocate(2 * PAGE, S).unwrap();
    write(keep, PAGE, 1);
    write(drop_me, 2 * PAGE, 2);
    // Any address inside the allocation tags all of it.
    assert_eq!(mr.tag(drop_me + 4096, SleepTag::Discard).unwrap(), drop_me);
    assert_eq!(mr.tag_of(drop_me), SleepTag::Discard);
    assert!(mr.tag(keep + 2 * PAGE + 8, SleepTag::Discard).is_err() || keep + PAGE <= drop_me);
    let e = mr.sleep_estimate();
    assert_eq!((e.copied_bytes, e.discarded_bytes), (PAGE, 2 * PAGE));
    let did = mr.offload_with(DiscardFill::Zero).unwrap();
    assert_eq!(did.copied_bytes, PAGE);
    assert_eq!(
        mr.host_copy_bytes(),
        PAGE,
        "only the kept block is on the host"
    );
    mr.restore().unwrap();
    assert_eq!(mismatch(keep, PAGE, 1), None);
    assert!(all_zero(drop_me, 2 * PAGE));
    // Freed, the tag goes: a new block at that address is kept.
    free(&mr, drop_me, 2 * PAGE).unwrap();
    assert_eq!(mr.tag_of(drop_me), SleepTag::Keep);
    assert!(mr.tag(drop_me, SleepTag::Discard).is_err(), "not live");
    assert!("discard".parse::<SleepTag>().is_ok() && "lose".parse::<SleepTag>().is_err());
    assert!("zero".parse::<DiscardFill>().is_ok() && "ones".parse::<DiscardFill>().is_err());
}

#[test]
fn a_refused_wake_loses_nothing_and_a_later_wake_succeeds() {
    let (vm, mr) = host_pool(64 * PAGE);
    let a = mr.allocate(3 * PAGE, S).unwrap();
    let b = mr.allocate(5000, S).unwrap();
    write(a, 3 * PAGE, 7);
    write(b, 5000, 8);
    mr.offload().unwrap();
    vm.refuse_maps.store(true, Ordering::SeqCst);
    for _ in 0..2 {
        let e = mr.restore().unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        assert!(e.to_string().contains("still asleep"), "{e}");
        assert!(mr.asleep());
        assert_eq!(vm.mapped_bytes(), 0, "nothing half-mapped stays");
    }
    assert_eq!(mr.last_sleep().unwrap().failed_restores, 2);
    vm.refuse_maps.store(false, Ordering::SeqCst);
    mr.restore().unwrap();
    assert_eq!(mismatch(a, 3 * PAGE, 7), None);
    assert_eq!(mismatch(b, 5000, 8), None);
    assert!(vm.refused.load(Ordering::SeqCst) >= 2);
}

#[test]
fn a_wake_refused_half_way_unmaps_what_it_mapped_and_retries_whole() {
    let (vm, mr) = host_pool(64 * PAGE);
    // Blocks that cross the restore's chunks (two pages each).
    let blocks = written_blocks(&mr, &[3 * PAGE + 100, 5 * PAGE, 777], 40);
    mr.offload().unwrap();
    for allowed in [0, 1, 3] {
        vm.maps_left.store(allowed, Ordering::SeqCst);
        assert!(mr.restore().unwrap_err().is_out_of_memory());
        assert!(mr.asleep());
        assert_eq!(
            vm.mapped_bytes(),
            0,
            "the chunks mapped before the refusal went back"
        );
    }
    vm.maps_left.store(usize::MAX, Ordering::SeqCst);
    mr.restore().unwrap();
    assert_intact(&blocks);
    let report = mr.last_sleep().unwrap();
    assert_eq!(report.failed_restores, 3);
    assert!(report.map_s.is_some() && report.copy_in_s.is_some());
}

#[test]
fn an_offload_failing_half_way_wakes_again_with_nothing_lost() {
    let (vm, mr) = host_pool(64 * PAGE);
    let blocks = written_blocks(&mr, &[3 * PAGE + 100, 5 * PAGE, 777], 60);
    let mapped = vm.mapped_bytes();
    let check = || assert_intact(&blocks);
    // The unmap of the first, then of the third chunk fails: undone, awake, the pool works.
    for allowed in [0, 2] {
        vm.unmaps_left.store(allowed, Ordering::SeqCst);
        let e = mr.offload().unwrap_err();
        assert!(e.to_string().contains("injected"), "{e}");
        vm.unmaps_left.store(usize::MAX, Ordering::SeqCst);
        assert!(!mr.asleep() && vm.mapped_bytes() == mapped);
        check();
        let p = mr.allocate(1000, S).unwrap();
        free(&mr, p, 1000).unwrap();
    }
    // Undoing fails too (the memory is gone): asleep, and a later restore brings it all back.
    vm.unmaps_left.store(2, Ordering::SeqCst);
    vm.refuse_maps.store(true, Ordering::SeqCst);
    let e = mr.offload().unwrap_err();
    assert!(e.to_string().contains("the pool is asleep"), "{e}");
    assert!(mr.asleep());
    vm.unmaps_left.store(usize::MAX, Ordering::SeqCst);
    vm.refuse_maps.store(false, Ordering::SeqCst);
    mr.restore().unwrap();
    check();
    assert_eq!(vm.mapped_bytes(), mapped);
}

#[test]
fn chunks_cover_the_runs_in_order() {
    let runs = [(0, 5), (10, 2), (20, 4)];
    assert_eq!(
        split_runs(&runs, 2),
        vec![(0, 2), (2, 2), (4, 1), (10, 2), (20, 2), (22, 2)]
    );
    assert_eq!(split_runs(&runs, usize::MAX), runs.to_vec());
}

#[test]
fn a_free_while_asleep_is_allowed_and_its_whole_pages_go_after_wake() {
    let (vm, mr) = host_pool(64 * PAGE);
    let a = mr.allocate(4 * PAGE, S).unwrap();
    let b = mr.allocate(PAGE, S).unwrap();
    write(b, PAGE, 3);
    let mapped = vm.mapped_bytes();
    mr.offload().unwrap();
    free(&mr, a, 4 * PAGE).unwrap();
    assert!(
        free(&mr, a, 4 * PAGE).is_err(),
        "a double free is still refused"
    );
    mr.restore().unwrap();
    assert_eq!(mismatch(b, PAGE, 3), None);
    assert!(
        vm.mapped_bytes() <= mapped - 4 * PAGE + PAGE,
        "the freed block's whole pages were given back: {} of {mapped}",
        vm.mapped_bytes()
    );
    free(&mr, b, PAGE).unwrap();
}

#[test]
fn the_retained_host_copy_serves_the_next_sleep() {
    let (_vm, mr) = host_pool(64 * PAGE);
    let a = mr.allocate(2 * PAGE, S).unwrap();
    write(a, 2 * PAGE, 5);
    mr.set_retain_host_copy(true);
    mr.offload().unwrap();
    mr.restore().unwrap();
    assert!(!mr.last_sleep().unwrap().host_reused);
    mr.offload().unwrap();
    assert!(mr.last_sleep().unwrap().host_reused, "no new host pages");
    mr.restore().unwrap();
    assert_eq!(mismatch(a, 2 * PAGE, 5), None);
    assert_eq!(mr.drop_host_copy(), 2 * PAGE);
    assert_eq!(mr.drop_host_copy(), 0);
}

#[test]
fn stacks_forward_sleep_to_the_expandable_pool_and_others_refuse_by_name() {
    let vm = Arc::new(SimulatedVirtualMemory::new(1 << 30, 4 << 30, PAGE).unwrap());
    let pool = ExpandableMemoryResource::new(vm.clone(), ExpandableSizes::default()).unwrap();
    let top: SharedResource = Arc::new(StatisticsResourceAdaptor::new(Arc::new(pool.clone())));
    let a = top.allocate(3 * PAGE, S).unwrap();
    assert_eq!(sleep_targets(&top).unwrap().len(), 1);
    assert_eq!(sleep_estimate(&top).unwrap().copied_bytes, 3 * PAGE);
    let did = offload(&top, DiscardFill::Undefined).unwrap();
    assert_eq!(did.copied_bytes, 3 * PAGE);
    assert!(asleep(&top) && pool.asleep());
    assert_eq!(vm.mapped_bytes(), 0);
    assert!(top.allocate(10, S).is_err());
    restore(&top).unwrap();
    assert!(restore(&top).is_err(), "restore while awake");
    assert_eq!(vm.mapped_bytes(), 3 * PAGE);
    free(&*top, a, 3 * PAGE).unwrap();

    let plain: SharedResource = Arc::new(StatisticsResourceAdaptor::new(Arc::new(
        SimulatedMemoryResource::new(1 << 30),
    )));
    let e = offload(&plain, DiscardFill::Undefined).unwrap_err();
    assert!(
        e.to_string().contains("statistics") && e.to_string().contains("expandable"),
        "{e}"
    );
    assert!(!asleep(&plain));
}

#[test]
fn suballocators_over_a_sleeping_pool_hand_out_nothing_until_the_wake() {
    use crate::suballocator::{ArenaMemoryResource, FixedSizeMemoryResource, PoolMemoryResource};
    let vm = Arc::new(SimulatedVirtualMemory::new(1 << 30, 4 << 30, PAGE).unwrap());
    let pool = ExpandableMemoryResource::new(vm, ExpandableSizes::default()).unwrap();
    let under: SharedResource = Arc::new(StatisticsResourceAdaptor::new(Arc::new(pool.clone())));
    let tops: Vec<SharedResource> = vec![
        Arc::new(PoolMemoryResource::new(under.clone(), Some(4 * PAGE), None).unwrap()),
        Arc::new(FixedSizeMemoryResource::new(under.clone(), 4096, 16).unwrap()),
        Arc::new(ArenaMemoryResource::new(under.clone(), Some(64 << 20), false).unwrap()),
    ];
    for top in &tops {
        let kept = top.allocate(1000, S).unwrap();
        let cached = top.allocate(256, S).unwrap();
        free(&**top, cached, 256).unwrap();
        offload(top, DiscardFill::Undefined).unwrap();
        assert!(pool.asleep());
        for bytes in [256, 1000, 4096] {
            let e = top.allocate(bytes, S).unwrap_err();
            assert!(
                matches!(e, Error::Logic(_)) && e.to_string().contains("asleep"),
                "{}: {e}",
                top.name()
            );
        }
        free(&**top, kept, 1000).unwrap();
        restore(top).unwrap();
        let again = top.allocate(256, S).unwrap();
        free(&**top, again, 256).unwrap();
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize),
    Free(usize),
    Rewrite(usize),
    Discard(usize),
    Sleep {
        zero: bool,
        free_while_asleep: Option<usize>,
        refuse_once: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1usize..8192).prop_map(Op::Alloc),
        1 => (1usize..2 * PAGE).prop_map(Op::Alloc),
        2 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::Rewrite),
        1 => any::<usize>().prop_map(Op::Discard),
        2 => (any::<bool>(), proptest::option::of(any::<usize>()), any::<bool>()).prop_map(
            |(zero, free_while_asleep, refuse_once)| Op::Sleep {
                zero,
                free_while_asleep,
                refuse_once
            }
        ),
    ]
}

/// One live block of the model.
#[derive(Clone, Copy, Debug)]
struct Live {
    ptr: usize,
    size: usize,
    seed: u64,
    discard: bool,
}

/// Allocates `size` bytes of `mr`, fills them with the pattern of the next `seed` and records
/// them in `live`.
fn allocate_written(mr: &dyn MemoryResource, size: usize, seed: &mut u64, live: &mut Vec<Live>) {
    let ptr = mr.allocate(size, S).unwrap();
    *seed += 1;
    write(ptr, size, *seed);
    live.push(Live {
        ptr,
        size,
        seed: *seed,
        discard: false,
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn sleep_and_wake_between_random_allocations_keep_every_address_and_byte(
        ops in proptest::collection::vec(op(), 1..40)
    ) {
        let (vm, mr) = host_pool(256 * PAGE);
        let mut live: Vec<Live> = Vec::new();
        let mut seed = 0u64;
        for op in ops {
            match op {
                Op::Alloc(size) => allocate_written(&mr, size, &mut seed, &mut live),
                Op::Free(i) if !live.is_empty() => {
                    let b = live.swap_remove(i % live.len());
                    free(&mr, b.ptr, b.size).unwrap();
                }
                Op::Rewrite(i) if !live.is_empty() => {
                    let n = live.len();
                    let b = &mut live[i % n];
                    seed += 1;
                    b.seed = seed;
                    // Rewritten data is worth keeping: tagged keep again.
                    mr.tag(b.ptr, SleepTag::Keep).unwrap();
                    b.discard = false;
                    write(b.ptr, b.size, seed);
                }
                Op::Discard(i) if !live.is_empty() => {
                    let n = live.len();
                    let b = &mut live[i % n];
                    mr.tag(b.ptr, SleepTag::Discard).unwrap();
                    b.discard = true;
                }
                Op::Sleep { zero, free_while_asleep, refuse_once } => {
                    let estimate = mr.sleep_estimate();
                    let blocks: std::collections::HashMap<usize, usize> =
                        mr.view().live.into_iter().collect();
                    let fill = if zero { DiscardFill::Zero } else { DiscardFill::Undefined };
                    let did = mr.offload_with(fill).unwrap();
                    prop_assert_eq!(did, estimate);
                    // The kept blocks' bytes (whole blocks: a block may be larger than asked).
                    let kept: usize = live.iter().filter(|b| !b.discard).map(|b| blocks[&b.ptr]).sum();
                    prop_assert!(live.iter().all(|b| blocks[&b.ptr] >= b.size));
                    prop_assert_eq!(did.copied_bytes, kept);
                    prop_assert_eq!(mr.host_copy_bytes(), kept);
                    prop_assert_eq!(did.live_blocks, live.len());
                    prop_assert_eq!(vm.mapped_bytes(), 0);
                    prop_assert!(mr.allocate(1, S).is_err());
                    if let (Some(i), false) = (free_while_asleep, live.is_empty()) {
                        let b = live.swap_remove(i % live.len());
                        free(&mr, b.ptr, b.size).unwrap();
                    }
                    // A pool with pages to map again (none when nothing was live).
                    if refuse_once && did.released_bytes > did.free_page_bytes {
                        vm.refuse_maps.store(true, Ordering::SeqCst);
                        prop_assert!(mr.restore().is_err());
                        prop_assert!(mr.asleep());
                        vm.refuse_maps.store(false, Ordering::SeqCst);
                    }
                    mr.restore().unwrap();
                    for b in &mut live {
                        if !b.discard {
                            prop_assert_eq!(mismatch(b.ptr, b.size, b.seed), None, "{:?}", b);
                        } else if zero {
                            prop_assert!(all_zero(b.ptr, b.size), "{:?}", b);
                        }
                    }
                }
                _ => {}
            }
            // Addresses never move: every live block is still allocated where it was.
            let view = mr.view();
            let mut ptrs: Vec<usize> = live.iter().map(|b| b.ptr).collect();
            ptrs.sort_unstable();
            let found: Vec<usize> = view.live.iter().map(|&(a, _)| a).collect();
            prop_assert_eq!(found, ptrs);
        }
        for b in live {
            free(&mr, b.ptr, b.size).unwrap();
        }
    }
}

#[test]
fn threads_allocate_and_free_while_another_sleeps_and_wakes() {
    use std::sync::Barrier;
    let (vm, mr) = host_pool(512 * PAGE);
    // Workers touch memory only under `using` (read); the sleeper holds it for writing from
    // offload to restore: the caller's side of the contract (no work on asleep memory). Frees
    // and allocations also run outside it, racing the sleeps.
    let using = Arc::new(parking_lot::RwLock::new(()));
    let stop = Arc::new(AtomicBool::new(false));
    let threads = 4;
    let start = Arc::new(Barrier::new(threads + 1));
    let mut handles = Vec::new();
    for t in 0..threads {
        let (mr, using, stop, start) = (mr.clone(), using.clone(), stop.clone(), start.clone());
        handles.push(std::thread::spawn(move || {
            start.wait();
            let mut held: Vec<(usize, usize, u64)> = Vec::new();
            let mut refused = 0usize;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let size = 256 + ((n as usize * 7919 + t * 104_729) % (PAGE / 2));
                {
                    let _use = using.read();
                    let seed = (t as u64) << 32 | n;
                    if let Ok(p) = mr.allocate(size, S) {
                        write(p, size, seed);
                        held.push((p, size, seed));
                    }
                    for &(p, s, seed) in &held {
                        assert_eq!(mismatch(p, s, seed), None, "thread {t}: block {p:#x}");
                    }
                }
                // Outside the use lock: an allocation may meet a sleeping pool (refused with the
                // asleep error), a free is allowed either way.
                match mr.allocate(size, S) {
                    Ok(p) => free(&mr, p, size).unwrap(),
                    Err(e) => {
                        assert!(e.to_string().contains("asleep"), "{e}");
                        refused += 1;
                    }
                }
                if held.len() > 6 {
                    let (p, s, _) = held.remove(n as usize % held.len());
                    free(&mr, p, s).unwrap();
                }
            }
            for (p, s, _) in held {
                free(&mr, p, s).unwrap();
            }
            refused
        }));
    }
    start.wait();
    for _ in 0..30 {
        let _use = using.write();
        mr.offload().unwrap();
        assert_eq!(vm.mapped_bytes(), 0);
        std::thread::yield_now();
        mr.restore().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let refused: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let _ = refused;
    assert!(!mr.asleep());
    assert_eq!(mr.view().live.len(), 0, "nothing leaked");
}

#[test]
fn tags_and_fills_parse_from_their_names_and_name_them_on_a_bad_one() {
    assert_eq!("keep".parse::<SleepTag>().unwrap(), SleepTag::Keep);
    assert_eq!("discard".parse::<SleepTag>().unwrap(), SleepTag::Discard);
    assert_eq!(
        "undefined".parse::<DiscardFill>().unwrap(),
        DiscardFill::Undefined
    );
    assert_eq!("zero".parse::<DiscardFill>().unwrap(), DiscardFill::Zero);
    let e = "Keep".parse::<SleepTag>().unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { argument: "tag", message }
            if message == "\"Keep\" is not a sleep tag: use \"keep\" or \"discard\""),
        "{e:?}"
    );
    let e = "ones".parse::<DiscardFill>().unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument { argument: "discard_fill", message }
            if message == "\"ones\" is not a discard fill: use \"undefined\" or \"zero\""),
        "{e:?}"
    );
}

/// The stacks over an expandable pool that the stack test builds: each suballocator kind, with
/// an adaptor between or a second pool (a tenant over a tenant).
#[derive(Clone, Copy, Debug)]
enum StackKind {
    Pool,
    PoolOverPool,
    FixedSize,
    Binning,
    Arena,
}

fn stack_kind() -> impl Strategy<Value = (StackKind, bool)> {
    (
        prop_oneof![
            Just(StackKind::Pool),
            Just(StackKind::PoolOverPool),
            Just(StackKind::FixedSize),
            Just(StackKind::Binning),
            Just(StackKind::Arena),
        ],
        any::<bool>(),
    )
}

/// `kind` over `pool` (with a statistics adaptor between when `adaptor`); the largest request
/// it serves.
fn build_stack(
    pool: &ExpandableMemoryResource,
    kind: StackKind,
    adaptor: bool,
) -> (SharedResource, usize) {
    use crate::suballocator::{
        ArenaMemoryResource, BinningMemoryResource, FixedSizeMemoryResource, PoolMemoryResource,
    };
    let mut under: SharedResource = Arc::new(pool.clone());
    if adaptor {
        under = Arc::new(StatisticsResourceAdaptor::new(under));
    }
    match kind {
        StackKind::Pool => (
            Arc::new(PoolMemoryResource::new(under, Some(2 * PAGE), None).unwrap()),
            3 * PAGE,
        ),
        StackKind::PoolOverPool => {
            let inner: SharedResource =
                Arc::new(PoolMemoryResource::new(under, Some(4 * PAGE), None).unwrap());
            (
                Arc::new(PoolMemoryResource::new(inner, Some(PAGE), None).unwrap()),
                PAGE,
            )
        }
        StackKind::FixedSize => (
            Arc::new(FixedSizeMemoryResource::new(under, 4096, 8).unwrap()),
            4096,
        ),
        // Bins of 256 B .. 64 KiB (fixed-size tenants); larger requests go to the pool itself.
        StackKind::Binning => (
            Arc::new(BinningMemoryResource::new(under, Some(8), Some(16)).unwrap()),
            PAGE,
        ),
        StackKind::Arena => (
            Arc::new(ArenaMemoryResource::new(under, Some(16 * PAGE), false).unwrap()),
            PAGE,
        ),
    }
}

#[derive(Clone, Debug)]
enum StackOp {
    Alloc(usize),
    Free(usize),
    /// Tag a block discard until it is freed (`tag()`), or keep again.
    Tag(usize, bool),
    Sleep {
        /// Blocks discarded by this sleep only.
        discard_now: Vec<usize>,
        zero: bool,
        /// First try the sleep with an address no pool holds among the discards: refused,
        /// and nothing may change.
        bogus_first: bool,
    },
}

fn stack_op() -> impl Strategy<Value = StackOp> {
    prop_oneof![
        4 => (1usize..6000).prop_map(StackOp::Alloc),
        1 => (1usize..PAGE).prop_map(StackOp::Alloc),
        2 => any::<usize>().prop_map(StackOp::Free),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(i, d)| StackOp::Tag(i, d)),
        2 => (proptest::collection::vec(any::<usize>(), 0..3), any::<bool>(), any::<bool>())
            .prop_map(|(discard_now, zero, bogus_first)| StackOp::Sleep {
                discard_now,
                zero,
                bogus_first
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Issue 36: through every suballocator kind over the pool (and an adaptor or a second pool
    /// between), a sleep copies exactly the live blocks the user holds (a chunk's free ranges
    /// are not copied), a discard covers exactly the tagged block (its neighbours in the same
    /// chunk keep every byte), this sleep's discards are forgotten at the wake while tags hold
    /// until the free, a refused offload changes nothing, nothing is handed out and no copy
    /// touches the memory while asleep, and the figures say asleep.
    #[test]
    fn every_stack_over_a_sleeping_pool_keeps_exactly_its_live_bytes(
        (kind, adaptor) in stack_kind(),
        ops in proptest::collection::vec(stack_op(), 1..30),
    ) {
        let (vm, pool) = host_pool(512 * PAGE);
        let (top, largest) = build_stack(&pool, kind, adaptor);
        let mut live: Vec<Live> = Vec::new();
        let mut seed = 0u64;
        for op in ops {
            match op {
                StackOp::Alloc(size) => {
                    allocate_written(&*top, size.min(largest), &mut seed, &mut live)
                }
                StackOp::Free(i) if !live.is_empty() => {
                    let b = live.swap_remove(i % live.len());
                    free(&*top, b.ptr, b.size).unwrap();
                }
                StackOp::Tag(i, discard) if !live.is_empty() => {
                    let n = live.len();
                    let b = &mut live[i % n];
                    let tag = if discard { SleepTag::Discard } else { SleepTag::Keep };
                    prop_assert_eq!(crate::resource::sleep::stack::tag(&top, b.ptr, None, tag).unwrap(), b.ptr);
                    b.discard = discard;
                }
                StackOp::Sleep { discard_now, zero, bogus_first } => {
                    let now: Vec<usize> = if live.is_empty() {
                        Vec::new()
                    } else {
                        discard_now.iter().map(|i| i % live.len()).collect()
                    };
                    let wanted: Vec<(usize, Option<usize>)> =
                        now.iter().map(|&i| (live[i].ptr, None)).collect();
                    if bogus_first {
                        let mut bad = wanted.clone();
                        bad.push((12345, None));
                        prop_assert!(plan_discards(&top, &bad).is_err());
                        prop_assert!(!pool.asleep(), "a refused offload changes nothing");
                    }
                    // Each live block is exactly the block the top handed out.
                    let blocks: Vec<(usize, usize)> = live
                        .iter()
                        .map(|b| top.link().sleep.block_at(b.ptr).unwrap().0)
                        .collect();
                    for (b, &(start, bytes)) in live.iter().zip(&blocks) {
                        prop_assert_eq!(start, b.ptr);
                        prop_assert!(bytes >= b.size && bytes <= b.size.next_power_of_two().max(4096), "{:?} {} of {}", kind, bytes, b.size);
                    }
                    let discarded_now: std::collections::HashSet<usize> =
                        now.iter().copied().collect();
                    let gone = |i: usize| live[i].discard || discarded_now.contains(&i);
                    let kept: usize = (0..live.len()).filter(|&i| !gone(i)).map(|i| blocks[i].1).sum();
                    let dropped: usize = (0..live.len()).filter(|&i| gone(i)).map(|i| blocks[i].1).sum();
                    let plan = plan_discards(&top, &wanted).unwrap();
                    let fill = if zero { DiscardFill::Zero } else { DiscardFill::Undefined };
                    let did = offload_discarding(&top, SleepPlan { discard: plan, fill, ..SleepPlan::default() }).unwrap();
                    prop_assert_eq!(did.copied_bytes, kept, "exactly the live kept blocks");
                    prop_assert_eq!(did.discarded_bytes, dropped);
                    prop_assert_eq!(vm.mapped_bytes(), 0);
                    prop_assert!(asleep(&top));
                    // Nothing handed out, nothing copied, the figures say asleep.
                    let e = top.allocate(256, S).unwrap_err();
                    prop_assert!(e.to_string().contains("asleep"), "{}", e);
                    if let Some(b) = live.first() {
                        let mut host = vec![0u8; 16];
                        // SAFETY: the host range is `host`; the other is a live block (refused
                        // before any byte is touched, which is what is checked).
                        let copied = unsafe {
                            crate::container::copy_bytes(
                                host.as_mut_ptr() as usize, b.ptr, 16, S, MemoryKind::Host,
                            )
                        };
                        prop_assert!(copied.unwrap_err().to_string().contains("asleep"));
                    }
                    if let Some(stats) = top.report().and_then(|r| r.memory_stats()) {
                        prop_assert_eq!(stats.reserved_bytes.current, 0);
                        prop_assert!(stats.offloaded_bytes > 0);
                    }
                    if let Some(segs) = top.report().and_then(|r| r.memory_snapshot()) {
                        prop_assert!(segs.iter().all(|s| s.offloaded), "{:?}", kind);
                    }
                    restore(&top).unwrap();
                    for (i, b) in live.iter().enumerate() {
                        if !gone(i) {
                            prop_assert_eq!(mismatch(b.ptr, b.size, b.seed), None, "{:?} {:?}", kind, b);
                        } else if zero {
                            prop_assert!(all_zero(b.ptr, b.size), "{:?}", b);
                        }
                    }
                    // This sleep's discards are forgotten; the data is what is there now.
                    for (i, b) in live.iter_mut().enumerate() {
                        if discarded_now.contains(&i) || b.discard {
                            seed += 1;
                            b.seed = seed;
                            write(b.ptr, b.size, seed);
                        }
                        let tag = pool.tag_of(b.ptr);
                        prop_assert_eq!(tag == SleepTag::Discard, b.discard, "{:?}", b);
                    }
                }
                _ => {}
            }
        }
        for b in live {
            free(&*top, b.ptr, b.size).unwrap();
        }
    }
}

/// A suballocator written without a thought for sleep: a new strategy on the stream-ordered
/// core (fixed 1 MiB chunks, coalescing blocks) with no sleep code at all.
struct ChunkedPool {
    core: crate::suballocator::core::StreamOrderedCore<
        crate::suballocator::free_lists::CoalescingFreeList,
    >,
}

use crate::suballocator::core::forward_memory_resource;
forward_memory_resource!(ChunkedPool, |this| &this.core);

impl ChunkedPool {
    fn over(upstream: SharedResource) -> ChunkedPool {
        use crate::suballocator::core::{default_events, Chunks, Keeps, StreamOrderedCore};
        ChunkedPool {
            core: StreamOrderedCore::new(
                default_events(&upstream),
                Box::new(Chunks {
                    upstream,
                    chunk: 1 << 20,
                    block: 256,
                    name: "chunked",
                }),
                (),
                "chunked",
                Keeps::UntilDropped,
            ),
        }
    }
}

/// Issue 36's test of the link: the new suballocator over the pool (through an adaptor) has a
/// suballocator's GIL profile, refuses to hand out its cached ranges while the pool sleeps, is offloaded as exactly its live blocks
/// (its free ranges not copied), keeps every byte, reports its figures and segments as
/// offloaded, and a discard through it covers exactly one of its blocks.
#[test]
fn a_new_suballocator_gets_sleep_by_construction() {
    let (vm, pool) = host_pool(64 * PAGE);
    let under: SharedResource = Arc::new(StatisticsResourceAdaptor::new(Arc::new(pool.clone())));
    let top: SharedResource = Arc::new(ChunkedPool::over(under.clone()));
    assert_eq!(
        top.call_profile(),
        under.call_profile().suballocating(),
        "its GIL profile, a suballocator's over its source's, came with the link"
    );
    let sizes = [1000usize, 5000, 256, 70_000];
    let blocks: Vec<(usize, usize, u64)> = sizes
        .iter()
        .zip(1u64..)
        .map(|(&s, seed)| {
            let p = top.allocate(s, S).unwrap();
            write(p, s, seed);
            (p, s, seed)
        })
        .collect();
    let spare = top.allocate(300_000, S).unwrap();
    free(&*top, spare, 300_000).unwrap();
    let aligned = |s: usize| s.next_multiple_of(256);
    let (lost, kept) = (blocks[1], [blocks[0], blocks[2], blocks[3]]);
    let plan = plan_discards(&top, &[(lost.0, None)]).unwrap();
    assert_eq!(plan, vec![(lost.0, aligned(lost.1))], "exactly its block");
    let did = offload_discarding(
        &top,
        SleepPlan {
            discard: plan,
            fill: DiscardFill::Zero,
            ..SleepPlan::default()
        },
    )
    .unwrap();
    assert_eq!(
        did.copied_bytes,
        kept.iter().map(|b| aligned(b.1)).sum::<usize>()
    );
    assert!(did.cached_free_bytes >= 300_000, "{did:?}");
    assert_eq!(vm.mapped_bytes(), 0);
    let e = top.allocate(256, S).unwrap_err();
    assert!(e.to_string().contains("asleep"), "{e}");
    let stats = top.report().unwrap().memory_stats().unwrap();
    assert_eq!(stats.reserved_bytes.current, 0);
    assert_eq!(stats.offloaded_bytes, 1 << 20);
    assert!(top
        .report()
        .unwrap()
        .memory_snapshot()
        .unwrap()
        .iter()
        .all(|s| s.offloaded));
    restore(&top).unwrap();
    assert_intact(&kept);
    assert!(all_zero(lost.0, lost.1));
    for (p, s, _) in blocks {
        free(&*top, p, s).unwrap();
    }
}

#[test]
fn pages_kept_ready_as_the_pool_grows_serve_the_first_sleep() {
    let (vm, mr) = host_pool(64 * PAGE);
    assert_eq!(mr.keep_sleep_ready(true).unwrap(), 0, "nothing mapped yet");
    let mut live = Vec::new();
    for i in 0..6 {
        let p = mr.allocate(3 * PAGE, S).unwrap();
        write(p, 3 * PAGE, i);
        live.push(p);
    }
    vm.supply.wait_prepared();
    let f = vm.supply.figures();
    // A few asks over the growth, each making only what the ranges made before lack (a
    // quarter above what was mapped): nothing remade, nothing given back.
    let mapped = mr.mapped_bytes();
    assert!(f.made_ranges <= 6, "{f:?}");
    assert_eq!(f.given_back_bytes, 0, "{f:?}");
    assert_eq!(f.free_bytes as u64, f.made_bytes, "{f:?}");
    assert!(
        f.free_bytes >= mapped && f.free_bytes <= mapped + mapped / 4 + 2 * PAGE,
        "{f:?}, {mapped} mapped"
    );
    mr.offload().unwrap();
    let slept = mr.last_sleep().unwrap();
    assert!(slept.host_reused, "the first sleep found its pages ready");
    assert!(slept.host_ranges >= 1 && slept.host_ranges as u64 <= f.made_ranges);
    mr.restore().unwrap();
    let after = vm.supply.figures();
    assert_eq!(
        (after.given_back_bytes, after.free_bytes, after.made_ranges),
        (0, f.free_bytes, f.made_ranges),
        "the wake keeps every range, gives nothing back, makes nothing"
    );
    // The next sleep takes the same ranges again.
    mr.offload().unwrap();
    assert!(mr.last_sleep().unwrap().host_reused);
    mr.restore().unwrap();
    for (i, &p) in live.iter().enumerate() {
        assert_eq!(mismatch(p, 3 * PAGE, i as u64), None);
        free(&mr, p, 3 * PAGE).unwrap();
    }
    assert_eq!(mr.keep_sleep_ready(false).unwrap(), 0);
}

/// A sleep the pool's user did not ask for (a shared GPU's ledger put an idle process to sleep)
/// wakes at the next use: an allocation from the pool, one from a pool above it, a copy of its
/// bytes; a sleep the user asked for still refuses them all.
#[test]
fn a_sleep_until_used_wakes_at_the_next_allocation_or_copy() {
    use crate::resource::sleep::check_awake;
    let (_vm, mr) = host_pool(64 * PAGE);
    let blocks = written_blocks(&mr, &[1000, PAGE + 300], 7);
    let until_used = SleepPlan {
        cause: SleepCause::Ledger,
        ..SleepPlan::default()
    };
    // A plain sleep refuses.
    mr.offload().unwrap();
    assert!(mr.allocate(64, S).is_err());
    assert!(check_awake("src", blocks[0].0, 8).is_err());
    assert!(!mr.wake_for_use(), "a sleep its user asked for stays");
    mr.restore().unwrap();
    // Until used: an allocation wakes it, bytes intact.
    mr.offload_plan(&until_used).unwrap();
    assert!(mr.asleep());
    let p = mr.allocate(64, S).unwrap();
    assert!(!mr.asleep());
    assert_intact(&blocks);
    free(&mr, p, 64).unwrap();
    // A copy of its bytes wakes it.
    mr.offload_plan(&until_used).unwrap();
    assert!(check_awake("src", blocks[1].0, 16).is_ok());
    assert!(!mr.asleep());
    assert_intact(&blocks);
    // An allocation from a pool over it wakes it (through the pool's link).
    let shared: SharedResource = Arc::new(mr.clone());
    let pool = crate::suballocator::PoolMemoryResource::new(shared, Some(0), None).unwrap();
    let q = pool.allocate(256, S).unwrap();
    mr.offload_plan(&until_used).unwrap();
    let r = pool.allocate(PAGE * 2, S).unwrap();
    assert!(!mr.asleep());
    assert_intact(&blocks);
    // SAFETY: allocated above from this pool with these sizes, freed once.
    unsafe {
        pool.deallocate(q, 256, S).unwrap();
        pool.deallocate(r, PAGE * 2, S).unwrap();
    }
}

/// Issue 46, "a tag added later": a pool built over a tagged resource before a tag was added
/// sees the tag's pool through its live link: it refuses to hand out its cached blocks while the
/// tag sleeps, and the tag's sleep copies only the pool's live blocks (the pool is its tenant).
#[test]
fn a_tag_added_after_a_pool_over_it_is_seen_by_that_pool() {
    use crate::adaptor::TaggedMemoryResource;
    let (_first_vm, first) = host_pool(64 * PAGE);
    let (_kv_vm, kv) = host_pool(64 * PAGE);
    let tagged = TaggedMemoryResource::new("first", first.clone());
    let shared: SharedResource = Arc::new(tagged.clone());
    let pool = crate::suballocator::PoolMemoryResource::new(shared, Some(0), None).unwrap();
    tagged.add_tag("kv", kv.clone()).unwrap();
    tagged.set_current_tag(Some("kv")).unwrap();
    let live = pool.allocate(PAGE, S).unwrap();
    let cached = pool.allocate(2 * PAGE, S).unwrap();
    tagged.set_current_tag(None).unwrap();
    let kv_base = kv.virtual_memory().base();
    assert!(
        live >= kv_base && cached >= kv_base,
        "the pool grew in the kv tag's pool"
    );
    write(live, PAGE, 5);
    free(&pool, cached, 2 * PAGE).unwrap();
    let did = kv.offload().unwrap();
    assert_eq!(
        did.copied_bytes, PAGE,
        "only the pool's live block: {did:?}"
    );
    assert!(did.cached_free_bytes >= 2 * PAGE, "{did:?}");
    let refused = pool.allocate(2 * PAGE, S).unwrap_err().to_string();
    assert!(refused.contains("asleep"), "{refused}");
    kv.restore().unwrap();
    assert_eq!(mismatch(live, PAGE, 5), None);
    let again = pool.allocate(2 * PAGE, S).unwrap();
    free(&pool, again, 2 * PAGE).unwrap();
    free(&pool, live, PAGE).unwrap();
}

/// An offload for the ledger stops between its chunks once it is no longer wanted, maps back
/// what it unmapped, and changes nothing; one for the user is not abandoned by a wake for the
/// ledger.
#[test]
fn an_offload_no_longer_wanted_is_abandoned_with_every_byte_in_place() {
    let (vm, mr) = host_pool(64 * PAGE);
    let blocks = written_blocks(&mr, &[3 * PAGE, 2 * PAGE + 17, PAGE, 4 * PAGE], 40);
    // Free pages go at any transition (trimmed): only the live ones count.
    mr.trim(0).unwrap();
    let mapped = vm.mapped_bytes();
    for give_up_at in 1..6 {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let plan = SleepPlan::for_ledger(Arc::new(move || {
            seen.fetch_add(1, Ordering::SeqCst) < give_up_at
        }));
        let e = mr.offload_plan(&plan).unwrap_err().to_string();
        assert!(e.contains("abandoned"), "{e}");
        assert!(!mr.asleep() && mr.movement().phase == Phase::Awake);
        assert_eq!(vm.mapped_bytes(), mapped, "every page mapped again");
        assert_intact(&blocks);
        let p = mr.allocate(PAGE, S).unwrap();
        free(&mr, p, PAGE).unwrap();
        mr.trim(0).unwrap();
    }
}

/// Issue 46, "busy during a sleep": the ledger's offload runs while the process was idle; the
/// process declares itself busy (idle off, then a wake for the ledger) from another thread at
/// any moment. Once the wake returns the pool is awake and stays awake (an offload not started
/// yet is refused, one in flight abandoned, one done woken), with every byte in place.
#[test]
fn busy_declared_during_a_ledger_sleep_leaves_the_pool_awake() {
    let (vm, mr) = host_pool(64 * PAGE);
    let blocks = written_blocks(&mr, &[5 * PAGE, 3 * PAGE + 9, 6 * PAGE], 70);
    mr.trim(0).unwrap();
    let mapped = vm.mapped_bytes();
    for round in 0..40u32 {
        let idle = Arc::new(AtomicBool::new(true));
        let wanted = idle.clone();
        let plan = SleepPlan::for_ledger(Arc::new(move || wanted.load(Ordering::SeqCst)));
        std::thread::scope(|s| {
            let sleeper = s.spawn(|| mr.offload_plan(&plan));
            for _ in 0..round % 4 {
                std::thread::yield_now();
            }
            idle.store(false, Ordering::SeqCst);
            assert!(mr.wake(Some(SleepCause::Ledger)).unwrap());
            assert!(!mr.asleep(), "awake when busy returns");
            let _ = sleeper.join().unwrap();
        });
        assert!(!mr.asleep(), "and stays awake (round {round})");
        assert_eq!(vm.mapped_bytes(), mapped);
        assert_intact(&blocks);
    }
}

/// A pool the ledger put to sleep is the user's once the user offloads it (no longer woken by
/// use); a user's sleep is not woken by a wake for the ledger.
#[test]
fn a_users_offload_of_a_ledger_sleep_makes_it_the_users() {
    let (_vm, mr) = host_pool(64 * PAGE);
    let blocks = written_blocks(&mr, &[PAGE + 1], 90);
    mr.offload_plan(&SleepPlan::for_ledger(Arc::new(|| true)))
        .unwrap();
    assert_eq!(mr.movement().cause, Some(SleepCause::Ledger));
    mr.offload().unwrap();
    assert_eq!(mr.movement().cause, Some(SleepCause::User));
    assert!(!mr.wake(Some(SleepCause::Ledger)).unwrap(), "stays asleep");
    assert!(mr.allocate(64, S).is_err(), "no wake on use");
    assert!(mr.offload().is_err(), "asleep already");
    mr.restore().unwrap();
    assert_intact(&blocks);
    assert_eq!(mr.movement().cause, None);
}

/// A pool dropped while asleep leaves the process's index (its addresses are given back with
/// it: a copy there later must not name it).
#[test]
fn a_pool_dropped_asleep_leaves_the_index() {
    use crate::resource::sleep::check_awake;
    let (vm, mr) = host_pool(16 * PAGE);
    let blocks = written_blocks(&mr, &[PAGE], 1);
    let base = vm.base();
    mr.offload().unwrap();
    assert!(check_awake("src", base, 8).is_err());
    drop(mr);
    assert!(check_awake("src", base, 8).is_ok(), "no stale entry");
    drop(blocks);
}

mod backup;
