//! Property tests of the stream-ordered suballocators (pool, fixed_size, binning) against a
//! shadow model, on simulated memory, with a recording fake of the stream events.
//!
//! Invariants checked after every operation of random alloc/free sequences on several streams:
//! 1. Every live allocation is 256-byte aligned and non-null (for a non-zero request).
//! 2. No two live allocations overlap (the model keeps them by address; any overlap fails).
//! 3. Bytes are conserved: pool free bytes + live bytes (rounded to the block size) == pool size.
//! 4. Every cross-stream reuse is ordered: when memory last freed on stream A at time t is handed
//!    to stream B != A, the event log holds, between t and the allocation, a `Wait` by B on an
//!    event whose latest `Record` before that wait was on A and after t (or a host
//!    `SynchronizeAll` after t).
//! 5. Same-stream reuse makes no event call, per-thread default streams included; another
//!    thread's PTDS list is waited on only after its owner recorded it (unit tests below).
//! 6. When everything is freed on one stream of a single-stream history, each upstream chunk
//!    holds at most two free blocks (the stream's coalesced run and the fresh tail, which stays
//!    fresh until the stream needs it), and a request of a whole chunk then succeeds with no
//!    growth (one block again); `release()` then gives back every chunk whole: the pool holds
//!    nothing and the upstream has everything back. Never a block across two chunks.
//! 7. Errors are out-of-memory only (never a logic error for a valid sequence); the resource
//!    keeps working after one.
//! 8. A bad free (a double free, a pointer inside a live block, an address never handed out),
//!    on any stream, is `Error::Logic` and changes nothing: invariants 1-7 hold after it and the
//!    live blocks are still freed normally.

use proptest::prelude::*;
use rrmm::suballocator::{EventCall, RecordingStreamEvents, StreamEvents, StreamKey};
use rrmm::{
    BinningMemoryResource, FixedSizeMemoryResource, MemoryResource, PoolMemoryResource,
    SharedResource, SimulatedMemoryResource, Stream,
};
use std::collections::BTreeMap;
use std::sync::Arc;

const STREAMS: usize = 5;

/// Stream `i` of the tests: the legacy default stream, three fake handles, and this thread's
/// per-thread default stream.
fn stream(i: usize) -> Stream {
    match i {
        0 => Stream::DEFAULT,
        4 => Stream::PER_THREAD,
        // SAFETY: a key only: simulated memory never passes it to the driver.
        _ => unsafe { Stream::from_raw(0x1000 + i) },
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        stream: usize,
        bytes: usize,
    },
    Free {
        pick: usize,
        stream: usize,
    },
    /// A bad free: 0 = double free, 1 = interior pointer, 2 = never handed out.
    BadFree {
        pick: usize,
        stream: usize,
        kind: u8,
    },
}

fn ops(max_bytes: usize, len: usize) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (0..STREAMS, 1..=max_bytes).prop_map(|(stream, bytes)| Op::Alloc { stream, bytes }),
        2 => (any::<usize>(), 0..STREAMS).prop_map(|(pick, stream)| Op::Free { pick, stream }),
        1 => (any::<usize>(), 0..STREAMS, 0..3u8)
            .prop_map(|(pick, stream, kind)| Op::BadFree { pick, stream, kind }),
    ];
    proptest::collection::vec(op, 1..len)
}

/// The shadow model: live allocations and, per address range, the last free.
struct Model {
    events: Arc<RecordingStreamEvents>,
    /// addr -> (requested bytes, rounded bytes)
    live: BTreeMap<usize, (usize, usize)>,
    /// Freed ranges not reused since: (start, end, freeing stream, time of the free).
    freed: Vec<(usize, usize, StreamKey, u64)>,
    /// Addresses freed, for double frees (some may be live again: checked before use).
    freed_ptrs: Vec<(usize, usize)>,
}

impl Model {
    fn new(events: Arc<RecordingStreamEvents>) -> Self {
        Model {
            events,
            live: BTreeMap::new(),
            freed: Vec::new(),
            freed_ptrs: Vec::new(),
        }
    }

    fn live_bytes(&self) -> usize {
        self.live.values().map(|&(_, r)| r).sum()
    }

