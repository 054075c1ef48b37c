//! Where `cuda_async`'s W1 time goes, on a GPU: the replay's loop through
//! `CudaAsyncMemoryResource` (as `rrmm replay` runs it) against the same loop calling the
//! driver's pool functions directly (`cuMemAllocFromPoolAsync` / `cuMemFreeAsync` on one warm
//! pool, the context made current once). The difference is rrmm's own cost per event; the rest is
//! the driver's. Alternating passes, median of each; prints one JSON line per trace and variant.
//! A third variant runs `rrmm::replay::replay` itself (the engine `rrmm replay` and W1 use) on
//! the same resource, to tell the engine's cost from the process it runs in. The driver loop also
//! runs on the per-thread default stream and on a non-blocking stream of its own ("driver ptds",
//! "driver stream"): the legacy default stream's implicit ordering with other streams is the
//! driver's own cost and differs between the three.
//!
//! Run: `cargo bench --bench cuda_async_overhead` (traces from `$RRMM_TRACES`, default the
//! shipped ones); on a machine without a GPU it says so and exits.

#![allow(missing_docs)]

use rrmm::cuda::{self, ContextGuard, MemPool, OwnedStream, PoolExport, Stream};
use rrmm::replay::{replay, Action, Repeat, ReplayOptions, Trace};
use rrmm::{CudaAsyncMemoryResource, MemoryResource, SharedResource};
use std::sync::Arc;
use std::time::Instant;

const TRACES: &[&str] = &[
    "random_10k_1mib",
    "random_100k_4mib",
    "transformer_training",
];
const REPS: usize = 7;

/// One pass of `trace` with `alloc`/`free`, timed; leaks freed after the clock stops.
fn pass(
    trace: &Trace,
    alloc: &dyn Fn(usize) -> usize,
    free: &dyn Fn(usize, usize),
    slots: &mut [(usize, usize)],
) -> f64 {
    cuda::context_synchronize().expect("synchronize");
    let start = Instant::now();
    for ev in &trace.events {
        let slot = ev.slot as usize;
        match ev.action {
            Action::Allocate => slots[slot] = (alloc(ev.size), ev.size),
            Action::Free => {
                let (ptr, size) = slots[slot];
                if ptr != 0 {
                    free(ptr, size);
                    slots[slot] = (0, 0);
                }
            }
        }
    }
    cuda::context_synchronize().expect("synchronize");
    let ns = start.elapsed().as_nanos() as f64 / trace.events.len() as f64;
    for slot in slots.iter_mut() {
        if slot.0 != 0 {
            free(slot.0, slot.1);
            *slot = (0, 0);
        }
    }
    ns
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    if !cuda::driver_available() || cuda::device_count() == 0 {
        println!("cuda_async_overhead: no CUDA device, nothing to measure");
        return;
    }
    let dir = std::env::var("RRMM_TRACES")
        .unwrap_or_else(|_| format!("{}/python/rrmm/traces", env!("CARGO_MANIFEST_DIR")));
    let _ctx = ContextGuard::new(0).expect("context");
    let export = PoolExport {
        ipc: false,
        fabric: false,
    };
    let resource = CudaAsyncMemoryResource::new(None, None, export).expect("cuda_async");
    let pool = MemPool::new(0, u64::MAX, export).expect("pool");
    let via_resource_alloc = |n: usize| resource.allocate(n, Stream::DEFAULT).unwrap_or(0);
    // SAFETY: `p` came from this resource with `n` bytes and is freed once (the pass clears it).
    let via_resource_free =
        |p: usize, n: usize| unsafe { resource.deallocate(p, n, Stream::DEFAULT) }.expect("free");
    let direct_alloc = |n: usize| pool.allocate(n, Stream::DEFAULT).unwrap_or(0);
    // SAFETY: `p` came from this pool and is freed once (the pass clears its slot).
    let direct_free =
        |p: usize, _n: usize| unsafe { cuda::mem_free_async(p, Stream::DEFAULT) }.expect("free");
    let ptds_alloc = |n: usize| pool.allocate(n, Stream::PER_THREAD).unwrap_or(0);
    // SAFETY: as above, on the per-thread default stream of this thread.
    let ptds_free =
        |p: usize, _n: usize| unsafe { cuda::mem_free_async(p, Stream::PER_THREAD) }.expect("free");
    let owned = OwnedStream::new(true).expect("stream");
    // SAFETY: `owned` outlives every use of this handle (it lives to the end of main).
    let own = unsafe { Stream::from_raw(owned.raw()) };
    let stream_alloc = |n: usize| pool.allocate(n, own).unwrap_or(0);
    // SAFETY: as above, on the owned stream.
    let stream_free = |p: usize, _n: usize| unsafe { cuda::mem_free_async(p, own) }.expect("free");
    for name in TRACES {
        let path = format!("{dir}/{name}.csv.gz");
        let trace = Trace::from_path(&path, false).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut slots = vec![(0usize, 0usize); trace.slot_count];
        // Warm both pools.
        pass(&trace, &via_resource_alloc, &via_resource_free, &mut slots);
        pass(&trace, &direct_alloc, &direct_free, &mut slots);
        pass(&trace, &ptds_alloc, &ptds_free, &mut slots);
        pass(&trace, &stream_alloc, &stream_free, &mut slots);
        let (mut a, mut b, mut c, mut d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..REPS {
            a.push(pass(
                &trace,
                &via_resource_alloc,
                &via_resource_free,
                &mut slots,
            ));
            b.push(pass(&trace, &direct_alloc, &direct_free, &mut slots));
            c.push(pass(&trace, &ptds_alloc, &ptds_free, &mut slots));
            d.push(pass(&trace, &stream_alloc, &stream_free, &mut slots));
        }
        let shared: SharedResource = Arc::new(resource.clone());
        let options = ReplayOptions {
            repeat: Repeat::Times(REPS),
            ..ReplayOptions::default()
        };
        let report = replay(&trace, &shared, options.clone()).expect("replay");
        println!(
            "{{\"trace\": \"{name}\", \"variant\": \"engine\", \"ns_per_event\": {:.1}, \"min\": {:.1}}}",
            report.timings.ns_per_event, report.timings.ns_per_event_min
        );
        // The engine on a fresh resource (one warm-up pass, as `rrmm replay` runs it), not on
        // the pool the loops above have warmed for many passes.
        let fresh: SharedResource =
            Arc::new(CudaAsyncMemoryResource::new(None, None, export).expect("cuda_async"));
        let report = replay(&trace, &fresh, options).expect("replay");
        println!(
            "{{\"trace\": \"{name}\", \"variant\": \"engine fresh\", \"ns_per_event\": {:.1}, \"min\": {:.1}}}",
            report.timings.ns_per_event, report.timings.ns_per_event_min
        );
        for (variant, v) in [
            ("resource", a),
            ("driver", b),
            ("driver ptds", c),
            ("driver stream", d),
        ] {
            let min = v.iter().copied().fold(f64::MAX, f64::min);
            println!(
                "{{\"trace\": \"{name}\", \"variant\": \"{variant}\", \"ns_per_event\": {:.1}, \"min\": {min:.1}}}",
                median(v)
            );
        }
    }
}
