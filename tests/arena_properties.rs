//! Property tests of `ArenaMemoryResource` against a shadow model, on simulated memory.
//!
//! Invariants, over random alloc/free sequences on several streams (the legacy default stream,
//! per-thread default streams, ordinary streams) from one and from several threads, with frees
//! on other streams and other threads than the allocation's:
//! 1. Every allocation is non-null and 256-byte aligned, and lies inside the arena.
//! 2. No two live allocations overlap (the model keeps them by address, shared by all threads).
//! 3. Bytes are conserved: free bytes (global arena + superblocks) + live bytes (rounded to 256)
//!    == the arena size, whenever no call is in flight.
//! 4. When everything is freed, every byte is free again; after `defragment()` every superblock
//!    is back in the global arena, which is one free range of the whole arena.
//! 5. Errors are out-of-memory only (never a logic error for a valid sequence); the arena keeps
//!    working after one. Frees of freed or foreign pointers are logic errors.
//! 6. Every reuse is ordered after every earlier free of the same bytes that no host
//!    synchronisation covered, per the recording fake of the stream events: memory freed on
//!    stream A at time t and handed to stream B later is either implicitly ordered (B is A; B is
//!    a default stream and A the legacy one; B is the legacy stream and A a per-thread one), or
//!    the log holds, between t and the allocation, a `Wait` by B on an event last recorded on A
//!    after t, or a `SynchronizeAll`. Frees that the arena synchronizes on the host at once (a
//!    large block on an ordinary stream; a block freed on a stream whose arena does not own it,
//!    unless it is the legacy stream and the owner a thread's arena) need nothing later.

use proptest::prelude::*;
use rrmm::suballocator::{EventCall, RecordingStreamEvents, StreamKey};
use rrmm::{ArenaMemoryResource, Error, MemoryResource, SimulatedMemoryResource, Stream};
use std::collections::BTreeMap;
use std::sync::Arc;

const MIB: usize = 1 << 20;
const ARENA: usize = 24 * MIB;

/// Stream `i`: the legacy default stream, three ordinary handles, the per-thread default stream.
fn stream(i: usize) -> Stream {
    match i % 5 {
        0 => Stream::DEFAULT,
        4 => Stream::PER_THREAD,
        // SAFETY: a key only: simulated memory never passes it to the driver.
        k => unsafe { Stream::from_raw(0x1000 * k) },
    }
}

/// Frees through the unsafe trait method; the arena checks every free itself.
fn free(mr: &ArenaMemoryResource, ptr: usize, bytes: usize, s: Stream) -> rrmm::Result<()> {
    // SAFETY: the tests free live blocks once (or a freed one the arena must reject); simulated
    // memory has no device work that could use them.
    unsafe { mr.deallocate(ptr, bytes, s) }
}

fn rounded(bytes: usize) -> usize {
    (bytes + 255) & !255
}

/// Which arena serves a stream on the calling thread: the thread's (named by its PTDS key) for
/// the default streams, else the stream's own.
fn arena_of(s: Stream) -> StreamKey {
    StreamKey::of(if s.is_default() {
        Stream::PER_THREAD
    } else {
        s
    })
}

/// Whether work on `user` is ordered after earlier work on `freer` with no event.
fn implicitly_ordered(user: StreamKey, freer: StreamKey) -> bool {
    let legacy = StreamKey::of(Stream::DEFAULT);
    let default = |k: StreamKey| k == legacy || k.is_per_thread();
    user == freer || (freer == legacy && default(user)) || (freer.is_per_thread() && user == legacy)
}