    /// Checks invariants 1, 2 and 4 for a new allocation and records it.
    fn on_alloc(&mut self, ptr: usize, bytes: usize, rounded: usize, key: StreamKey) {
        let now = self.events.tick();
        assert_ne!(ptr, 0);
        assert_eq!(ptr % 256, 0, "alignment of {ptr:#x}");
        let end = ptr + rounded;
        if let Some((&a, &(_, r))) = self.live.range(..end).next_back() {
            assert!(
                a + r <= ptr,
                "overlap: [{ptr:#x}, {end:#x}) with [{a:#x}, +{r})"
            );
        }
        let log = self.events.log();
        let mut kept = Vec::with_capacity(self.freed.len());
        for &(s, e, owner, t) in &self.freed {
            if e <= ptr || s >= end {
                kept.push((s, e, owner, t));
                continue;
            }
            if owner != key {
                assert!(
                    ordered(&log, owner, key, t, now),
                    "memory [{s:#x}, {e:#x}) freed on {owner:?} at {t} reused on {key:?} at \
                     {now} without a wait on an event recorded after the free; log {log:?}"
                );
            }
            if s < ptr {
                kept.push((s, ptr, owner, t));
            }
            if e > end {
                kept.push((end, e, owner, t));
            }
        }
        self.freed = kept;
        self.live.insert(ptr, (bytes, rounded));
    }

    /// Picks a live allocation, removes it, and notes the free time (taken before the call).
    fn take_for_free(&mut self, pick: usize) -> Option<(usize, usize, usize)> {
        if self.live.is_empty() {
            return None;
        }
        let addr = *self.live.keys().nth(pick % self.live.len())?;
        let (bytes, rounded) = self.live.remove(&addr)?;
        Some((addr, bytes, rounded))
    }

    fn on_free(&mut self, addr: usize, rounded: usize, key: StreamKey, t: u64) {
        self.freed.push((addr, addr + rounded, key, t));
        self.freed_ptrs.push((addr, rounded));
    }

    /// An address that no live allocation starts at, of the kind `kind` (see [`Op::BadFree`]).
    fn bad_pointer(&self, pick: usize, kind: u8) -> Option<(usize, usize)> {
        let (addr, bytes) = match kind {
            0 if !self.freed_ptrs.is_empty() => self.freed_ptrs[pick % self.freed_ptrs.len()],
            1 if !self.live.is_empty() => {
                let (&a, &(b, _)) = self.live.iter().nth(pick % self.live.len())?;
                (a + 256, b)
            }
            _ => (0x7fff_0000_0000 + (pick % 1024) * 256, 256),
        };
        (!self.live.contains_key(&addr)).then_some((addr, bytes))
    }
}

/// Whether the log orders `waiter` after `owner`'s work at time `freed`, before `now`.
fn ordered(log: &[EventCall], owner: StreamKey, waiter: StreamKey, freed: u64, now: u64) -> bool {
    log.iter().enumerate().any(|(i, call)| match *call {
        EventCall::SynchronizeAll { seq } => seq > freed && seq < now,
        EventCall::Wait { stream, id, seq } if stream == waiter && seq > freed && seq < now => log
            [..i]
            .iter()
            .rev()
            .find_map(|c| match *c {
                EventCall::Record {
                    stream,
                    id: rid,
                    seq,
                } if rid == id => Some((stream, seq)),
                _ => None,
            })
            .is_some_and(|(s, rseq)| s == owner && rseq > freed),
        _ => false,
    })
}

/// Runs `ops` against `mr`; `round` gives the bytes a request occupies; `conserved` checks
/// invariant 3 given the live bytes.
fn run(
    mr: &dyn MemoryResource,
    events: &Arc<RecordingStreamEvents>,
    ops: &[Op],
    round: impl Fn(usize) -> usize,
    conserved: impl Fn(usize),
) -> Model {
    let mut model = Model::new(events.clone());
    for op in ops {
        match *op {
            Op::Alloc { stream: s, bytes } => match mr.allocate(bytes, stream(s)) {
                Ok(ptr) => model.on_alloc(ptr, bytes, round(bytes), StreamKey::of(stream(s))),
                Err(e) => assert!(e.is_out_of_memory(), "unexpected error {e}"),
            },
            Op::Free { pick, stream: s } => {
                if let Some((addr, bytes, rounded)) = model.take_for_free(pick) {
                    let t = events.tick();
                    // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
                    unsafe { mr.deallocate(addr, bytes, stream(s)) }.unwrap();
                    model.on_free(addr, rounded, StreamKey::of(stream(s)), t);
                }
            }
            Op::BadFree {
                pick,
                stream: s,
                kind,
            } => {
                if let Some((addr, bytes)) = model.bad_pointer(pick, kind) {
                    // SAFETY: every resource tested here checks frees (documented): a bad one is
                    // reported, never acted on; that is what this checks.
                    match unsafe { mr.deallocate(addr, bytes, stream(s)) } {
                        Err(rrmm::Error::Logic(_)) => {}
                        other => panic!("bad free of {addr:#x} (kind {kind}): {other:?}"),
                    }
                }
            }
        }
        conserved(model.live_bytes());
    }
    model
}

fn round256(b: usize) -> usize {
    b.div_ceil(256) * 256
}

