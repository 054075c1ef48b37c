//! GPU stress tests: many threads, each on its own non-blocking stream (or on its per-thread
//! default stream), allocating from one shared pool, binning or arena resource, writing a
//! pattern unique to each allocation with `cuMemsetD32Async`, copying allocations into new ones
//! with stream-ordered copies and freeing the sources right behind the copy, and checking every
//! allocation's full contents before it is freed. Memory handed to two owners at once, reused
//! by another stream before the stream-ordered free completed, or corrupted in any other way
//! shows up as a foreign word. Also: arena exhaustion is `OutOfMemory` and the arena works
//! afterwards.
//!
//! They need a CUDA GPU and are ignored elsewhere:
//! `cargo test --release --test gpu_stress -- --ignored --test-threads=1` on a GPU machine
//! (scripts/gpu_run.sh runs them, also under compute-sanitizer).

use rrmm::cuda::{self, ContextGuard, OwnedStream};
use rrmm::suballocator::{
    ArenaMemoryResource, BinningMemoryResource, FixedSizeMemoryResource, PoolMemoryResource,
};
use rrmm::{CudaAsyncMemoryResource, CudaMemoryResource, MemoryResource, SharedResource, Stream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const MIB: usize = 1 << 20;

fn cuda_upstream() -> SharedResource {
    Arc::new(CudaMemoryResource::new().expect("a CUDA device"))
}

/// `rounds` scaled by `$RRMM_STRESS_PERCENT` (default 100; the sanitizer stage of
/// scripts/gpu_run.sh runs 25), at least 20.
fn scaled(rounds: usize) -> usize {
    let percent = std::env::var("RRMM_STRESS_PERCENT")
        .ok()
        .and_then(|p| p.parse::<usize>().ok())
        .unwrap_or(100);
    (rounds * percent / 100).max(20)
}

/// xorshift64: deterministic sizes and choices without extra crates.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One live allocation: where, how many bytes, and the 32-bit word it must hold.
#[derive(Clone, Copy)]
struct Block {
    ptr: usize,
    bytes: usize,
    word: u32,
}

/// Which stream each thread of a stress run uses.
#[derive(Clone, Copy, Debug)]
enum Streams {
    /// Thread t on its own non-blocking stream.
    Own,
    /// Every thread on its per-thread default stream.
    PerThread,
    /// Even threads on their own stream, odd threads on the per-thread default stream.
    Mixed,
}

/// Totals of a stress run, for the assertions that it really ran.
#[derive(Default)]
struct Totals {
    allocations: AtomicUsize,
    copies: AtomicUsize,
    words_checked: AtomicUsize,
}

/// Reads all of `block` back to the host on `stream` and asserts that every word is its own.
fn check(block: Block, stream: Stream, thread: usize, totals: &Totals) {
    let words = block.bytes / 4;
    let mut host = vec![0u32; words];
    // SAFETY: `block` is live (not yet freed) and holds `words * 4` bytes; `host` holds as many.
    unsafe { cuda::memcpy_sync(host.as_mut_ptr() as usize, block.ptr, words * 4, stream) }
        .expect("copy to host");
    if let Some(i) = host.iter().position(|&w| w != block.word) {
        panic!(
            "thread {thread}: word {i} of {} at {:#x} is {:#010x}, expected {:#010x}",
            words, block.ptr, host[i], block.word
        );
    }
    totals.words_checked.fetch_add(words, Ordering::Relaxed);
}

/// Frees `block` on `stream` (stream-ordered).
fn free(mr: &SharedResource, block: Block, stream: Stream) {
    // SAFETY: `block` was allocated from `mr` with `block.bytes`, is freed once, here; all work
    // on it was enqueued on `stream`, so the free is ordered after it.
    unsafe { mr.deallocate(block.ptr, block.bytes, stream) }.expect("deallocate");
}

/// `threads` threads for `rounds` rounds each: allocate (4..=max_bytes, a multiple of 4) and
/// fill with a unique word; or copy a live allocation into a new one and free the source at
/// once (stream-ordered, behind the copy); or check a live allocation's contents and free it.
/// At most 24 live per thread; everything is checked before it is freed.
fn stress(mr: SharedResource, threads: usize, rounds: usize, max_bytes: usize, streams: Streams) {
    let rounds = scaled(rounds);
    let totals = Totals::default();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (mr, totals) = (mr.clone(), &totals);
            scope.spawn(move || {
                let _ctx = ContextGuard::new(0).expect("context");
                let own = OwnedStream::new(true).expect("stream");
                let per_thread = match streams {
                    Streams::Own => false,
                    Streams::PerThread => true,
                    Streams::Mixed => t % 2 == 1,
                };
                let stream = if per_thread {
                    Stream::PER_THREAD
                } else {
                    own.stream()
                };
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((t as u64 + 1) * 0x1234_5678_9ABC));
                let mut serial = 0u32;
                let mut next_word = || {
                    serial += 1;
                    ((t as u32) << 24) | (serial & 0x00FF_FFFF)
                };
                let mut live: Vec<Block> = Vec::new();
                for _ in 0..rounds {
                    let choice = rng.below(10);
                    if live.is_empty() || (live.len() < 24 && choice < 5) {
                        let bytes = 4 * (1 + rng.below((max_bytes / 4) as u64) as usize);
                        let ptr = mr.allocate(bytes, stream).expect("allocate");
                        assert_eq!(ptr % 256, 0, "thread {t}: unaligned {ptr:#x}");
                        let block = Block {
                            ptr,
                            bytes,
                            word: next_word(),
                        };
                        // SAFETY: `ptr` holds `bytes` bytes (a multiple of 4) and stays
                        // allocated until a free ordered after this set on `stream`.
                        unsafe { cuda::memset_d32_async(ptr, block.word, bytes / 4, stream) }
                            .expect("memset");
                        live.push(block);
                        totals.allocations.fetch_add(1, Ordering::Relaxed);
                    } else if choice < 7 && live.len() < 24 {
                        // Copy a live block into a new one, then free the source behind the
                        // copy without waiting: the stream orders the free after the copy.
                        let i = rng.below(live.len() as u64) as usize;
                        let src = live.swap_remove(i);
                        let ptr = mr.allocate(src.bytes, stream).expect("allocate");
                        // SAFETY: both blocks hold `src.bytes` bytes until frees ordered after
                        // this copy on `stream`.
                        unsafe { cuda::memcpy_async(ptr, src.ptr, src.bytes, stream) }
                            .expect("copy");
                        free(&mr, src, stream);
                        live.push(Block { ptr, ..src });
                        totals.allocations.fetch_add(1, Ordering::Relaxed);
                        totals.copies.fetch_add(1, Ordering::Relaxed);
                    } else {
                        let i = rng.below(live.len() as u64) as usize;
                        let block = live.swap_remove(i);
                        check(block, stream, t, totals);
                        free(&mr, block, stream);
                    }
                }
                for block in live {
                    check(block, stream, t, totals);
                    free(&mr, block, stream);
                }
                stream.synchronize().expect("synchronize");
            });
        }
    });
    let allocations = totals.allocations.load(Ordering::Relaxed);
    assert!(
        allocations >= threads * rounds / 3,
        "only {allocations} allocations"
    );
    assert!(totals.copies.load(Ordering::Relaxed) >= threads * rounds / 20);
    assert!(totals.words_checked.load(Ordering::Relaxed) >= allocations);
}

