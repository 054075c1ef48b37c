#![allow(unsafe_code)]

use super::*;
use crate::resource::sleep::{DiscardFill, SleepPlan};
use crate::resource::HostVirtualMemory;
use crate::suballocator::ExpandableSizes;
use crate::test_support::free;
use proptest::prelude::*;

const PAGE: usize = 2 << 20;
const S: Stream = Stream::DEFAULT;

/// An expandable pool over host virtual memory (real bytes).
fn pool() -> ExpandableMemoryResource {
    let vm = HostVirtualMemory::new(64 * PAGE, Some(PAGE), false, None).unwrap();
    ExpandableMemoryResource::new(Arc::new(vm), ExpandableSizes::default()).unwrap()
}

fn holds(pool: &ExpandableMemoryResource, ptr: usize) -> bool {
    let base = pool.virtual_memory().base();
    ptr >= base && ptr < base + pool.virtual_memory().reserved_bytes()
}

fn write(ptr: usize, bytes: usize, seed: u8) {
    // SAFETY: a live allocation of host virtual memory of `bytes` bytes, used by this test only.
    unsafe { std::ptr::write_bytes(ptr as *mut u8, seed, bytes) };
}

fn reads(ptr: usize, bytes: usize, seed: u8) -> bool {
    // SAFETY: as `write`.
    let got = unsafe { std::slice::from_raw_parts(ptr as *const u8, bytes) };
    // A block at a time (memcmp): a byte at a time was nearly all of the model test's time in
    // the debug build.
    let block = [seed; 4096];
    got.chunks(block.len()).all(|c| c == &block[..c.len()])
}

#[test]
fn each_tag_allocates_from_its_pool_and_sleeps_on_its_own() {
    let (weights, kv) = (pool(), pool());
    let mr = TaggedMemoryResource::new("weights", weights.clone());
    mr.add_tag("kv_cache", kv.clone()).unwrap();
    assert_eq!(mr.tags(), ["weights", "kv_cache"]);
    let w = mr.allocate(PAGE, S).unwrap();
    assert!(holds(&weights, w));
    assert_eq!(mr.set_current_tag(Some("kv_cache")).unwrap(), None);
    let k = mr.allocate(PAGE, S).unwrap();
    assert!(holds(&kv, k));
    assert_eq!(
        mr.set_current_tag(None).unwrap().as_deref(),
        Some("kv_cache")
    );
    write(w, PAGE, 7);
    write(k, PAGE, 9);
    // The KV cache is dropped, the weights stay on the device and keep working.
    let plan = SleepPlan {
        discard_all: true,
        ..SleepPlan::default()
    };
    let did = kv.offload_plan(&plan).unwrap();
    assert_eq!((did.copied_bytes, did.discarded_bytes), (0, PAGE));
    assert!(kv.asleep() && !weights.asleep());
    let w2 = mr.allocate(PAGE, S).unwrap();
    mr.set_current_tag(Some("kv_cache")).unwrap();
    assert!(mr.allocate(PAGE, S).is_err(), "the sleeping tag refuses");
    mr.set_current_tag(None).unwrap();
    kv.restore().unwrap();
    assert!(reads(w, PAGE, 7));
    // A block freed outside its tag's region goes back to its own pool.
    free(&mr, k, PAGE).unwrap();
    free(&mr, w, PAGE).unwrap();
    free(&mr, w2, PAGE).unwrap();
    assert!(matches!(free(&mr, 12345 << 8, PAGE), Err(Error::Logic(_))));
    // Bad tags.
    assert!(mr.set_current_tag(Some("nope")).is_err());
    assert!(mr.add_tag("weights", pool()).is_err());
    assert!(
        mr.add_tag("again", kv.clone()).is_err(),
        "the same pool twice"
    );
}

#[test]
fn the_current_tag_is_the_calling_thread_s() {
    let mr = TaggedMemoryResource::new("a", pool());
    mr.add_tag("b", pool()).unwrap();
    mr.set_current_tag(Some("b")).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(mr.current_tag(), None));
    });
    assert_eq!(mr.current_tag().as_deref(), Some("b"));
    // Another tagged resource on this thread sees no tag.
    let other = TaggedMemoryResource::new("x", pool());
    assert_eq!(other.current_tag(), None);
    mr.set_current_tag(None).unwrap();
}