fn pool_with(
    size: usize,
    initial: usize,
    max: Option<usize>,
) -> (
    Arc<SimulatedMemoryResource>,
    PoolMemoryResource,
    Arc<RecordingStreamEvents>,
) {
    let up = Arc::new(SimulatedMemoryResource::new(size));
    let events = RecordingStreamEvents::new();
    let dyn_events: Arc<dyn StreamEvents> = events.clone();
    let pool = PoolMemoryResource::with_events(up.clone(), Some(initial), max, dyn_events).unwrap();
    (up, pool, events)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_the_model(ops in ops(40_000, 300), initial in 0usize..8, capped in any::<bool>()) {
        let max = capped.then_some(1 << 20);
        let (up, pool, events) = pool_with(4 << 20, initial * 16384, max);
        let model = run(&pool, &events, &ops, round256, |live| {
            assert_eq!(pool.free_bytes() + live, pool.pool_size(), "bytes conserved");
            assert!(max.map_or(true, |m| pool.pool_size() <= m));
        });
        for (&addr, &(bytes, _)) in &model.live {
            // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
            unsafe { pool.deallocate(addr, bytes, stream(1)) }.unwrap();
        }
        assert_eq!(pool.free_bytes(), pool.pool_size());
        let size = pool.pool_size();
        assert_eq!(pool.release().unwrap(), size);
        assert_eq!((pool.pool_size(), up.bytes_in_use()), (0, 0));
        // Still works after release.
        let p = pool.allocate(1000, stream(2)).unwrap();
        // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
        unsafe { pool.deallocate(p, 1000, stream(2)) }.unwrap();
    }

    #[test]
    fn pool_on_one_stream_coalesces_back_to_the_upstream_chunks(ops in ops(100_000, 300), initial in prop_oneof![Just(4096usize), Just(64 << 20)]) {
        let ops: Vec<Op> = ops
            .into_iter()
            .map(|op| match op {
                Op::Alloc { bytes, .. } => Op::Alloc { stream: 3, bytes },
                Op::Free { pick, .. } => Op::Free { pick, stream: 3 },
                Op::BadFree { pick, kind, .. } => Op::BadFree { pick, stream: 3, kind },
            })
            .collect();
        let (up, pool, events) = pool_with(256 << 20, initial, None);
        let model = run(&pool, &events, &ops, round256, |live| {
            assert_eq!(pool.free_bytes() + live, pool.pool_size());
        });
        for (&addr, &(bytes, _)) in &model.live {
            // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
            unsafe { pool.deallocate(addr, bytes, stream(3)) }.unwrap();
        }
        // Each chunk is at most the stream's coalesced run plus the fresh tail beside it...
        let chunks = pool.upstream_chunk_count();
        assert!(pool.free_block_count() <= 2 * chunks);
        assert!(events.log().is_empty(), "one stream: no event calls");
        // ...which the stream takes as one block when it needs it, with no growth.
        if chunks == 1 {
            let size = pool.pool_size();
            let p = pool.allocate(size, stream(3)).unwrap();
            assert_eq!((pool.pool_size(), pool.free_block_count()), (size, 0));
            // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
            unsafe { pool.deallocate(p, size, stream(3)) }.unwrap();
            assert_eq!(pool.free_block_count(), 1);
        }
        // And after a release, nothing is left: every chunk had coalesced whole.
        let size = pool.pool_size();
        assert_eq!(pool.release().unwrap(), size);
        drop(pool);
        assert_eq!(up.bytes_in_use(), 0);
    }

    #[test]
    fn fixed_size_matches_the_model(ops in ops(5000, 300)) {
        let up = Arc::new(SimulatedMemoryResource::new(16 << 20));
        let events = RecordingStreamEvents::new();
        let dyn_events: Arc<dyn StreamEvents> = events.clone();
        let mr = FixedSizeMemoryResource::with_events(up.clone(), 4096, 4, dyn_events).unwrap();
        run(&mr, &events, &ops, |_| 4096, |live| {
            assert_eq!(mr.free_block_count() * 4096 + live, mr.pool_size());
            assert_eq!(mr.pool_size() % (4 * 4096), 0, "whole chunks");
        });
        drop(mr);
        assert_eq!(up.bytes_in_use(), 0);
    }

    #[test]
    fn binning_matches_the_model(ops in ops(20_000, 300)) {
        let up = Arc::new(SimulatedMemoryResource::new(64 << 20));
        let events = RecordingStreamEvents::new();
        let dyn_events: Arc<dyn StreamEvents> = events.clone();
        let big = PoolMemoryResource::with_events(up.clone(), Some(0), None, dyn_events.clone())
            .unwrap();
        let mr = BinningMemoryResource::new(Arc::new(big.clone()), None, None).unwrap();
        for e in 10..=13 {
            let bin = FixedSizeMemoryResource::with_events(up.clone(), 1 << e, 8, dyn_events.clone())
                .unwrap();
            mr.add_bin(1 << e, Some(Arc::new(bin))).unwrap();
        }
        let round = |b: usize| if b <= 8192 { b.next_power_of_two().max(1024) } else { round256(b) };
        let model = run(&mr, &events, &ops, round, |_| {});
        for (&addr, &(bytes, _)) in &model.live {
            // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
            unsafe { mr.deallocate(addr, bytes, stream(0)) }.unwrap();
        }
        assert_eq!(big.free_bytes(), big.pool_size());
        let held: usize = mr.bins().iter().map(|(_, b)| b.report().unwrap().footprint().held_bytes).sum();
        let free: usize = mr.bins().iter().map(|(_, b)| b.report().unwrap().footprint().free_bytes).sum();
        assert_eq!(held, free);
    }
}

