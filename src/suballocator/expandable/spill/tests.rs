//! Spilling and promotion on a pretend device of host memory, with real bytes: every live
//! block keeps its bytes and its address across spills, frees, promotions and sleeps, pages
//! on the device never pass its capacity, and the spill's figures add up.

use super::*;
use crate::cuda::Stream;
use crate::resource::{HostVirtualMemory, MemoryResource, VirtualMemory};
use crate::suballocator::ExpandableSizes;
use crate::test_support::free_on;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

const PAGE: usize = 2 << 20;
const S: Stream = Stream::DEFAULT;

/// A pool over a pretend device of `device_pages` pages that spills at most `spill_pages`.
fn spilling_pool(
    device_pages: usize,
    spill_pages: usize,
) -> (Arc<HostVirtualMemory>, ExpandableMemoryResource) {
    let vm = Arc::new(
        HostVirtualMemory::pretend_device(
            64 * PAGE,
            Some(PAGE),
            device_pages * PAGE,
            spill_pages * PAGE,
        )
        .unwrap(),
    );
    let mr = ExpandableMemoryResource::new(vm.clone(), ExpandableSizes::default()).unwrap();
    (vm, mr)
}

/// The bytes a block's check reads: the first and last of every 4 KiB (a page given to the OS
/// comes back as zeros, whole).
fn probes(bytes: usize) -> impl Iterator<Item = usize> {
    (0..bytes)
        .step_by(4096)
        .flat_map(move |i| [i, (i + 4095).min(bytes - 1)])
}

fn byte(i: usize, seed: u8) -> u8 {
    seed.wrapping_add((i / 4096) as u8) | 1
}

#[allow(unsafe_code)]
fn fill(addr: usize, bytes: usize, seed: u8) {
    for i in probes(bytes) {
        // SAFETY: inside a live block of plain host memory the test owns.
        unsafe { *((addr + i) as *mut u8) = byte(i, seed) };
    }
}

#[allow(unsafe_code)]
fn holds(addr: usize, bytes: usize, seed: u8) -> bool {
    // SAFETY: as `fill`.
    probes(bytes).all(|i| unsafe { *((addr + i) as *const u8) } == byte(i, seed))
}

fn device_pages(vm: &HostVirtualMemory) -> usize {
    let (free, total) = vm.memory_info().unwrap();
    (total - free) / PAGE
}

#[test]
fn data_beyond_the_device_spills_and_promotes_with_its_bytes_and_addresses() {
    let (vm, mr) = spilling_pool(4, 8);
    // Six pages of data on a four-page device: two spill.
    let blocks: Vec<usize> = (0..6).map(|_| mr.allocate(PAGE, S).unwrap()).collect();
    for (i, &b) in blocks.iter().enumerate() {
        fill(b, PAGE, i as u8 * 17);
    }
    assert_eq!(mr.spilled_bytes(), 2 * PAGE);
    assert_eq!(device_pages(&vm), 4);
    let f = mr.spill_figures().unwrap();
    assert_eq!((f.spilled, f.kept, f.made), (2 * PAGE, 0, 2 * PAGE as u64));

    // Promotion with no room moves nothing and keeps every byte.
    let none = mr.promote(None, None).unwrap();
    assert_eq!((none.promoted, none.spilled), (0, 2 * PAGE));

    // Two device blocks freed: room for the spilled two.
    for &b in &blocks[..2] {
        free_on(&mr, b, PAGE, S).unwrap();
    }
    let report = mr.promote(None, None).unwrap();
    assert_eq!((report.promoted, report.spilled), (2 * PAGE, 0));
    assert!(
        report.trimmed >= 2 * PAGE,
        "the free device pages made the room"
    );
    for (i, &b) in blocks.iter().enumerate().skip(2) {
        assert!(holds(b, PAGE, i as u8 * 17), "block {i} kept its bytes");
    }
    assert_eq!(device_pages(&vm), 4);
    let f = mr.spill_figures().unwrap();
    assert_eq!(
        (f.spilled, f.kept, f.promoted),
        (0, 2 * PAGE, 2 * PAGE as u64)
    );

    // The next spill takes the kept pages: none made.
    let more: Vec<usize> = (0..2).map(|_| mr.allocate(PAGE, S).unwrap()).collect();
    assert_eq!(mr.spilled_bytes(), 2 * PAGE);
    let f = mr.spill_figures().unwrap();
    assert_eq!((f.made, f.reused), (2 * PAGE as u64, 2 * PAGE as u64));
    for b in more.into_iter().chain(blocks.into_iter().skip(2)) {
        free_on(&mr, b, PAGE, S).unwrap();
    }
    assert_eq!(mr.trim(0).unwrap(), 6 * PAGE);
    assert_eq!(mr.give_back_spill(0), 2 * PAGE);
}

