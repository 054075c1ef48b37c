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
    // Past the mark the keep holds half of what spilled ready: one page made ahead.
    assert_eq!(
        (f.spilled, f.kept, f.made, f.made_ahead),
        (2 * PAGE, PAGE, 3 * PAGE as u64, PAGE as u64)
    );

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
        (0, 3 * PAGE, 2 * PAGE as u64)
    );
    assert_eq!(
        f.promote_reused,
        2 * PAGE as u64,
        "the freed device pages were lent to the move (none made)"
    );

    // The next spill takes the kept pages: none made.
    let more: Vec<usize> = (0..2).map(|_| mr.allocate(PAGE, S).unwrap()).collect();
    assert_eq!(mr.spilled_bytes(), 2 * PAGE);
    let f = mr.spill_figures().unwrap();
    assert_eq!((f.made, f.reused), (3 * PAGE as u64, 2 * PAGE as u64));
    for b in more.into_iter().chain(blocks.into_iter().skip(2)) {
        free_on(&mr, b, PAGE, S).unwrap();
    }
    assert_eq!(mr.trim(0).unwrap(), 6 * PAGE);
    assert_eq!(mr.give_back_spill(0), 3 * PAGE);
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
    SafePoint,
    AutoPromote(AutoPromote),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1..3 * PAGE).prop_map(Op::Allocate),
        3 => any::<usize>().prop_map(Op::Free),
        2 => proptest::option::of(1..4 * PAGE).prop_map(Op::Promote),
        1 => Just(Op::Trim),
        1 => Just(Op::SafePoint),
        1 => prop_oneof![
            Just(AutoPromote::SafePoints),
            Just(AutoPromote::Frees),
            Just(AutoPromote::Off)
        ]
        .prop_map(Op::AutoPromote),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any sequence of allocations, frees, promotions and trims on a pretend device: every
    /// live block keeps its bytes; the device's pages never pass its capacity; the spilled
    /// runs are the figures' spilled bytes; a promotion with room left moves every spilled
    /// page it may, at a safe point too (unless auto promotion is off), and frees in any
    /// auto-promotion mode move pages without losing a byte.
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
                Op::SafePoint => {
                    let r = mr.promote_at_safe_point().unwrap();
                    if mr.auto_promote() == AutoPromote::Off {
                        prop_assert_eq!(r.promoted, 0);
                    } else if mr.spilled_bytes() > 0 {
                        prop_assert_eq!(device_pages(&vm), 6, "stopped with room left");
                    }
                }
                Op::AutoPromote(when) => mr.set_auto_promote(when),
            }
            prop_assert!(device_pages(&vm) <= 6);
            let f = mr.spill_figures().unwrap();
            prop_assert_eq!(f.spilled, mr.spilled_bytes());
            prop_assert!(f.spilled + f.kept <= f.limit);
            prop_assert!(f.made_ahead <= f.made);
            prop_assert!(f.promote_reused <= f.promoted);
            prop_assert_eq!(
                device_pages(&vm) * PAGE,
                vm.mapped_bytes() - f.spilled,
                "device pages lent to a promotion and not taken were released"
            );
            for (&ptr, &(bytes, s)) in &live {
                prop_assert!(holds(ptr, bytes, s), "block at {:#x} lost its bytes", ptr);
            }
        }
    }
}

#[test]
fn the_spill_window_opens_at_three_quarters_and_follows_the_spill() {
    use crate::resource::host_pages::mapped::spill_window;
    let total = 64 * PAGE;
    assert_eq!(
        spill_window(total / 4 + 1, total, 0),
        None,
        "below the mark"
    );
    assert_eq!(spill_window(total / 4, total, 0), Some(total / 16));
    assert_eq!(spill_window(0, total, 10 * PAGE), Some(5 * PAGE));
}

#[test]
fn pages_are_made_ahead_past_the_mark_and_counted_apart() {
    // A 16-page device: nothing made ahead below 12 pages used, a sixteenth (one page) from
    // there, then half of what has spilled; within the limit.
    let (vm, mr) = spilling_pool(16, 6);
    let mut blocks = Vec::new();
    while device_pages(&vm) < 12 {
        let f = mr.spill_figures().unwrap();
        assert_eq!((f.kept, f.made_ahead), (0, 0), "below the mark: {f:?}");
        blocks.push(mr.allocate(PAGE, S).unwrap());
    }
    while mr.spilled_bytes() < 4 * PAGE {
        blocks.push(mr.allocate(PAGE, S).unwrap());
        let f = mr.spill_figures().unwrap();
        assert!(f.spilled + f.kept <= f.limit, "{f:?}");
        assert!(
            f.kept >= PAGE.min(f.limit - f.spilled),
            "a page kept ready: {f:?}"
        );
    }
    let f = mr.spill_figures().unwrap();
    assert!(f.made_ahead > 0 && f.made_ahead <= f.made, "{f:?}");
    assert!(f.reused > 0, "spills took the pages made ahead: {f:?}");
    for b in blocks {
        free_on(&mr, b, PAGE, S).unwrap();
    }
}