#[test]
fn same_stream_reuse_makes_no_event_call_and_cross_stream_waits() {
    let (_up, pool, events) = pool_with(1 << 20, 4096, Some(4096));
    let a = pool.allocate(4096, stream(1)).unwrap();
    // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
    unsafe { pool.deallocate(a, 4096, stream(1)) }.unwrap();
    let b = pool.allocate(4096, stream(1)).unwrap();
    assert_eq!(a, b);
    // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
    unsafe { pool.deallocate(b, 4096, stream(1)) }.unwrap();
    assert!(events.log().is_empty());
    // Stream 1's list was not recorded after its free, and nothing records on stream 1 from
    // another stream (it may be gone): stream 2 marks the list wanted, cannot grow, and takes
    // the block after synchronizing everything.
    let c = pool.allocate(4096, stream(2)).unwrap();
    assert_eq!(c, a);
    assert!(matches!(
        events.log().as_slice(),
        [EventCall::SynchronizeAll { .. }]
    ));
    // The next user of a wanted list records its event; a later steal then only waits on it.
    // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
    unsafe { pool.deallocate(c, 4096, stream(2)) }.unwrap();
    let (k2, k3) = (StreamKey::of(stream(2)), StreamKey::of(stream(3)));
    let d = pool.allocate(4096, stream(3)).unwrap(); // marks 2 wanted, synchronizes again
                                                     // SAFETY: as above.
    unsafe { pool.deallocate(d, 4096, stream(3)) }.unwrap();
    let e = pool.allocate(4096, stream(3)).unwrap();
    assert_eq!(e, d);
    let log = events.log();
    assert!(log
        .iter()
        .all(|c| !matches!(c, EventCall::Record { stream, .. } if *stream == k3)));
    assert!(log
        .iter()
        .all(|c| !matches!(c, EventCall::Wait { stream, .. } if *stream == k2)));
}

#[test]
fn per_thread_default_streams_are_separate_and_recorded_only_when_wanted() {
    use std::sync::mpsc;
    let (_up, pool, events) = pool_with(1 << 20, 8192, Some(8192));
    let (to_owner, owner_rx) = mpsc::channel::<()>();
    let (to_main, main_rx) = mpsc::channel::<(usize, usize, StreamKey)>();
    let p2 = pool.clone();
    let owner = std::thread::spawn(move || {
        let a = p2.allocate(4096, Stream::PER_THREAD).unwrap();
        let b = p2.allocate(4096, Stream::PER_THREAD).unwrap();
        // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
        unsafe { p2.deallocate(a, 4096, Stream::PER_THREAD) }.unwrap();
        to_main
            .send((a, b, StreamKey::of(Stream::PER_THREAD)))
            .unwrap();
        owner_rx.recv().unwrap();
        // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
        unsafe { p2.deallocate(b, 4096, Stream::PER_THREAD) }.unwrap();
        to_main
            .send((a, b, StreamKey::of(Stream::PER_THREAD)))
            .unwrap();
    });
    let (a, b, other) = main_rx.recv().unwrap();
    assert_ne!(
        other,
        StreamKey::of(Stream::PER_THREAD),
        "one PTDS key per thread"
    );
    // Same-stream frees on a PTDS made no event call.
    assert!(events.log().is_empty());
    // `a` was freed on the owner's PTDS with no record since: not taken with a wait; the pool
    // is at its maximum, so it is reached through the synchronize-and-merge path.
    assert_eq!(pool.allocate(4096, stream(1)).unwrap(), a);
    assert!(matches!(
        events.log().as_slice(),
        [EventCall::SynchronizeAll { .. }]
    ));
    // After the merge nobody wants the owner's list: its next free records nothing...
    to_owner.send(()).unwrap();
    main_rx.recv().unwrap();
    owner.join().unwrap();
    assert_eq!(events.log().len(), 1);
    // ...so `b` is again reached only by synchronizing.
    assert_eq!(pool.allocate(4096, stream(1)).unwrap(), b);
    assert_eq!(events.log().len(), 2);
}