/// Whether `log` makes `user` wait, after `t` and before `now`, on an event whose latest
/// record before the wait was on `freer` after `t`; or synchronizes every stream in between.
fn waited(log: &[EventCall], user: StreamKey, freer: StreamKey, t: u64, now: u64) -> bool {
    let mut last_record: BTreeMap<u64, (StreamKey, u64)> = BTreeMap::new();
    for call in log {
        match *call {
            EventCall::SynchronizeAll { seq } if seq > t && seq < now => return true,
            EventCall::Record { stream, id, seq } => {
                last_record.insert(id, (stream, seq));
            }
            EventCall::Wait { stream, id, seq } if stream == user && seq > t && seq < now => {
                if matches!(last_record.get(&id), Some(&(s, r)) if s == freer && r > t) {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// A free not yet known complete: [start, end) freed on `freer` at time `t`.
struct Unsynced {
    start: usize,
    end: usize,
    freer: StreamKey,
    t: u64,
}

/// Live allocations by address: start -> (end, requested bytes, the arena that served it);
/// frees no host synchronisation has covered.
#[derive(Default)]
struct Model {
    live: BTreeMap<usize, (usize, usize, StreamKey)>,
    unsynced: Vec<Unsynced>,
}

impl Model {
    /// Checks invariant 6 for `[ptr, ptr + bytes)` handed to `user` before `now`.
    fn check_ordered(
        &mut self,
        log: &[EventCall],
        ptr: usize,
        bytes: usize,
        user: StreamKey,
        now: u64,
    ) {
        let end = ptr + rounded(bytes);
        if let Some(seq) = log.iter().rev().find_map(|c| match *c {
            EventCall::SynchronizeAll { seq } => Some(seq),
            _ => None,
        }) {
            self.unsynced.retain(|u| u.t > seq);
        }
        for u in &self.unsynced {
            if u.start < end && ptr < u.end && !implicitly_ordered(user, u.freer) {
                assert!(
                    waited(log, user, u.freer, u.t, now),
                    "{ptr:#x}: reused on {user:?}, freed on {:?} at {}: {log:?}",
                    u.freer,
                    u.t
                );
            }
        }
    }

    /// Notes the free of `[ptr, ptr + bytes)` (served by `arena`) on `s` at time `t`, unless
    /// the arena synchronizes `s` on the host for it.
    fn on_free(&mut self, ptr: usize, bytes: usize, arena: StreamKey, s: Stream, t: u64) {
        let synchronized = if rounded(bytes) > MIB {
            !s.is_default()
        } else {
            arena != arena_of(s) && !(s.is_legacy_default() && arena.is_per_thread())
        };
        if !synchronized {
            self.unsynced.push(Unsynced {
                start: ptr,
                end: ptr + rounded(bytes),
                freer: StreamKey::of(s),
                t,
            });
        }
    }

    fn insert(&mut self, base: usize, ptr: usize, bytes: usize, s: Stream) {
        let end = ptr + rounded(bytes);
        assert!(ptr != 0 && ptr % 256 == 0, "alignment: {ptr:#x}");
        assert!(ptr >= base && end <= base + ARENA, "outside the arena");
        if let Some((&p, &(e, _, _))) = self.live.range(..=ptr).next_back() {
            assert!(e <= ptr, "overlap: [{p:#x},{e:#x}) and {ptr:#x}");
        }
        if let Some((&p, _)) = self.live.range(ptr..).next() {
            assert!(end <= p, "overlap: {ptr:#x}..{end:#x} and {p:#x}");
        }
        self.live.insert(ptr, (end, bytes, arena_of(s)));
    }

    fn live_bytes(&self) -> usize {
        self.live.values().map(|&(_, b, _)| rounded(b)).sum()
    }
}

fn new_arena() -> (ArenaMemoryResource, usize, Arc<RecordingStreamEvents>) {
    let up = Arc::new(SimulatedMemoryResource::new(2 * ARENA));
    let events = RecordingStreamEvents::new();
    let mr = ArenaMemoryResource::with_events(up, Some(ARENA), None, events.clone()).unwrap();
    let probe = mr.allocate(2 * MIB, Stream::DEFAULT).unwrap();
    free(&mr, probe, 2 * MIB, Stream::DEFAULT).unwrap();
    mr.defragment().unwrap();
    (mr, probe, events) // the first large block starts at the arena's base
}

fn check_everything_returns(mr: &ArenaMemoryResource) {
    assert_eq!(mr.free_bytes(), ARENA, "all freed: every byte free");
    mr.defragment().unwrap();
    assert_eq!(
        mr.global_free_bytes(),
        ARENA,
        "superblocks back in the global arena"
    );
    assert_eq!(
        mr.report().unwrap().footprint().free_blocks,
        1,
        "one free range"
    );
    let whole = mr.allocate(ARENA, Stream::PER_THREAD).unwrap();
    free(mr, whole, ARENA, stream(1)).unwrap();
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { stream: usize, bytes: usize },
    Free { pick: usize, stream: usize },
}

fn ops(len: usize) -> impl Strategy<Value = Vec<Op>> {
    let bytes = prop_oneof![
        4 => 1usize..64 << 10,
        3 => (64usize << 10)..=MIB,
        1 => (MIB + 1)..4 * MIB,
    ];
    let op = prop_oneof![
        3 => (0..5usize, bytes).prop_map(|(stream, bytes)| Op::Alloc { stream, bytes }),
        2 => (any::<usize>(), 0..5usize).prop_map(|(pick, stream)| Op::Free { pick, stream }),
    ];
    prop::collection::vec(op, 1..len)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// One thread, five streams, frees on any stream.
    #[test]
    fn one_thread_many_streams(ops in ops(300)) {
        let (mr, base, events) = new_arena();
        let mut model = Model::default();
        for op in ops {
            match op {
                Op::Alloc { stream: s, bytes } => match mr.allocate(bytes, stream(s)) {
                    Ok(p) => {
                        let now = events.tick();
                        let user = StreamKey::of(stream(s));
                        model.check_ordered(&events.log(), p, bytes, user, now);
                        model.insert(base, p, bytes, stream(s));
                    }
                    Err(e) => prop_assert!(e.is_out_of_memory(), "{e}"),
                },
                Op::Free { pick, stream: s } => {
                    if model.live.is_empty() {
                        continue;
                    }
                    let &p = model.live.keys().nth(pick % model.live.len()).unwrap();
                    let (_, bytes, arena) = model.live.remove(&p).unwrap();
                    let t = events.tick();
                    free(&mr, p, bytes, stream(s)).unwrap();
                    model.on_free(p, bytes, arena, stream(s), t);
                    prop_assert!(matches!(free(&mr, p, bytes, stream(s)), Err(Error::Logic(_))));
                }
            }
            prop_assert_eq!(mr.free_bytes() + model.live_bytes(), ARENA);
        }
        for (p, (_, bytes, _)) in std::mem::take(&mut model.live) {
            free(&mr, p, bytes, Stream::DEFAULT).unwrap();
        }
        check_everything_returns(&mr);
    }

    /// Several threads on per-thread default streams, the legacy default stream, their own and
    /// shared streams, handing some blocks to other threads to free.
    #[test]
    fn many_threads_many_streams(per_thread in prop::collection::vec(ops(120), 2..5)) {
        let (mr, base, events) = new_arena();
        let model = parking_lot::Mutex::new(Model::default());
        let handoff = parking_lot::Mutex::new(Vec::<(usize, usize)>::new());
        std::thread::scope(|scope| {
            for (t, ops) in per_thread.iter().enumerate() {
                let (mr, model, handoff, events) = (&mr, &model, &handoff, &events);
                scope.spawn(move || {
                    // Streams 1..3 are shared by all threads; 0 and 4 are per thread anyway.
                    let mut mine: Vec<(usize, usize)> = Vec::new();
                    for (i, op) in ops.iter().enumerate() {
                        match *op {
                            Op::Alloc { stream: s, bytes } => match mr.allocate(bytes, stream(s)) {
                                Ok(p) => {
                                    let now = events.tick();
                                    let log = events.log();
                                    let user = StreamKey::of(stream(s));
                                    let mut m = model.lock();
                                    m.check_ordered(&log, p, bytes, user, now);
                                    m.insert(base, p, bytes, stream(s));
                                    drop(m);
                                    if (i + t) % 4 == 0 {
                                        handoff.lock().push((p, bytes));
                                    } else {
                                        mine.push((p, bytes));
                                    }
                                }
                                Err(e) => assert!(e.is_out_of_memory(), "{e}"),
                            },
                            Op::Free { pick, stream: s } => {
                                let theirs = if pick % 3 == 0 { handoff.lock().pop() } else { None };
                                let victim = match theirs {
                                    Some(v) => Some(v),
                                    None if !mine.is_empty() => {
                                        Some(mine.swap_remove(pick % mine.len()))
                                    }
                                    None => None,
                                };
                                if let Some((p, bytes)) = victim {
                                    // Out of the model first: once freed, another thread may
                                    // get the same address.
                                    let (_, _, arena) = model.lock().live.remove(&p).unwrap();
                                    let t = events.tick();
                                    free(mr, p, bytes, stream(s)).unwrap();
                                    model.lock().on_free(p, bytes, arena, stream(s), t);
                                }
                            }
                        }
                    }
                    for (p, bytes) in mine {
                        model.lock().live.remove(&p);
                        free(mr, p, bytes, stream(t)).unwrap();
                    }
                });
            }
        });
        prop_assert_eq!(mr.free_bytes() + model.lock().live_bytes(), ARENA);
        for (p, bytes) in handoff.into_inner() {
            model.lock().live.remove(&p);
            free(&mr, p, bytes, Stream::PER_THREAD).unwrap();
        }
        prop_assert!(model.lock().live.is_empty());
        check_everything_returns(&mr);
    }
}