#[derive(Clone, Debug)]
enum Op {
    Tag(Option<usize>),
    Alloc(usize),
    Free(usize),
    Sleep(usize, bool),
    Wake(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => prop::option::of(0usize..3).prop_map(Op::Tag),
        4 => (1usize..3).prop_map(Op::Alloc),
        3 => any::<usize>().prop_map(Op::Free),
        1 => (0usize..3, any::<bool>()).prop_map(|(t, d)| Op::Sleep(t, d)),
        1 => (0usize..3).prop_map(Op::Wake),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    /// Generated regions, allocations, frees and per-tag sleeps against a model: an allocation
    /// lands in the current tag's pool (refused while that pool sleeps), a free goes to its own
    /// pool wherever it is freed, a kept block's bytes survive its tag's sleep, and the other
    /// tags never notice.
    #[test]
    fn tags_match_a_model(ops in prop::collection::vec(op(), 1..60)) {
        let pools = [pool(), pool(), pool()];
        let mr = TaggedMemoryResource::new("t0", pools[0].clone());
        mr.add_tag("t1", pools[1].clone()).unwrap();
        mr.add_tag("t2", pools[2].clone()).unwrap();
        let mut current = 0usize;
        // (ptr, pages, tag, seed, bytes discarded)
        let mut live: Vec<(usize, usize, usize, u8, bool)> = Vec::new();
        let mut seed = 1u8;
        for op in ops {
            match op {
                Op::Tag(t) => {
                    mr.set_current_tag(t.map(|t| ["t0", "t1", "t2"][t])).unwrap();
                    current = t.unwrap_or(0);
                }
                Op::Alloc(pages) => {
                    let got = mr.allocate(pages * PAGE, S);
                    if pools[current].asleep() {
                        prop_assert!(got.is_err());
                    } else {
                        let ptr = got.unwrap();
                        prop_assert!(holds(&pools[current], ptr));
                        seed = seed.wrapping_add(1).max(1);
                        write(ptr, pages * PAGE, seed);
                        live.push((ptr, pages, current, seed, false));
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let (ptr, pages, ..) = live.swap_remove(i % live.len());
                    free(&mr, ptr, pages * PAGE).unwrap();
                }
                Op::Free(_) => {}
                Op::Sleep(t, discard_all) if !pools[t].asleep() => {
                    let plan = SleepPlan {
                        discard_all,
                        fill: DiscardFill::Undefined,
                        ..SleepPlan::default()
                    };
                    pools[t].offload_plan(&plan).unwrap();
                    for b in live.iter_mut().filter(|b| b.2 == t) {
                        b.4 |= discard_all;
                    }
                }
                Op::Sleep(..) => {}
                Op::Wake(t) if pools[t].asleep() => pools[t].restore().unwrap(),
                Op::Wake(_) => {}
            }
            for &(ptr, pages, tag, seed, discarded) in &live {
                if !pools[tag].asleep() && !discarded {
                    prop_assert!(reads(ptr, pages * PAGE, seed));
                }
            }
        }
        for p in &pools {
            if p.asleep() {
                p.restore().unwrap();
            }
        }
        for (ptr, pages, ..) in live {
            free(&mr, ptr, pages * PAGE).unwrap();
        }
        mr.set_current_tag(None).unwrap();
    }
}

/// Issue 46: a tagged resource made after another was dropped does not inherit its current tag
/// (the key is never reused, even where the new resource's state lands at the same address).
#[test]
fn a_new_tagged_resource_starts_with_no_current_tag() {
    for _ in 0..50 {
        let a = TaggedMemoryResource::new("first", pool());
        a.add_tag("second", pool()).unwrap();
        a.set_current_tag(Some("second")).unwrap();
        drop(a);
        let b = TaggedMemoryResource::new("first", pool());
        b.add_tag("second", pool()).unwrap();
        assert_eq!(b.current_tag(), None);
        let p = b.allocate(PAGE, S).unwrap();
        assert!(holds(&b.pool("first").unwrap(), p), "goes to the first tag");
        free(&b, p, PAGE).unwrap();
    }
}

/// Its figures are its pools' together: memory_stats and the snapshot of every tag's pool.
#[test]
fn a_tagged_resource_reports_its_pools_figures() {
    use crate::report::PoolReport;
    let mr = TaggedMemoryResource::new("a", pool());
    mr.add_tag("b", pool()).unwrap();
    let x = mr.allocate(PAGE, S).unwrap();
    mr.set_current_tag(Some("b")).unwrap();
    let y = mr.allocate(3 * PAGE, S).unwrap();
    mr.set_current_tag(None).unwrap();
    let stats = PoolReport::memory_stats(&mr).expect("the pools keep counters");
    assert_eq!(stats.allocation.current, 2);
    assert_eq!(stats.allocated_bytes.current, 4 * PAGE as u64);
    let segments = PoolReport::memory_snapshot(&mr).unwrap();
    assert!(segments.len() >= 2, "{segments:?}");
    assert!(mr.footprint().held_bytes >= 4 * PAGE);
    free(&mr, x, PAGE).unwrap();
    free(&mr, y, 3 * PAGE).unwrap();
}
