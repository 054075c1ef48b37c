//! Model checks (loom) of the stream-ordered core's lock protocol: every interleaving of small
//! allocate/free/steal/grow/release runs on two threads, on simulated memory; and of the link's
//! calls cells (`resource::Calls`): a cell made over one that grows meanwhile never misses it.
//!
//! Run: `cargo test --features loom --test loom_core` (`.ci/run` does). Each model is bounded (three preemptions) to stay small.
//!
//! Checked in every interleaving: no deadlock (loom fails on one), no two live blocks overlap,
//! bytes are conserved when the threads are done (free bytes == pool size once everything is
//! freed), `release()` then gives everything back, and bad frees stay logic errors.
#![cfg(feature = "loom")]

use loom::thread;
use rrmm::resource::{CallProfile, Calls};
use rrmm::suballocator::{NoStreamEvents, StreamEvents};
use rrmm::{
    FixedSizeMemoryResource, MemoryResource, PoolMemoryResource, SimulatedMemoryResource, Stream,
};
use std::sync::Arc;

/// Runs `f` under loom (at most three preemptions per execution) and checks that loom explored
/// more than one interleaving.
fn model(f: impl Fn() + Sync + Send + 'static) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        f();
    });
    let runs = runs.load(Ordering::Relaxed);
    println!("{runs} interleavings explored");
    assert!(runs > 1, "loom explored a single interleaving");
}

fn events() -> Arc<dyn StreamEvents> {
    Arc::new(NoStreamEvents)
}

fn pool(initial: usize, max: Option<usize>) -> (Arc<SimulatedMemoryResource>, PoolMemoryResource) {
    let up = Arc::new(SimulatedMemoryResource::new(1 << 20));
    let pool = PoolMemoryResource::with_events(up.clone(), Some(initial), max, events()).unwrap();
    (up, pool)
}

fn disjoint(blocks: &[(usize, usize)]) {
    for (i, &(a, n)) in blocks.iter().enumerate() {
        for &(b, m) in &blocks[i + 1..] {
            assert!(
                a + n <= b || b + m <= a,
                "overlap [{a:#x}, +{n}) [{b:#x}, +{m})"
            );
        }
    }
}

fn s(i: usize) -> Stream {
    // SAFETY: a key only: simulated memory never passes it to the driver.
    unsafe { Stream::from_raw(0x1000 + i) }
}

/// Frees through the unsafe trait method.
fn free(mr: &dyn MemoryResource, ptr: usize, bytes: usize, stream: Stream) -> rrmm::Result<()> {
    // SAFETY: the pool and the fixed-size resource check every free against the blocks they
    // handed out (a bad one is `Error::Logic`, which the tests check); nothing uses the memory.
    unsafe { mr.deallocate(ptr, bytes, stream) }
}

/// Two threads on their own streams allocate and free; the second allocation of each must find
/// its own freed block, fresh memory, another stream's block (steal) or growth.
#[test]
fn own_streams_allocate_free_steal_and_grow() {
    model(|| {
        let (up, pool) = pool(1024, None);
        let threads: Vec<_> = (1..=2)
            .map(|i| {
                let pool = pool.clone();
                thread::spawn(move || {
                    let a = pool.allocate(512, s(i)).unwrap();
                    free(&pool, a, 512, s(i)).unwrap();
                    let b = pool.allocate(768, s(i)).unwrap();
                    (b, 768)
                })
            })
            .collect();
        let live: Vec<(usize, usize)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        disjoint(&live);
        for (p, n) in live {
            free(&pool, p, n, s(3)).unwrap();
        }
        assert_eq!(pool.free_bytes(), pool.pool_size());
        let size = pool.pool_size();
        assert_eq!(pool.release().unwrap(), size);
        assert_eq!((pool.pool_size(), up.bytes_in_use()), (0, 0));
    });
}

/// A free on another stream (the block's registry entry moves between lists) races with an
/// allocation on the block's own stream and with a double free of it.
#[test]
fn cross_stream_free_races_with_allocation_and_double_free() {
    model(|| {
        let (_up, pool) = pool(1024, Some(1024));
        let a = pool.allocate(512, s(1)).unwrap();
        let p2 = pool.clone();
        let t = thread::spawn(move || free(&p2, a, 512, s(2)).is_ok());
        let b = pool.allocate(512, s(1));
        let again = free(&pool, a, 512, s(1)).is_ok();
        let first = t.join().unwrap();
        assert!(
            first ^ again,
            "exactly one of the two frees of {a:#x} succeeds"
        );
        if let Ok(b) = b {
            assert_ne!(a, b, "handed out while live");
            free(&pool, b, 512, s(1)).unwrap();
        }
        assert_eq!(pool.free_bytes(), pool.pool_size());
    });
}

