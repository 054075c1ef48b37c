//! The cost of checked frees: allocate + free round trips on simulated memory, directly and
//! through a [`CheckedResourceAdaptor`], and the [`LiveAllocations`] registry alone; the system
//! resource (which checks its frees) for reference. Release mode:
//! `cargo bench --bench checked_free`.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use rrmm::{
    CheckedResourceAdaptor, LiveAllocations, MemoryResource, SharedResource,
    SimulatedMemoryResource, Stream, SystemMemoryResource,
};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

fn round_trip(mr: &dyn MemoryResource) {
    let p = mr.allocate(black_box(4096), Stream::DEFAULT).unwrap_or(0);
    // SAFETY: `p` was just allocated with 4096 bytes from `mr` and is freed once; nothing
    // uses it.
    let _ = unsafe { mr.deallocate(black_box(p), 4096, Stream::DEFAULT) };
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("checked_free");
    g.measurement_time(Duration::from_secs(3));
    let sim: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 30));
    // Keep some allocations live so the maps are not trivially empty.
    let held: Vec<usize> = (0..1000)
        .filter_map(|_| sim.allocate(256, Stream::DEFAULT).ok())
        .collect();
    g.bench_function("simulated", |b| b.iter(|| round_trip(sim.as_ref())));
    let checked = CheckedResourceAdaptor::new(sim.clone());
    let held_checked: Vec<usize> = (0..1000)
        .filter_map(|_| checked.allocate(256, Stream::DEFAULT).ok())
        .collect();
    g.bench_function("checked(simulated)", |b| b.iter(|| round_trip(&checked)));
    let live = LiveAllocations::new();
    for i in 0..1000usize {
        let _ = live.insert(0x7f00_0000_0000 + i * 256, 256);
    }
    g.bench_function("registry insert+remove", |b| {
        b.iter(|| {
            let p = black_box(0x7e00_0000_0000usize);
            let _ = live.insert(p, 4096);
            let _ = live.remove(p, 4096);
        })
    });
    let system = SystemMemoryResource::new();
    g.bench_function("system (checked)", |b| b.iter(|| round_trip(&system)));
    g.finish();
    for p in held_checked {
        // SAFETY: allocated above through `checked` with 256 bytes, freed once.
        let _ = unsafe { checked.deallocate(p, 256, Stream::DEFAULT) };
    }
    for p in held {
        // SAFETY: allocated above from `sim` with 256 bytes, freed once.
        let _ = unsafe { sim.deallocate(p, 256, Stream::DEFAULT) };
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
