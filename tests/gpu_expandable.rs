//! GPU tests of the expandable pool on real virtual memory: data integrity across growth and
//! trim with several streams and threads, and `trim()` giving memory back that `cuMemGetInfo`
//! sees. They need a CUDA GPU and are ignored elsewhere (`cargo test --test gpu_expandable --
//! --ignored`).

use rrmm::cuda::{self, OwnedStream};
use rrmm::suballocator::{ExpandableMemoryResource, ExpandableOptions, ExpandableSizes};
use rrmm::{MemoryResource, Stream};
use std::sync::{Arc, Barrier};

mod common;
use common::Rng;

const MIB: usize = 1 << 20;

fn expandable(maximum: Option<usize>) -> ExpandableMemoryResource {
    let _ctx = cuda::ContextGuard::new(0).expect("a CUDA device");
    let sizes = ExpandableSizes {
        maximum_pool_size: maximum,
        ..ExpandableSizes::default()
    };
    let options = ExpandableOptions {
        sizes,
        ..ExpandableOptions::default()
    };
    ExpandableMemoryResource::on_device(0, options).expect("VMM support")
}

/// Checks `size` bytes at `ptr` all equal `value` (synchronously on `stream`).
fn check(ptr: usize, size: usize, value: u8, stream: Stream, what: &str) {
    let mut host = vec![0u8; size];
    // SAFETY: the allocation is live and holds `size` bytes.
    unsafe { cuda::memcpy_sync(host.as_mut_ptr() as usize, ptr, size, stream).unwrap() };
    assert!(host.iter().all(|&b| b == value), "{what}: corrupted");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn data_survives_growth_and_trim_on_several_streams_and_threads() {
    let mr = Arc::new(expandable(Some(2048 * MIB)));
    let threads = 4;
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (mr, barrier) = (mr.clone(), barrier.clone());
            std::thread::spawn(move || {
                let _ctx = cuda::ContextGuard::new(0).unwrap();
                let own = OwnedStream::new(true).unwrap();
                let stream = if t == 0 {
                    Stream::PER_THREAD
                } else {
                    own.stream()
                };
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));
                let mut live: Vec<(usize, usize, u8)> = Vec::new();
                for round in 0..3000 {
                    if round == 1500 {
                        // Everyone meets while a trim runs (below), holding live blocks.
                        stream.synchronize().unwrap();
                        barrier.wait();
                        barrier.wait();
                        for &(p, s, v) in &live {
                            check(p, s, v, stream, "after trim");
                        }
                    }
                    if live.len() < 24 && rng.next() % 3 != 0 {
                        // Up to 24 MiB: several 2 MiB pages, so blocks span growth steps.
                        let size = 1 + (rng.next() % (24 * MIB as u64)) as usize;
                        let ptr = mr.allocate(size, stream).unwrap();
                        assert_eq!(ptr % 256, 0);
                        let value = (t * 32 + round % 32) as u8 | 1;
                        // SAFETY: `size` bytes were just allocated at `ptr`.
                        unsafe { cuda::memset_async(ptr, value, size, stream).unwrap() };
                        live.push((ptr, size, value));
                    } else if !live.is_empty() {
                        let i = (rng.next() % live.len() as u64) as usize;
                        let (ptr, size, value) = live.swap_remove(i);
                        if round % 5 == 0 {
                            check(ptr, size, value, stream, "live block");
                        }
                        // SAFETY: allocated above from this resource with this size, freed
                        // once; later work on `stream` is ordered after it.
                        unsafe { mr.deallocate(ptr, size, stream) }.unwrap();
                    }
                }
                for (ptr, size, value) in live {
                    check(ptr, size, value, stream, "at the end");
                    // SAFETY: as above.
                    unsafe { mr.deallocate(ptr, size, stream) }.unwrap();
                }
                stream.synchronize().unwrap();
            })
        })
        .collect();
    barrier.wait();
    let trimmed = mr.trim(0).unwrap();
    eprintln!(
        "trimmed {trimmed} bytes mid-run; {} mapped",
        mr.mapped_bytes()
    );
    barrier.wait();
    for h in handles {
        h.join().expect("a thread failed");
    }
    mr.trim(0).unwrap();
    assert_eq!(mr.mapped_bytes(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn trim_returns_memory_that_cu_mem_get_info_sees() {
    let _ctx = cuda::ContextGuard::new(0).unwrap();
    let mr = expandable(None);
    let (free_before, _) = cuda::mem_get_info().unwrap();
    let big = 1024 * MIB;
    let a = mr.allocate(big, Stream::DEFAULT).unwrap();
    let b = mr.allocate(4 * MIB, Stream::DEFAULT).unwrap();
    // SAFETY: allocated above, freed once; the stream orders later work.
    unsafe { mr.deallocate(a, big, Stream::DEFAULT) }.unwrap();
    let (free_mapped, _) = cuda::mem_get_info().unwrap();
    assert!(
        free_mapped + big <= free_before + 64 * MIB,
        "the pages are held"
    );
    let trimmed = mr.trim(0).unwrap();
    assert!(trimmed >= big, "trimmed {trimmed}");
    let (free_after, _) = cuda::mem_get_info().unwrap();
    assert!(
        free_after >= free_mapped + big - 64 * MIB,
        "cuMemGetInfo sees the unmapped pages: {free_mapped} -> {free_after}"
    );
    assert_eq!(mr.virtual_memory().mapped_bytes(), mr.mapped_bytes());
    // SAFETY: as above.
    unsafe { mr.deallocate(b, 4 * MIB, Stream::DEFAULT) }.unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_growth_log_fits_on_the_device_where_the_pool_does_not() {
    // 3/8, 2/8, free the 3/8, then 5/8 of the device's free memory.
    let _ctx = cuda::ContextGuard::new(0).unwrap();
    let (free, _) = cuda::mem_get_info().unwrap();
    let unit = (free / 8) & !(2 * MIB - 1);
    let mr = expandable(None);
    let a = mr.allocate(3 * unit, Stream::DEFAULT).unwrap();
    let b = mr.allocate(2 * unit, Stream::DEFAULT).unwrap();
    // SAFETY: allocated above, freed once.
    unsafe { mr.deallocate(a, 3 * unit, Stream::DEFAULT) }.unwrap();
    let c = mr.allocate(5 * unit, Stream::DEFAULT).unwrap();
    // SAFETY: `c` holds 5 units.
    unsafe { cuda::memset_async(c, 7, 5 * unit, Stream::DEFAULT).unwrap() };
    Stream::DEFAULT.synchronize().unwrap();
    // SAFETY: allocated above, freed once.
    unsafe { mr.deallocate(b, 2 * unit, Stream::DEFAULT) }.unwrap();
    // SAFETY: allocated above, freed once.
    unsafe { mr.deallocate(c, 5 * unit, Stream::DEFAULT) }.unwrap();
}

/// A pool that spills to host pages serves past the device's free memory, keeps the bytes of
/// every block, and `promote` moves the spilled pages back once the device has room, at the
/// same addresses, bytes intact; the host pages are kept for the next spill.
#[test]
#[ignore = "needs a CUDA GPU"]
fn spilled_blocks_keep_their_bytes_and_promote_to_the_device() {
    const GIB: usize = 1 << 30;
    let _ctx = cuda::ContextGuard::new(0).expect("a CUDA device");
    let (free, _) = cuda::mem_get_info().unwrap();
    let hog_bytes = free.saturating_sub(2 * GIB);
    let hog = rrmm::resource::CudaMemoryResource::new().unwrap();
    let hog_ptr = hog.allocate(hog_bytes, Stream::DEFAULT).unwrap();
    let options = ExpandableOptions {
        spill_to_host: Some(8 * GIB),
        ..ExpandableOptions::default()
    };
    let mr = ExpandableMemoryResource::on_device(0, options).expect("VMM support");
    let blocks: Vec<(usize, u8)> = (0..4u8)
        .map(|i| (mr.allocate(GIB, Stream::DEFAULT).unwrap(), 0x30 + i))
        .collect();
    for &(p, v) in &blocks {
        // SAFETY: a live block of `GIB` bytes of this pool.
        unsafe { cuda::memset_async(p, v, GIB, Stream::DEFAULT).unwrap() };
    }
    Stream::DEFAULT.synchronize().unwrap();
    let spilled = mr.spilled_bytes();
    assert!(spilled >= GIB, "4 GiB on 2 GiB free spills ({spilled})");
    for &(p, v) in &blocks {
        check(p, GIB, v, Stream::DEFAULT, "spilled");
    }
    // SAFETY: allocated above with this size; nothing uses it.
    unsafe { hog.deallocate(hog_ptr, hog_bytes, Stream::DEFAULT).unwrap() };
    let report = mr.promote(None, None).unwrap();
    assert_eq!((report.promoted, report.spilled), (spilled, 0));
    for &(p, v) in &blocks {
        check(p, GIB, v, Stream::DEFAULT, "promoted");
    }
    let figures = mr.spill_figures().unwrap();
    assert_eq!((figures.spilled, figures.kept), (0, spilled));
    for (p, _) in blocks {
        // SAFETY: allocated above with this size; nothing uses it.
        unsafe { mr.deallocate(p, GIB, Stream::DEFAULT).unwrap() };
    }
}
