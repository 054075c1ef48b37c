//! W7 (benchmarks.md), rrmm's side, mirroring benches/gpu/rmm_w7.cu (RMM's side) workload for
//! workload, one JSON line per figure:
//! - threads: T threads (1, 2, 4, 8, 16), each on its own non-blocking stream, allocating random
//!   256 B..1 MiB sizes (at most 64 live, allocate with probability 1/2 when below that) from one
//!   shared resource; total million operations per second (median of 3, after a warm-up of a
//!   tenth); 100,000 operations per thread (2,000 for `cuda`).
//! - multi_stream: S streams (1, 2, 4) x 4 kernels, each kernel's 8-byte buffer allocated on its
//!   stream, a spin of ~1M clocks, the buffer freed after the launch on the same stream; the time
//!   from the first allocation to the device being idle (median of 5). `warm`: one resource, after
//!   a warm-up run (as RMM's); `cold`: a fresh resource for every run (its construction untimed).
//!
//! Resources: pool (8 GiB initial over cuda), arena (8 GiB), binning (bins 2^18..2^22 over such a
//! pool), cuda_async, cuda.
//!
//! Build for the GPU machine: `cargo build --release --bench w7`, then copy
//! `target/release/deps/w7-<hash>` (the executable) to `.gpu/bench/w7`. Run: `w7` (GPU), or
//! `w7 --simulate` (threads part only, on simulated memory, for a CPU smoke test). Options:
//! `--ops N` (operations per thread), `--threads 1,2,4`, `--resources pool,arena`.

use rrmm::cuda::{self, ContextGuard, OwnedStream, SpinKernel};
use rrmm::suballocator::{ArenaMemoryResource, BinningMemoryResource, PoolMemoryResource};
use rrmm::{
    CudaAsyncMemoryResource, CudaMemoryResource, DeviceBuffer, MemoryResource, SharedResource,
    SimulatedMemoryResource, Stream,
};
use std::sync::Arc;
use std::time::Instant;

const POOL_BYTES: usize = 8 << 30;
const SPIN_CLOCKS: i64 = 1_000_000;
const KERNELS: usize = 4;

struct Options {
    simulate: bool,
    ops: Option<usize>,
    threads: Vec<usize>,
    resources: Vec<String>,
}

fn options() -> Options {
    let mut o = Options {
        simulate: false,
        ops: None,
        threads: vec![1, 2, 4, 8, 16],
        resources: ["pool", "arena", "binning", "cuda_async", "cuda"]
            .map(String::from)
            .to_vec(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let list = |v: &str| {
        v.split(',')
            .map(str::trim)
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).map(String::as_str).unwrap_or("");
        match args[i].as_str() {
            "--simulate" => o.simulate = true,
            "--ops" => {
                o.ops = value.parse().ok();
                i += 1;
            }
            "--threads" => {
                o.threads = list(value).iter().filter_map(|t| t.parse().ok()).collect();
                i += 1;
            }
            "--resources" => {
                o.resources = list(value);
                i += 1;
            }
            _ => {} // cargo bench passes --bench
        }
        i += 1;
    }
    o
}

/// The device (or simulated memory) under the resources.
fn device(simulate: bool) -> rrmm::Result<SharedResource> {
    if simulate {
        Ok(Arc::new(SimulatedMemoryResource::new(64 << 30)))
    } else {
        Ok(Arc::new(CudaMemoryResource::new()?))
    }
}

fn make(name: &str, simulate: bool) -> rrmm::Result<SharedResource> {
    let pool = || -> rrmm::Result<PoolMemoryResource> {
        PoolMemoryResource::new(device(simulate)?, Some(POOL_BYTES), None)
    };
    Ok(match name {
        "pool" => Arc::new(pool()?),
        "arena" => Arc::new(ArenaMemoryResource::new(
            device(simulate)?,
            Some(POOL_BYTES),
            false,
        )?),
        "binning" => Arc::new(BinningMemoryResource::new(
            Arc::new(pool()?),
            Some(18),
            Some(22),
        )?),
        "cuda_async" if !simulate => Arc::new(CudaAsyncMemoryResource::new(
            None,
            None,
            cuda::PoolExport {
                ipc: false,
                fabric: false,
            },
        )?),
        _ => device(simulate)?,
    })
}

/// splitmix64: the benchmark's random numbers (RMM's side uses mt19937_64, seeded the same way;
/// the distribution is what matters).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// One run of the threads workload: seconds from the first spawn to the last join.
fn threads_run(mr: &SharedResource, threads: usize, ops: usize, simulate: bool) -> f64 {
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                let _ctx = (!simulate).then(|| ContextGuard::new(0).expect("device 0"));
                let own = (!simulate).then(|| OwnedStream::new(true).expect("a stream"));
                let stream = own
                    .as_ref()
                    // SAFETY: on simulated memory the handle is a key only, never given to the
                    // driver.
                    .map_or(unsafe { Stream::from_raw(0x1000 + t) }, |s| s.stream());
                let mut rng = Rng(t as u64 + 1);
                let mut live: Vec<(usize, usize)> = Vec::with_capacity(64);
                for _ in 0..ops {
                    if live.len() < 64 && (live.is_empty() || rng.next() % 2 == 1) {
                        let n = 256 + (rng.next() % ((1 << 20) - 256 + 1)) as usize;
                        live.push((mr.allocate(n, stream).expect("allocate"), n));
                    } else {
                        let k = (rng.next() % live.len() as u64) as usize;
                        let (p, n) = live.swap_remove(k);
                        // SAFETY: a live allocation of this size, freed once; no work uses it.
                        unsafe { mr.deallocate(p, n, stream) }.expect("deallocate");
                    }
                }
                for (p, n) in live {
                    // SAFETY: as above.
                    unsafe { mr.deallocate(p, n, stream) }.expect("deallocate");
                }
                if let Some(s) = &own {
                    s.synchronize().expect("synchronize");
                }
            });
        }
    });
    t0.elapsed().as_secs_f64()
}