fn pool() -> SharedResource {
    Arc::new(PoolMemoryResource::new(cuda_upstream(), Some(512 * MIB), Some(8 << 30)).unwrap())
}

fn arena(size: usize) -> SharedResource {
    Arc::new(ArenaMemoryResource::new(cuda_upstream(), Some(size), false).unwrap())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pool_16_threads_on_their_own_streams_keep_data_intact() {
    stress(pool(), 16, 400, MIB, Streams::Own);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn binning_16_threads_on_their_own_streams_keep_data_intact() {
    // Bins of 1 KiB..256 KiB in front of a pool: small requests go to the bins, larger ones to
    // the pool.
    let binning = BinningMemoryResource::new(pool(), Some(10), Some(18)).unwrap();
    stress(Arc::new(binning), 16, 400, MIB, Streams::Own);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fixed_size_16_threads_on_their_own_streams_keep_data_intact() {
    let fixed = FixedSizeMemoryResource::new(cuda_upstream(), 64 << 10, 256).unwrap();
    stress(Arc::new(fixed), 16, 400, 64 << 10, Streams::Own);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn arena_16_threads_on_their_own_streams_keep_data_intact() {
    // Requests up to 4 MiB: small ones from the stream arenas' superblocks, large ones from the
    // global arena.
    stress(arena(4 << 30), 16, 400, 4 * MIB, Streams::Own);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn per_thread_default_streams_from_several_threads_keep_data_intact() {
    for (name, mr) in [
        ("pool", pool()),
        ("arena", arena(2 << 30)),
        (
            "binning",
            Arc::new(BinningMemoryResource::new(pool(), Some(10), Some(18)).unwrap())
                as SharedResource,
        ),
        (
            "cuda_async",
            Arc::new(CudaAsyncMemoryResource::new(None, None, Default::default()).unwrap()),
        ),
    ] {
        eprintln!("per-thread default streams over {name}");
        stress(mr.clone(), 8, 300, MIB, Streams::PerThread);
        stress(mr, 8, 300, MIB, Streams::Mixed);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn arena_exhaustion_is_out_of_memory_and_the_arena_works_afterwards() {
    let mr = arena(64 * MIB);
    let _ctx = ContextGuard::new(0).unwrap();
    let stream = OwnedStream::new(true).unwrap();
    let s = stream.stream();
    let totals = Totals::default();
    for round in 0..3u32 {
        let mut held = Vec::new();
        let error = loop {
            match mr.allocate(MIB, s) {
                Ok(ptr) => {
                    let word = 0xA000_0000 | (round << 16) | held.len() as u32;
                    // SAFETY: `ptr` holds 1 MiB until it is freed below on `s`.
                    unsafe { cuda::memset_d32_async(ptr, word, MIB / 4, s) }.unwrap();
                    held.push(Block {
                        ptr,
                        bytes: MIB,
                        word,
                    });
                    assert!(
                        held.len() <= 64,
                        "a 64 MiB arena handed out more than 64 MiB"
                    );
                }
                Err(e) => break e,
            }
        };
        assert!(error.is_out_of_memory(), "round {round}: {error:?}");
        assert!(held.len() >= 32, "round {round}: only {} MiB", held.len());
        // Larger requests fail the same way, and do not disturb what is held.
        assert!(mr.allocate(32 * MIB, s).unwrap_err().is_out_of_memory());
        for block in held {
            check(block, s, 0, &totals);
            free(&mr, block, s);
        }
    }
    // Afterwards the arena serves threads again, with its memory intact.
    stress(mr, 4, 200, 256 << 10, Streams::Own);
    assert!(totals.words_checked.load(Ordering::Relaxed) >= 3 * 32 * MIB / 4);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn arena_exhaustion_from_several_threads_then_recovery() {
    // Threads race for a small arena: each takes what it can until OutOfMemory, all free, and
    // then threads allocate (and check data) again.
    let mr = arena(128 * MIB);
    let failures = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..8usize {
            let (mr, failures) = (mr.clone(), &failures);
            scope.spawn(move || {
                let _ctx = ContextGuard::new(0).unwrap();
                let own = OwnedStream::new(true).unwrap();
                let s = if t % 2 == 0 {
                    own.stream()
                } else {
                    Stream::PER_THREAD
                };
                let mut held = Vec::new();
                // 96 x 2 MiB is more than the whole arena: every thread runs out.
                for _ in 0..96 {
                    match mr.allocate(2 * MIB, s) {
                        Ok(ptr) => held.push(ptr),
                        Err(e) => {
                            assert!(e.is_out_of_memory(), "thread {t}: {e:?}");
                            failures.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                    }
                }
                for ptr in held {
                    // SAFETY: allocated above from `mr` with 2 MiB, freed once; no work uses it.
                    unsafe { mr.deallocate(ptr, 2 * MIB, s) }.unwrap();
                }
                s.synchronize().unwrap();
            });
        }
    });
    assert_eq!(
        failures.load(Ordering::Relaxed),
        8,
        "192 MiB fit in a 128 MiB arena"
    );
    stress(mr, 8, 200, MIB, Streams::Mixed);
}