/// `release()` (synchronize, merge every list, give back whole chunks) races with allocations
/// and frees on another stream, and with a growth past the initial chunk.
#[test]
fn release_races_with_allocation_and_growth() {
    model(|| {
        let (up, pool) = pool(512, None);
        let p2 = pool.clone();
        let t = thread::spawn(move || {
            let a = p2.allocate(512, s(1)).unwrap();
            let b = p2.allocate(512, s(1)).unwrap();
            disjoint(&[(a, 512), (b, 512)]);
            free(&p2, a, 512, s(1)).unwrap();
            free(&p2, b, 512, s(2)).unwrap();
        });
        pool.release().unwrap();
        t.join().unwrap();
        assert_eq!(pool.free_bytes(), pool.pool_size());
        pool.release().unwrap();
        assert_eq!((pool.pool_size(), up.bytes_in_use()), (0, 0));
    });
}

/// A pool of 1024 bytes at its maximum, its two halves allocated on streams 1 and 2.
fn two_halves() -> (PoolMemoryResource, usize, usize) {
    let (_up, pool) = pool(1024, Some(1024));
    let a = pool.allocate(512, s(1)).unwrap();
    let b = pool.allocate(512, s(2)).unwrap();
    (pool, a, b)
}

/// A stream at the pool's maximum takes the synchronize-and-merge path while the other stream
/// frees into its own list.
#[test]
fn merge_races_with_frees() {
    model(|| {
        let (pool, a, b) = two_halves();
        let p2 = pool.clone();
        let t = thread::spawn(move || {
            free(&p2, b, 512, s(2)).unwrap();
        });
        free(&pool, a, 512, s(1)).unwrap();
        // Needs both halves: served once b's free is in and both lists are merged; else out of
        // memory (b's free not in yet), never an overlap.
        let c = pool.allocate(1024, s(3));
        t.join().unwrap();
        match c {
            Ok(c) => free(&pool, c, 1024, s(3)).unwrap(),
            Err(e) => assert!(e.is_out_of_memory(), "{e}"),
        }
        assert_eq!(pool.free_bytes(), pool.pool_size());
    });
}

/// A stream fails twice at the pool's maximum (the second failure may skip the merge) while
/// the other stream frees: once the free is in, the request succeeds, whatever the failures
/// recorded in between; a wrong-size free is refused and changes nothing.
#[test]
fn repeated_failures_race_with_a_free() {
    model(|| {
        let (pool, a, b) = two_halves();
        free(&pool, a, 512, s(1)).unwrap();
        let p2 = pool.clone();
        let t = thread::spawn(move || {
            assert!(free(&p2, b, 1024, s(2)).is_err(), "wrong size refused");
            free(&p2, b, 512, s(2)).unwrap();
        });
        let tries: Vec<_> = (0..2).map(|_| pool.allocate(1024, s(3))).collect();
        t.join().unwrap();
        let mut served = Vec::new();
        for r in tries {
            match r {
                Ok(c) => served.push(c),
                Err(e) => assert!(e.is_out_of_memory(), "{e}"),
            }
        }
        assert!(served.len() <= 1, "one 1024-byte block in a 1024-byte pool");
        let c = match served.pop() {
            Some(c) => c,
            None => pool.allocate(1024, s(3)).expect("everything is free"),
        };
        free(&pool, c, 1024, s(3)).unwrap();
        assert_eq!(pool.free_bytes(), pool.pool_size());
    });
}

/// The fixed-size resource: two streams, blocks moving between them, a double free refused.
#[test]
fn fixed_size_two_streams() {
    model(|| {
        let up = Arc::new(SimulatedMemoryResource::new(1 << 20));
        let mr = FixedSizeMemoryResource::with_events(up.clone(), 256, 2, events()).unwrap();
        let m2 = mr.clone();
        let t = thread::spawn(move || {
            let a = m2.allocate(256, s(1)).unwrap();
            free(&m2, a, 256, s(2)).unwrap();
            a
        });
        let b = mr.allocate(256, s(2)).unwrap();
        let c = mr.allocate(256, s(2)).unwrap();
        assert_ne!(b, c);
        let a = t.join().unwrap();
        if a != b && a != c {
            assert!(free(&mr, a, 256, s(1)).is_err(), "double free refused");
        }
        free(&mr, b, 256, s(1)).unwrap();
        free(&mr, c, 256, s(1)).unwrap();
        assert!(free(&mr, c, 256, s(2)).is_err(), "double free refused");
        assert_eq!(mr.free_block_count() * 256, mr.pool_size());
    });
}

/// A resource built over a binning resource while a bin that runs foreign code is added (a cell
/// made over a cell that grows meanwhile), and two bins added at once: in every interleaving
/// every cell ends with what its parts hold (it listens before it computes, and a grown cell
/// recomputes what listens to it).
#[test]
fn calls_made_while_a_part_grows_see_it() {
    model(|| {
        let binning = Calls::join(&[]);
        let grower = binning.clone();
        let t = thread::spawn(move || grower.add_part(&Calls::fixed(CallProfile::UNKNOWN)));
        let pool = binning.suballocating();
        binning.add_part(&Calls::fixed(CallProfile::BLOCKING));
        t.join().unwrap();
        assert_eq!(binning.get(), CallProfile::UNKNOWN);
        assert_eq!(pool.get(), CallProfile::UNKNOWN.suballocating());
    });
}