#[test]
fn the_spill_limit_is_out_of_memory_and_the_pool_goes_on() {
    let (_, mr) = spilling_pool(2, 1);
    let a = mr.allocate(2 * PAGE, S).unwrap();
    let b = mr.allocate(PAGE, S).unwrap();
    let refused = mr.allocate(PAGE, S).unwrap_err();
    assert!(refused.is_out_of_memory(), "{refused}");
    assert!(refused.to_string().contains("limit"), "{refused}");
    free_on(&mr, b, PAGE, S).unwrap();
    let c = mr.allocate(PAGE, S).unwrap();
    free_on(&mr, c, PAGE, S).unwrap();
    free_on(&mr, a, 2 * PAGE, S).unwrap();
}

#[test]
fn a_promotion_limited_to_a_range_or_bytes_moves_only_those() {
    let (_, mr) = spilling_pool(2, 8);
    let blocks: Vec<usize> = (0..5).map(|_| mr.allocate(PAGE, S).unwrap()).collect();
    for (i, &b) in blocks.iter().enumerate() {
        fill(b, PAGE, i as u8);
    }
    assert_eq!(mr.spilled_bytes(), 3 * PAGE);
    for &b in &blocks[..2] {
        free_on(&mr, b, PAGE, S).unwrap();
    }
    // Only the last block's page.
    let r = mr.promote(Some((blocks[4] + 10, 1)), None).unwrap();
    assert_eq!((r.promoted, r.spilled), (PAGE, 2 * PAGE));
    // At most one page more, of any.
    let r = mr.promote(None, Some(1)).unwrap();
    assert_eq!((r.promoted, r.spilled), (PAGE, PAGE));
    for (i, &b) in blocks.iter().enumerate().skip(2) {
        assert!(holds(b, PAGE, i as u8));
    }
}

#[test]
fn a_spilled_pool_sleeps_and_wakes_with_every_byte() {
    let (_, mr) = spilling_pool(3, 8);
    let blocks: Vec<usize> = (0..5).map(|_| mr.allocate(PAGE, S).unwrap()).collect();
    for (i, &b) in blocks.iter().enumerate() {
        fill(b, PAGE, 100 + i as u8);
    }
    mr.offload_with(crate::suballocator::DiscardFill::Undefined)
        .unwrap();
    assert!(mr.promote(None, None).is_err(), "no promotion while asleep");
    mr.restore().unwrap();
    for (i, &b) in blocks.iter().enumerate() {
        assert!(holds(b, PAGE, 100 + i as u8), "block {i}");
    }
    assert_eq!(
        mr.spilled_bytes(),
        2 * PAGE,
        "the wake spills what the device lacks"
    );
}

#[derive(Clone, Debug)]
enum Op {
    Allocate(usize),
    Free(usize),
    Promote(Option<usize>),
    Trim,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1..3 * PAGE).prop_map(Op::Allocate),
        3 => any::<usize>().prop_map(Op::Free),
        2 => proptest::option::of(1..4 * PAGE).prop_map(Op::Promote),
        1 => Just(Op::Trim),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any sequence of allocations, frees, promotions and trims on a pretend device: every
    /// live block keeps its bytes; the device's pages never pass its capacity; the spilled
    /// runs are the figures' spilled bytes; a promotion with room left moves every spilled
    /// page it may.
    #[test]
    fn any_sequence_keeps_every_byte(ops in proptest::collection::vec(op(), 1..40)) {
        let (vm, mr) = spilling_pool(6, 10);
        let mut live: BTreeMap<usize, (usize, u8)> = BTreeMap::new();
        let mut seed = 1u8;
        for op in ops {
            match op {
                Op::Allocate(bytes) => {
                    if let Ok(ptr) = mr.allocate(bytes, S) {
                        fill(ptr, bytes, seed);
                        live.insert(ptr, (bytes, seed));
                        seed = seed.wrapping_add(29);
                    }
                }
                Op::Free(pick) => {
                    if !live.is_empty() {
                        let &ptr = live.keys().nth(pick % live.len()).unwrap();
                        let (bytes, _) = live.remove(&ptr).unwrap();
                        free_on(&mr, ptr, bytes, S).unwrap();
                    }
                }
                Op::Promote(limit) => {
                    let before = mr.spilled_bytes();
                    let r = mr.promote(None, limit).unwrap();
                    prop_assert_eq!(r.spilled, mr.spilled_bytes());
                    prop_assert!(r.promoted <= before);
                    if limit.is_none() && r.spilled > 0 {
                        prop_assert_eq!(device_pages(&vm), 6, "stopped with room left");
                    }
                }
                Op::Trim => {
                    mr.trim(0).unwrap();
                }
            }
            prop_assert!(device_pages(&vm) <= 6);
            let f = mr.spill_figures().unwrap();
            prop_assert_eq!(f.spilled, mr.spilled_bytes());
            prop_assert!(f.spilled + f.kept <= f.limit);
            for (&ptr, &(bytes, s)) in &live {
                prop_assert!(holds(ptr, bytes, s), "block at {:#x} lost its bytes", ptr);
            }
        }
    }
}