#[test]
fn a_wanted_per_thread_list_is_recorded_by_its_owner_and_then_waited_on() {
    use std::sync::mpsc;
    // Room for exactly one more 4 KiB chunk after the initial 12 KiB.
    let (_up, pool, events) = pool_with(1 << 20, 12288, Some(16384));
    let (to_owner, owner_rx) = mpsc::channel::<()>();
    let (to_main, main_rx) = mpsc::channel::<StreamKey>();
    let p2 = pool.clone();
    let owner = std::thread::spawn(move || {
        let ptrs: Vec<usize> = (0..3)
            .map(|_| p2.allocate(4096, Stream::PER_THREAD).unwrap())
            .collect();
        // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
        unsafe { p2.deallocate(ptrs[0], 4096, Stream::PER_THREAD) }.unwrap();
        to_main.send(StreamKey::of(Stream::PER_THREAD)).unwrap();
        owner_rx.recv().unwrap();
        // Another thread wanted this list: this free records the event.
        // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
        unsafe { p2.deallocate(ptrs[1], 4096, Stream::PER_THREAD) }.unwrap();
        to_main.send(StreamKey::of(Stream::PER_THREAD)).unwrap();
        owner_rx.recv().unwrap();
        // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
        unsafe { p2.deallocate(ptrs[2], 4096, Stream::PER_THREAD) }.unwrap();
        ptrs
    });
    let other = main_rx.recv().unwrap();
    let x = StreamKey::of(stream(1));
    // The owner's list has an unrecorded free: marked wanted, and the pool grows instead.
    let grown = pool.allocate(4096, stream(1)).unwrap();
    assert_eq!(pool.pool_size(), 16384);
    assert!(events.log().is_empty());
    to_owner.send(()).unwrap();
    main_rx.recv().unwrap();
    let log = events.log();
    assert!(
        matches!(log.as_slice(), [EventCall::Record { stream: r, .. }] if *r == other),
        "{log:?}"
    );
    // Now the list's event follows its latest free: taken with a lone wait (this thread cannot
    // record on the owner's stream).
    let got = pool.allocate(4096, stream(1)).unwrap();
    let log = events.log();
    assert!(
        matches!(log.as_slice(), [EventCall::Record { id: r, .. }, EventCall::Wait { stream: w, id, .. }]
            if *w == x && r == id),
        "{log:?}"
    );
    to_owner.send(()).unwrap();
    let ptrs = owner.join().unwrap();
    assert!(got == ptrs[0] || got == ptrs[1]);
    assert_ne!(grown, got);
}

#[test]
fn fresh_memory_never_makes_a_stream_wait() {
    // Cold start on several streams: a free beside the fresh tail does not hand the tail to that
    // stream, so the other streams keep taking fresh memory with no event wait.
    let (_up, pool, events) = pool_with(1 << 24, 1 << 20, None);
    for round in 0..50 {
        for s in 1..4 {
            let p = pool.allocate(4096 + 256 * round, stream(s)).unwrap();
            // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
            unsafe { pool.deallocate(p, 4096 + 256 * round, stream(s)) }.unwrap();
        }
    }
    assert!(events.log().is_empty(), "{:?}", events.log());
}

#[test]
fn growth_failure_synchronizes_merges_and_retries() {
    let (_up, pool, events) = pool_with(1 << 20, 8192, Some(8192));
    let a = pool.allocate(4096, stream(1)).unwrap();
    let b = pool.allocate(4096, stream(2)).unwrap();
    // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
    unsafe { pool.deallocate(a, 4096, stream(1)) }.unwrap();
    // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
    unsafe { pool.deallocate(b, 4096, stream(2)) }.unwrap();
    // Two 4 KiB halves in two streams' lists: 8 KiB fits only once they are merged.
    let c = pool.allocate(8192, stream(3)).unwrap();
    assert_eq!(c, a.min(b));
    assert!(matches!(
        events.log().last(),
        Some(EventCall::SynchronizeAll { .. })
    ));
}

