//! The expandable pool against replayed logs on simulated memory: the log that fails on the
//! pool for want of coalescing across growth, and the shipped traces, whose end-of-replay
//! footprint after `trim(0)` is exactly the pages the live allocations touch.

use rrmm::replay::{build_resource, replay, Action, ReplayOptions, Trace};
use rrmm::resource::{SimulatedVirtualMemory, VirtualMemory, DEFAULT_PAGE_SIZE};
use rrmm::suballocator::ExpandableMemoryResource;
use rrmm::{MemoryResource, Stream};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

const GIB: usize = 1 << 30;
const P: usize = DEFAULT_PAGE_SIZE;

/// 12 GiB, 8 GiB, free the 12, then 20 GiB.
fn growth_log() -> Trace {
    let gib = GIB;
    let text = format!(
        "Thread,Time,Action,Pointer,Size,Stream\n\
         1,t,allocate,0x7f0000000000,{a},0x0\n\
         1,t,allocate,0x7f1000000000,{b},0x0\n\
         1,t,free,0x7f0000000000,{a},0x0\n\
         1,t,allocate,0x7f2000000000,{c},0x0\n",
        a = 12 * gib,
        b = 8 * gib,
        c = 20 * gib
    );
    Trace::from_reader("growth", text.as_bytes(), false).unwrap()
}

#[test]
fn the_growth_log_replays_on_expandable_and_fails_on_the_pool() {
    let trace = growth_log();
    let expandable = build_resource("expandable", Some(32 * GIB), None, None).unwrap();
    let r = replay(&trace, &expandable, ReplayOptions::default()).unwrap();
    assert_eq!(r.failed_allocations, 0);
    let pool = build_resource("pool", Some(32 * GIB), None, None).unwrap();
    let r = replay(&trace, &pool, ReplayOptions::default()).unwrap();
    assert_eq!(
        r.failed_allocations, 1,
        "the pool fails although 24 GiB are free"
    );
}

/// The trace `name` shipped in `python/rrmm/traces` (a missing one fails the test).
fn shipped_trace(name: &str) -> Trace {
    let path = format!(
        "{}/python/rrmm/traces/{name}.csv.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    Trace::from_path(&path, false).unwrap_or_else(|e| panic!("shipped trace {path}: {e}"))
}

#[test]
fn after_trim_the_footprint_is_the_pages_live_allocations_touch() {
    for name in [
        "random_10k_1mib",
        "transformer_training",
        "random_100k_4mib",
    ] {
        let trace = shipped_trace(name);
        let vm = Arc::new(SimulatedVirtualMemory::new(64 * GIB, 256 * GIB, P).unwrap());
        let mr = ExpandableMemoryResource::new(vm.clone(), None, None, None).unwrap();
        let streams: Vec<Stream> = trace
            .streams
            .iter()
            .map(|&s| {
                // SAFETY: keys for simulated memory, never passed to the driver.
                unsafe { Stream::from_raw(s) }
            })
            .collect();
        let mut slots: HashMap<u32, (usize, usize, Stream)> = HashMap::new();
        for e in &trace.events {
            let stream = streams[e.stream as usize];
            match e.action {
                Action::Allocate => {
                    let p = mr.allocate(e.size, stream).unwrap();
                    slots.insert(e.slot, (p, e.size, stream));
                }
                Action::Free => {
                    if let Some((p, size, s)) = slots.remove(&e.slot) {
                        // SAFETY: allocated above with this size, freed once; no work runs on
                        // simulated memory.
                        unsafe { mr.deallocate(p, size, s) }.unwrap();
                    }
                }
            }
        }
        let peak = vm.peak_mapped_bytes();
        mr.trim(0).unwrap();
        let live: Vec<(usize, usize)> = slots
            .values()
            .filter(|&&(p, _, _)| p != 0)
            .map(|&(p, s, _)| (p, s))
            .collect();
        let in_use: usize = live.iter().map(|&(_, s)| s.div_ceil(256) * 256).sum();
        let mut pages = BTreeSet::new();
        for &(p, s) in &live {
            let end = p + s.div_ceil(256) * 256;
            pages.extend(p / P..end.div_ceil(P));
        }
        eprintln!(
            "{name}: peak mapped {peak}, after trim {} for {} live bytes ({} pages touched, \
             {} pages if packed)",
            mr.mapped_bytes(),
            in_use,
            pages.len(),
            in_use.div_ceil(P)
        );
        assert_eq!(mr.mapped_bytes(), pages.len() * P, "{name}");
        assert_eq!(vm.mapped_bytes(), mr.mapped_bytes());
        assert!(
            mr.mapped_bytes() <= in_use.div_ceil(P) * P + live.len() * P,
            "{name}: at most one partly used page per live allocation beyond the packed figure"
        );
        for (p, size, s) in slots.into_values() {
            // SAFETY: live allocations of this resource, freed once.
            unsafe { mr.deallocate(p, size, s) }.unwrap();
        }
        mr.trim(0).unwrap();
        assert_eq!(mr.mapped_bytes(), 0, "{name}");
    }
}
