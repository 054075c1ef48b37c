//! W1 on simulated memory: replay the shared RMM traces against every resource that
//! `rrmm::stack::build` can build, reporting time per event (criterion throughput in elements).
//!
//! Traces are read from `$RRMM_TRACES` (default: the traces shipped in `python/rrmm/traces`); a
//! missing one is an error.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rrmm::replay::{replay, resource_names, ReplayOptions, Trace};
use rrmm::stack::{build, StackOptions, Target};
use std::time::Duration;

const TRACES: &[&str] = &[
    "random_10k_1mib",
    "random_100k_4mib",
    "transformer_training",
];
/// Simulated device size: larger than the largest trace's peak (16.8 GB).
const SIMULATED_BYTES: usize = 64 << 30;

fn bench_replay(c: &mut Criterion) {
    let dir = std::env::var("RRMM_TRACES")
        .unwrap_or_else(|_| format!("{}/python/rrmm/traces", env!("CARGO_MANIFEST_DIR")));
    for name in TRACES {
        let path = format!("{dir}/{name}.csv.gz");
        let trace =
            Trace::from_path(&path, false).unwrap_or_else(|e| panic!("trace {name} ({path}): {e}"));
        let mut group = c.benchmark_group(format!("replay/{name}"));
        group.throughput(Throughput::Elements(trace.events.len() as u64));
        group.sample_size(10);
        group.measurement_time(Duration::from_secs(5));
        for resource in &resource_names() {
            let built = build(
                resource,
                Target::Simulated(SIMULATED_BYTES),
                &StackOptions::default(),
            );
            let mr = match built.map(|b| b.resource) {
                Ok(mr) => mr,
                Err(e) => {
                    eprintln!("skipping {resource}: {e}");
                    continue;
                }
            };
            // The simulated device stands in for cuda, cuda_async and managed: bench it once.
            if mr.name() == "simulated" && *resource != "simulated" {
                continue;
            }
            group.bench_function(*resource, |b| {
                b.iter(|| {
                    replay(&trace, &mr, ReplayOptions::default())
                        .expect("replay on simulated memory")
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_replay);
criterion_main!(benches);