#[test]
fn threads_on_their_own_and_per_thread_streams_never_overlap() {
    let up: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 30));
    let pool = PoolMemoryResource::new(up.clone(), Some(1 << 20), None).unwrap();
    let fixed = FixedSizeMemoryResource::new(up.clone(), 4096, 16).unwrap();
    let resources: Vec<SharedResource> = vec![Arc::new(pool.clone()), Arc::new(fixed.clone())];
    for mr in resources {
        let live = Arc::new(parking_lot::Mutex::new(BTreeMap::<usize, usize>::new()));
        let threads: Vec<_> = (0..4usize)
            .map(|t| {
                let (mr, live) = (mr.clone(), live.clone());
                std::thread::spawn(move || {
                    let mut mine = Vec::new();
                    let mut s = 0x1234_5678_9abc_def1u64 ^ t as u64;
                    for i in 0..5000 {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        // Threads 0 and 1 use their per-thread default streams; all free on
                        // a stream other than the one they allocated on now and then.
                        let st = if t < 2 { Stream::PER_THREAD } else { stream(t) };
                        if s % 3 != 0 || mine.is_empty() {
                            let bytes = (s as usize % 4096) + 1;
                            let p = mr.allocate(bytes, st).unwrap();
                            let mut l = live.lock();
                            if let Some((&a, &n)) = l.range(..p + bytes).next_back() {
                                assert!(a + n <= p, "overlap between threads");
                            }
                            l.insert(p, bytes);
                            drop(l);
                            mine.push((p, bytes));
                        } else {
                            let (p, bytes) = mine.swap_remove(s as usize % mine.len());
                            live.lock().remove(&p);
                            let fs = if i % 7 == 0 { stream(3) } else { st };
                            // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
                            unsafe { mr.deallocate(p, bytes, fs) }.unwrap();
                        }
                    }
                    for (p, bytes) in mine {
                        live.lock().remove(&p);
                        // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
                        unsafe { mr.deallocate(p, bytes, Stream::DEFAULT) }.unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
    assert_eq!(pool.free_bytes(), pool.pool_size());
    assert_eq!(fixed.free_block_count() * 4096, fixed.pool_size());
}

// Compile-time check: every suballocator is a thread-safe, shareable memory resource.
const _: () = {
    const fn check<T: MemoryResource + Send + Sync + Clone + 'static>() {}
    check::<PoolMemoryResource>();
    check::<FixedSizeMemoryResource>();
    check::<BinningMemoryResource>();
};

#[test]
fn resources_coerce_to_shared_resource() {
    let up: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 20));
    let pool: SharedResource = Arc::new(PoolMemoryResource::new(up.clone(), None, None).unwrap());
    let fixed: SharedResource =
        Arc::new(FixedSizeMemoryResource::new(up.clone(), 4096, 2).unwrap());
    let bins: SharedResource =
        Arc::new(BinningMemoryResource::new(pool.clone(), Some(8), Some(9)).unwrap());
    let names: Vec<&str> = [&pool, &fixed, &bins].iter().map(|r| r.name()).collect();
    assert_eq!(names, ["pool", "fixed_size", "binning"]);
}

/// Speed check (run in release: `cargo test --release --test suballocator_properties --
/// --ignored --nocapture`): random alloc/free mixes at 10k and 100k live blocks, and the shared
/// traces replayed on simulated memory, in ns per event including a small replay harness.
#[test]
#[ignore = "timing; run in release"]
fn speed_on_simulated_memory() {
    use std::collections::HashMap;
    use std::io::BufRead;
    use std::time::Instant;

    /// This thread's time on a CPU (from the scheduler), so a loaded machine skews less.
    fn cpu_ns() -> u64 {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }
    fn rng(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }
    let make_pool = || -> (SharedResource, PoolMemoryResource) {
        let up: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 40));
        let pool = PoolMemoryResource::new(up.clone(), None, None).unwrap();
        (up, pool)
    };
    for (live, max) in [(10_000usize, 1usize << 20), (100_000, 4 << 20)] {
        let (_up, pool) = {
            // A pool of exactly what the live set needs at first, so growth and fit matter.
            let up: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 40));
            (
                up.clone(),
                PoolMemoryResource::new(up, Some(0), None).unwrap(),
            )
        };
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut ptrs: Vec<(usize, usize)> = (0..live)
            .map(|_| {
                let b = (rng(&mut s) as usize % max) + 1;
                (pool.allocate(b, Stream::DEFAULT).unwrap(), b)
            })
            .collect();
        let ops = 2_000_000;
        let (t, c) = (Instant::now(), cpu_ns());
        for _ in 0..ops / 2 {
            let i = rng(&mut s) as usize % ptrs.len();
            let (p, b) = ptrs.swap_remove(i);
            // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
            unsafe { pool.deallocate(p, b, Stream::DEFAULT) }.unwrap();
            let b = (rng(&mut s) as usize % max) + 1;
            ptrs.push((pool.allocate(b, Stream::DEFAULT).unwrap(), b));
        }
        let ns = t.elapsed().as_nanos() as f64 / ops as f64;
        let cpu = (cpu_ns() - c) as f64 / ops as f64;
        println!(
            "pool random mix, {live} live blocks up to {max} B: {ns:.0} ns/op wall, {cpu:.0} ns/op on cpu ({} free blocks, \
             pool {} MiB for {} MiB live)",
            pool.free_block_count(),
            pool.pool_size() >> 20,
            (pool.pool_size() - pool.free_bytes()) >> 20
        );
    }

    // Trace replay: events parsed first, then replayed through a pointer map.
    let dir = match std::env::var_os("RRMM_TRACES") {
        Some(d) => std::path::PathBuf::from(d),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/rrmm/traces"),
    };
    for name in [
        "random_10k_1mib",
        "random_100k_4mib",
        "transformer_training",
    ] {
        let path = dir.join(format!("{name}.csv.gz"));
        let file = std::fs::File::open(&path)
            .unwrap_or_else(|e| panic!("shipped trace {name} ({}): {e}", path.display()));
        let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(file));
        let events: Vec<(bool, usize, usize)> = reader
            .lines()
            .skip(1)
            .filter_map(|l| {
                let l = l.ok()?;
                let f: Vec<&str> = l.split(',').collect();
                let ptr = usize::from_str_radix(f[3].trim_start_matches("0x"), 16).ok()?;
                Some((f[2] == "allocate", ptr, f[4].parse().ok()?))
            })
            .collect();
        for kind in ["pool", "binning"] {
            let (_up, pool) = make_pool();
            let mr: SharedResource = if kind == "pool" {
                Arc::new(pool.clone())
            } else {
                Arc::new(
                    BinningMemoryResource::new(Arc::new(pool.clone()), Some(18), Some(22)).unwrap(),
                )
            };
            for pass in ["cold", "warm"] {
                let mut map: HashMap<usize, (usize, usize)> = HashMap::with_capacity(200_000);
                // Touch the harness's map first, so its page faults are not timed.
                map.extend((1..200_000).map(|i| (i, (0, 0))));
                map.clear();
                let (t, c) = (Instant::now(), cpu_ns());
                let mut failures = 0;
                for &(alloc, ptr, size) in &events {
                    if alloc {
                        match mr.allocate(size, Stream::DEFAULT) {
                            Ok(p) => {
                                map.insert(ptr, (p, size));
                            }
                            Err(_) => failures += 1,
                        }
                    } else if let Some((p, _)) = map.remove(&ptr) {
                        // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
                        unsafe { mr.deallocate(p, size, Stream::DEFAULT) }.unwrap();
                    }
                }
                let ns = t.elapsed().as_nanos() as f64 / events.len() as f64;
                let cpu = (cpu_ns() - c) as f64 / events.len() as f64;
                println!(
                    "{kind} replay {name} ({pass}): {} events, {ns:.0} ns/event wall, {cpu:.0} ns/event on cpu, {failures} \
                     failures, {} free blocks in the pool",
                    events.len(),
                    pool.free_block_count()
                );
                for (p, size) in map.into_values() {
                    // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
                    unsafe { mr.deallocate(p, size, Stream::DEFAULT) }.unwrap();
                }
            }
        }
    }
}