/// One run of the multi-stream pattern: seconds from the first allocation to an idle device.
fn streams_run(mr: &SharedResource, kernel: &SpinKernel, streams: &[OwnedStream]) -> f64 {
    cuda::context_synchronize().expect("synchronize");
    let t0 = Instant::now();
    for k in 0..KERNELS {
        let s = streams[k % streams.len()].stream();
        let buf = DeviceBuffer::new(8, s, mr.clone()).expect("allocate");
        kernel.launch(SPIN_CLOCKS, &buf).expect("launch");
        drop(buf); // freed on its stream, after the kernel in stream order
    }
    cuda::context_synchronize().expect("synchronize");
    t0.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> rrmm::Result<()> {
    let o = options();
    let _ctx = if o.simulate {
        None
    } else {
        Some(ContextGuard::new(0)?)
    };
    let kernel = if o.simulate {
        None
    } else {
        Some(SpinKernel::new(0)?)
    };
    for name in &o.resources {
        let mr = make(name, o.simulate)?;
        let ops = o.ops.unwrap_or(if name == "cuda" { 2000 } else { 100_000 });
        for &t in &o.threads {
            threads_run(&mr, t, ops / 10, o.simulate);
            let v: Vec<f64> = (0..3)
                .map(|_| threads_run(&mr, t, ops, o.simulate))
                .collect();
            let m = median(v);
            println!(
                "{{\"impl\":\"rrmm\",\"bench\":\"threads\",\"resource\":\"{name}\",\"threads\":{t},\
                 \"ops_per_thread\":{ops},\"median_s\":{m:.4},\"mops_per_s\":{:.3}}}",
                (t * ops) as f64 / m / 1e6
            );
        }
        let Some(kernel) = &kernel else { continue };
        for s in [1usize, 2, 4] {
            let streams: Vec<OwnedStream> = (0..s)
                .map(|_| OwnedStream::new(true))
                .collect::<rrmm::Result<_>>()?;
            streams_run(&mr, kernel, &streams);
            let warm: Vec<f64> = (0..5).map(|_| streams_run(&mr, kernel, &streams)).collect();
            let mut cold = Vec::new();
            for _ in 0..5 {
                let fresh = make(name, false)?;
                cold.push(streams_run(&fresh, kernel, &streams));
            }
            for (mode, v) in [("warm", warm), ("cold", cold)] {
                println!(
                    "{{\"impl\":\"rrmm\",\"bench\":\"multi_stream\",\"resource\":\"{name}\",\
                     \"mode\":\"{mode}\",\"streams\":{s},\"kernels\":{KERNELS},\"median_us\":{:.1}}}",
                    median(v) * 1e6
                );
            }
        }
    }
    Ok(())
}