#[test]
fn spilled_pages_move_back_at_frees_only_where_asked_and_at_safe_points_by_default() {
    for when in [
        AutoPromote::SafePoints,
        AutoPromote::Frees,
        AutoPromote::Off,
    ] {
        let (vm, mr) = spilling_pool(4, 8);
        mr.set_auto_promote(when);
        assert_eq!(mr.auto_promote(), when);
        let blocks: Vec<usize> = (0..6).map(|_| mr.allocate(PAGE, S).unwrap()).collect();
        for (i, &b) in blocks.iter().enumerate() {
            fill(b, PAGE, 3 + i as u8);
        }
        assert_eq!(mr.spilled_bytes(), 2 * PAGE);
        for &b in &blocks[..2] {
            free_on(&mr, b, PAGE, S).unwrap();
        }
        let after_frees = mr.spilled_bytes();
        let at_rest = mr.promote_at_safe_point().unwrap();
        match when {
            AutoPromote::Frees => {
                assert_eq!(after_frees, 0, "the frees made room: moved back");
                assert_eq!(at_rest.promoted, 0);
            }
            AutoPromote::SafePoints => {
                assert_eq!(after_frees, 2 * PAGE, "no move at a free");
                assert_eq!((at_rest.promoted, at_rest.spilled), (2 * PAGE, 0));
            }
            AutoPromote::Off => {
                assert_eq!(after_frees, 2 * PAGE);
                assert_eq!((at_rest.promoted, mr.spilled_bytes()), (0, 2 * PAGE));
            }
        }
        assert!(device_pages(&vm) <= 4);
        for (i, &b) in blocks.iter().enumerate().skip(2) {
            assert!(
                holds(b, PAGE, 3 + i as u8),
                "{when:?}: block {i} kept its bytes"
            );
        }
    }
    assert_eq!("frees".parse::<AutoPromote>().unwrap(), AutoPromote::Frees);
    let e = "always".parse::<AutoPromote>().unwrap_err().to_string();
    assert!(
        e.contains("auto_promote") && e.contains("safe_points"),
        "{e}"
    );
}

#[test]
fn a_wake_is_a_safe_point_that_moves_spilled_pages_back() {
    let (_, mr) = spilling_pool(4, 8);
    let blocks: Vec<usize> = (0..6).map(|_| mr.allocate(PAGE, S).unwrap()).collect();
    for (i, &b) in blocks.iter().enumerate() {
        fill(b, PAGE, 50 + i as u8);
    }
    for &b in &blocks[..2] {
        free_on(&mr, b, PAGE, S).unwrap();
    }
    assert_eq!(mr.spilled_bytes(), 2 * PAGE, "no move at a free by default");
    mr.offload_with(crate::suballocator::DiscardFill::Undefined)
        .unwrap();
    mr.restore().unwrap();
    assert_eq!(
        mr.spilled_bytes(),
        0,
        "the wake found room and moved them back"
    );
    for (i, &b) in blocks.iter().enumerate().skip(2) {
        assert!(holds(b, PAGE, 50 + i as u8), "block {i}");
    }
}

#[test]
fn a_users_wake_of_any_kind_is_a_safe_point_and_a_wake_for_use_is_not() {
    use crate::resource::sleep::{SleepCause, SleepPlan};
    // The stacks' restore wakes with no cause (rrmm.sleep()'s end, restore() of any
    // resource); an allocation wakes a ledger sleep for use, with kernels maybe in flight.
    for (cause, plan, moves) in [
        (None, SleepPlan::default(), true),
        (Some(SleepCause::User), SleepPlan::default(), true),
        (
            Some(SleepCause::Ledger),
            SleepPlan::for_ledger(Arc::new(|| true)),
            false,
        ),
    ] {
        let (_, mr) = spilling_pool(4, 8);
        let blocks: Vec<usize> = (0..6).map(|_| mr.allocate(PAGE, S).unwrap()).collect();
        for (i, &b) in blocks.iter().enumerate() {
            fill(b, PAGE, 90 + i as u8);
        }
        for &b in &blocks[..2] {
            free_on(&mr, b, PAGE, S).unwrap();
        }
        mr.offload_plan(&plan).unwrap();
        assert!(mr.wake(cause).unwrap(), "{cause:?}");
        let expected = if moves { 0 } else { 2 * PAGE };
        assert_eq!(mr.spilled_bytes(), expected, "{cause:?}");
        for (i, &b) in blocks.iter().enumerate().skip(2) {
            assert!(holds(b, PAGE, 90 + i as u8), "{cause:?}: block {i}");
        }
    }
}

#[test]
fn a_reader_in_flight_never_sees_a_page_move_under_it_without_a_safe_point() {
    // A kernel's stand-in: a thread reading a spilled block over and over while the main thread
    // frees and allocates (the default: moves only at safe points). The spilled runs it reads
    // stay where they are until it has stopped and the main thread declares a safe point.
    let (_, mr) = spilling_pool(4, 8);
    let blocks: Vec<usize> = (0..6).map(|_| mr.allocate(PAGE, S).unwrap()).collect();
    for (i, &b) in blocks.iter().enumerate() {
        fill(b, PAGE, 70 + i as u8);
    }
    let runs = mr.inner.vm.spilled_runs();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) || reads == 0 {
                assert!(holds(blocks[5], PAGE, 75));
                assert_eq!(
                    mr.inner.vm.spilled_runs(),
                    runs,
                    "a page moved under a reader"
                );
                reads += 1;
            }
            reads
        });
        for round in 0..20 {
            free_on(&mr, blocks[round % 2], PAGE, S).unwrap();
            let again = mr.allocate(PAGE, S).unwrap();
            assert_eq!(again, blocks[round % 2]);
            fill(again, PAGE, 70 + (round % 2) as u8);
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(reader.join().unwrap() > 0);
    });
    free_on(&mr, blocks[0], PAGE, S).unwrap();
    let r = mr.promote_at_safe_point().unwrap();
    assert_eq!(
        r.promoted, PAGE,
        "at the safe point, after the reader stopped"
    );
    assert!(holds(blocks[5], PAGE, 75) && holds(blocks[4], PAGE, 74));
}