/// On a GPU (ignored elsewhere; `cargo test -- --ignored` on a GPU machine): the three resources over `cuMemAlloc`, data written and read
/// back on two streams with memory moving between them, per-thread default streams on several
/// threads, and out of memory at the pool's maximum with the pool working afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_streams_threads_data_and_maximum() {
    use rrmm::cuda::{self, ContextGuard, OwnedStream};
    assert!(cuda::device_count() > 0, "no CUDA device");
    let _ctx = ContextGuard::new(0).unwrap();
    let up: SharedResource = Arc::new(rrmm::CudaMemoryResource::on_device(0).unwrap());
    let pool = PoolMemoryResource::new(up.clone(), Some(64 << 20), Some(256 << 20)).unwrap();
    let resources: Vec<SharedResource> = vec![
        Arc::new(pool.clone()),
        Arc::new(FixedSizeMemoryResource::new(up.clone(), 1 << 20, 8).unwrap()),
        Arc::new(
            BinningMemoryResource::new(
                Arc::new(PoolMemoryResource::new(up.clone(), Some(0), None).unwrap()),
                Some(10),
                Some(16),
            )
            .unwrap(),
        ),
    ];
    /// Fills `bytes` at `ptr` with `value` on `stream` and checks it from the host.
    fn fill_and_check(ptr: usize, bytes: usize, value: u8, stream: Stream) {
        let mut host = vec![0u8; bytes];
        // SAFETY: `ptr` is a live allocation of at least `bytes` bytes, used on `stream` only;
        // `host` is a live buffer of `bytes` bytes that outlives the synchronous copy.
        unsafe {
            cuda::memset_async(ptr, value, bytes, stream).unwrap();
            cuda::memcpy_sync(host.as_mut_ptr() as usize, ptr, bytes, stream).unwrap();
        }
        assert!(host.iter().all(|&b| b == value), "data check on {stream:?}");
    }
    for mr in &resources {
        let (s1, s2) = (
            OwnedStream::new(true).unwrap(),
            OwnedStream::new(true).unwrap(),
        );
        for round in 0..20u8 {
            let bytes = 1000 + 37 * round as usize;
            let a = mr.allocate(bytes, *s1).unwrap();
            fill_and_check(a, bytes, round, *s1);
            // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
            unsafe { mr.deallocate(a, bytes, *s1) }.unwrap();
            // Freed on s1, reused on s2 (after the event wait).
            let b = mr.allocate(bytes, *s2).unwrap();
            fill_and_check(b, bytes, round.wrapping_add(100), *s2);
            // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
            unsafe { mr.deallocate(b, bytes, *s2) }.unwrap();
        }
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let mr = mr.clone();
                std::thread::spawn(move || {
                    let _ctx = ContextGuard::new(0).unwrap();
                    for i in 0..50usize {
                        let bytes = 256 + 512 * (i % 7);
                        let p = mr.allocate(bytes, Stream::PER_THREAD).unwrap();
                        fill_and_check(p, bytes, t * 50 + i as u8 % 50, Stream::PER_THREAD);
                        // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
                        unsafe { mr.deallocate(p, bytes, Stream::PER_THREAD) }.unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
    let e = pool.allocate(512 << 20, Stream::DEFAULT).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let p = pool.allocate(1 << 20, Stream::DEFAULT).unwrap();
    fill_and_check(p, 1 << 20, 7, Stream::DEFAULT);
    // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
    unsafe { pool.deallocate(p, 1 << 20, Stream::DEFAULT) }.unwrap();
    drop(resources);
    assert!(pool.release().unwrap() <= 256 << 20);
}

/// Thread scaling on simulated memory (run in release: `cargo test --release --test
/// suballocator_properties threads_scale -- --ignored --nocapture`): W7's pattern on the CPU side,
/// each thread on its own stream, random 256 B..1 MiB, at most 64 live, one shared pool; total
/// million operations per second for 1, 2 and 4 threads, and per thread wall and CPU time per
/// operation (CPU time from the scheduler: on a loaded machine it shows contention better).
#[test]
#[ignore = "timing; run in release"]
fn threads_scale_on_simulated_memory() {
    use std::time::Instant;
    fn thread_cpu_ns() -> u64 {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }
    const OPS: usize = 1_000_000;
    for threads in [1usize, 2, 4] {
        let up: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 40));
        let pool = PoolMemoryResource::new(up, Some(1 << 30), None).unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(threads + 1));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (pool, barrier) = (pool.clone(), barrier.clone());
                std::thread::spawn(move || {
                    // SAFETY: a key only: simulated memory never passes it to the driver.
                    let st = unsafe { Stream::from_raw(0x1000 + t) };
                    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1);
                    let mut live: Vec<(usize, usize)> = Vec::with_capacity(64);
                    barrier.wait();
                    let (t0, c0) = (Instant::now(), thread_cpu_ns());
                    for _ in 0..OPS / 2 {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        if live.len() == 64 || (!live.is_empty() && s % 2 == 0) {
                            let (p, b) = live.swap_remove((s >> 8) as usize % live.len());
                            // SAFETY: a live allocation of the pool with this size, freed once.
                            unsafe { pool.deallocate(p, b, st) }.unwrap();
                        }
                        let bytes = 256 + (s >> 20) as usize % (1 << 20);
                        live.push((pool.allocate(bytes, st).unwrap(), bytes));
                    }
                    for (p, b) in live {
                        // SAFETY: as above.
                        unsafe { pool.deallocate(p, b, st) }.unwrap();
                    }
                    (t0.elapsed(), thread_cpu_ns() - c0)
                })
            })
            .collect();
        barrier.wait();
        let t0 = Instant::now();
        let per_thread: Vec<(f64, f64)> = handles
            .into_iter()
            .map(|h| {
                let (wall, cpu) = h.join().unwrap();
                (
                    (wall.as_nanos() as f64 / OPS as f64).round(),
                    (cpu as f64 / OPS as f64).round(),
                )
            })
            .collect();
        let total = t0.elapsed().as_secs_f64();
        println!(
            "{threads} thread(s): {:.1} M ops/s total, (wall, cpu) ns/op per thread {:?}",
            (threads * OPS) as f64 / total / 1e6,
            per_thread
        );
    }
}
