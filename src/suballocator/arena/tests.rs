//! Unit tests of `ArenaMemoryResource` on simulated memory.

use super::*;
use crate::resource::{MemoryKind, SimulatedMemoryResource};
use crate::suballocator::NoStreamEvents;
use crate::suballocator::{EventCall, RecordingStreamEvents, StreamKey};
use crate::test_support::free_on;

const MIB: usize = SUPERBLOCK_MIN;
// SAFETY: keys only: simulated memory never passes them to the driver.
const S1: Stream = unsafe { Stream::from_raw(0x1000) };
// SAFETY: as S1.
const S2: Stream = unsafe { Stream::from_raw(0x2000) };

fn sim(size: usize) -> Arc<SimulatedMemoryResource> {
    Arc::new(SimulatedMemoryResource::new(size))
}

fn arena(size: usize) -> ArenaMemoryResource {
    ArenaMemoryResource::new(sim(4 * size), Some(size), false).unwrap()
}

#[test]
fn default_size_is_half_the_free_memory_and_goes_back_on_drop() {
    let up = sim(64 * MIB + 300);
    let mr = ArenaMemoryResource::new(up.clone(), None, false).unwrap();
    assert_eq!(mr.arena_size(), ((64 * MIB + 300) / 2) & !255);
    assert_eq!(up.bytes_in_use(), mr.arena_size());
    assert_eq!((mr.name(), mr.kind()), ("arena", MemoryKind::Simulated));
    let p = mr.allocate(1000, S1).unwrap();
    assert_eq!(up.live_allocations(), 1, "taken once, never grown");
    free_on(&mr, p, 1000, S1).unwrap();
    drop(mr);
    assert_eq!(up.bytes_in_use(), 0);
}

#[test]
fn size_validation() {
    let e = ArenaMemoryResource::new(sim(64 * MIB), Some(MIB - 256), false).unwrap_err();
    assert!(matches!(&e, Error::Logic(m) if m.starts_with(
        "Arena size smaller than minimum superblock size. (arena_size=1048320: give at least"
    )));
    let mr = ArenaMemoryResource::new(sim(64 * MIB), Some(MIB + 100), false).unwrap();
    assert_eq!(mr.arena_size(), MIB, "rounded down to 256");
    assert!(ArenaMemoryResource::new(sim(MIB), Some(2 * MIB), false)
        .unwrap_err()
        .is_out_of_memory());
}

#[test]
fn streams_get_their_own_superblocks_and_threads_theirs() {
    let mr = arena(16 * MIB);
    let a = mr.allocate(256, S1).unwrap();
    let b = mr.allocate(256, S2).unwrap();
    let c = mr.allocate(256, Stream::PER_THREAD).unwrap();
    let d = mr.allocate(256, Stream::DEFAULT).unwrap();
    assert_eq!(a % 256, 0);
    assert_eq!(b - a, MIB, "each stream arena takes a 1 MiB superblock");
    assert_eq!(c - b, MIB);
    assert_eq!(
        d - c,
        256,
        "legacy default stream shares the thread's arena"
    );
    let e = std::thread::spawn({
        let mr = mr.clone();
        move || mr.allocate(256, Stream::PER_THREAD).unwrap()
    })
    .join()
    .unwrap();
    assert_eq!(e - c, MIB, "another thread, another arena");
    assert_eq!(mr.arena_count(), 4);
    assert_eq!(mr.global_free_bytes(), 12 * MIB);
    for (p, s) in [
        (a, S1),
        (b, S2),
        (c, Stream::PER_THREAD),
        (d, Stream::LEGACY),
    ] {
        free_on(&mr, p, 256, s).unwrap();
    }
    // Freed on this thread's stream: goes back to the other thread's arena (after a sync).
    free_on(&mr, e, 256, S1).unwrap();
    assert_eq!(mr.free_bytes(), 16 * MIB);
    // Superblocks stay with their arenas until a defragmentation.
    assert_eq!(mr.global_free_bytes(), 12 * MIB);
    mr.defragment().unwrap();
    assert_eq!(mr.global_free_bytes(), 16 * MIB);
    assert_eq!(
        mr.arena_count(),
        3,
        "the exited thread's empty arena is dropped"
    );
}

#[test]
fn freed_memory_is_reused_first_fit_on_the_same_stream() {
    let mr = arena(8 * MIB);
    let a = mr.allocate(1000, S1).unwrap();
    let b = mr.allocate(5000, S1).unwrap();
    assert_eq!(b, a + 1024);
    free_on(&mr, a, 1000, S1).unwrap();
    assert_eq!(
        mr.allocate(700, S1).unwrap(),
        a,
        "the hole at the lowest address"
    );
    assert_eq!(mr.allocate(1, S1).unwrap(), a + 768);
}

#[test]
fn large_requests_come_from_the_global_arena() {
    let mr = arena(8 * MIB);
    let small = mr.allocate(MIB, S1).unwrap();
    let big = mr.allocate(MIB + 1, S2).unwrap();
    assert_eq!(big, small + MIB);
    assert_eq!(mr.global_free_bytes(), 8 * MIB - MIB - (MIB + 256));
    assert_eq!(
        mr.arena_count(),
        1,
        "no arena for S2: the global arena served it"
    );
    // Freed on any stream, straight back to the global arena.
    free_on(&mr, big, MIB + 1, S1).unwrap();
    assert_eq!(mr.global_free_bytes(), 7 * MIB);
    free_on(&mr, small, MIB, S1).unwrap();
}

#[test]
fn exhaustion_is_no_room_in_arena_and_the_arena_works_afterwards() {
    let events = RecordingStreamEvents::new();
    let mr = ArenaMemoryResource::with_events(sim(64 * MIB), Some(4 * MIB), None, events.clone())
        .unwrap();
    // Four streams each hold a superblock; all of it is then freed but stays in the arenas.
    let ptrs: Vec<_> = (1..=4)
        .map(|i| {
            // SAFETY: a key only, on simulated memory.
            let s = unsafe { Stream::from_raw(0x1000 * i) };
            (mr.allocate(MIB / 2, s).unwrap(), s)
        })
        .collect();
    assert_eq!(mr.global_free_bytes(), 0);
    for &(p, s) in &ptrs {
        free_on(&mr, p, MIB / 2, s).unwrap();
    }
    // A large request needs the superblocks back: synchronize, defragment, retry.
    let big = mr.allocate(3 * MIB, S1).unwrap();
    assert!(events
        .log()
        .iter()
        .any(|c| matches!(c, EventCall::SynchronizeAll { .. })));
    let e = mr.allocate(2 * MIB, S2).unwrap_err();
    assert!(e.is_out_of_memory());
    let text = e.to_string();
    assert!(text.contains("No room in arena."), "{text}");
    assert!(text.contains(&(2 * MIB).to_string()), "{text}");
    free_on(&mr, big, 3 * MIB, S1).unwrap();
    let again = mr.allocate(2 * MIB, S2).unwrap();
    free_on(&mr, again, 2 * MIB, S2).unwrap();
    assert_eq!(mr.free_bytes(), 4 * MIB);
}

#[test]
fn bogus_double_and_missized_frees_are_logic_errors() {
    let mr = arena(8 * MIB);
    let p = mr.allocate(1000, S1).unwrap();
    let big = mr.allocate(2 * MIB, S1).unwrap();
    let logic = |r: Result<()>| matches!(r, Err(Error::Logic(_)));
    assert!(logic(free_on(&mr, p, 2000, S1)), "wrong size");
    assert!(
        logic(free_on(&mr, p, 2000, S2)),
        "wrong size, another arena"
    );
    assert!(logic(free_on(&mr, p + 256, 256, S1)), "inside a block");
    assert!(logic(free_on(&mr, 0x1234_5600, 256, S2)), "foreign");
    assert!(logic(free_on(&mr, big, MIB, S1)), "large block, small size");
    assert!(
        logic(free_on(&mr, big, 3 * MIB, S1)),
        "large block, wrong size"
    );
    assert!(logic(free_on(&mr, p, 0, S1)));
    free_on(&mr, p, 1000, S1).unwrap();
    assert!(logic(free_on(&mr, p, 1000, S1)), "double free");
    assert!(
        logic(free_on(&mr, p, 1000, S2)),
        "double free, other stream"
    );
    free_on(&mr, big, 2 * MIB, S2).unwrap();
    assert!(logic(free_on(&mr, big, 2 * MIB, S2)));
    assert_eq!(mr.allocate(0, S1).unwrap(), 0);
    free_on(&mr, 0, 0, S1).unwrap();
    assert_eq!(mr.free_bytes(), 8 * MIB, "errors changed nothing");
}

#[test]
fn defragment_keeps_superblocks_freed_into_after_its_snapshot() {
    // Simulated directly on the arena's parts: an empty superblock whose latest free is newer
    // than the snapshot taken before the synchronisation is not returned.
    let mr = arena(8 * MIB);
    let p = mr.allocate(256, S1).unwrap();
    let arena = mr.arena_for(S1);
    let seq = arena.state.lock().seq();
    free_on(&mr, p, 256, S1).unwrap();
    assert!(arena.state.lock().take_idle(seq).is_empty());
    assert_eq!(arena.state.lock().take_idle(seq + 1).len(), 1);
}

#[test]
fn dump_on_failure_writes_global_ranges_and_superblocks() {
    let dir = std::env::temp_dir().join(format!("rrmm-arena-dump-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("dump.log");
    let _ = std::fs::remove_file(&path);
    let mr = ArenaMemoryResource::with_events(
        sim(64 * MIB),
        Some(2 * MIB),
        Some(path.clone()),
        Arc::new(NoStreamEvents),
    )
    .unwrap();
    assert_eq!(mr.dump_path(), Some(path.as_path()));
    let p = mr.allocate(300, S1).unwrap();
    assert!(mr.allocate(2 * MIB, S2).unwrap_err().is_out_of_memory());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(&format!(
        "Ran out of memory trying to allocate {} bytes.",
        2 * MIB
    )));
    assert!(
        text.contains(&format!("Arena size: {} bytes", 2 * MIB)),
        "{text}"
    );
    assert!(text.contains("Free range 0:"), "{text}");
    assert!(
        text.contains("per-stream arena (stream 0x1000): 1 superblocks"),
        "{text}"
    );
    assert!(text.contains("Superblock 0:"), "{text}");
    free_on(&mr, p, 300, S1).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    // Without the flag: no dump path.
    assert_eq!(arena(2 * MIB).dump_path(), None);
}

#[test]
fn footprint_counts_free_bytes_everywhere() {
    let mr = arena(8 * MIB);
    let p = mr.allocate(MIB / 4, S1).unwrap();
    let fp = mr.report().unwrap().footprint();
    assert_eq!(fp.held_bytes, 8 * MIB);
    assert_eq!(fp.free_bytes, 8 * MIB - MIB / 4);
    assert_eq!(fp.largest_free_block, 7 * MIB);
    assert_eq!(fp.free_blocks, 2);
    assert_eq!(mr.memory_info(), Some((8 * MIB - MIB / 4, 8 * MIB)));
    free_on(&mr, p, MIB / 4, S1).unwrap();
}

#[test]
fn many_threads_on_ptds_and_shared_streams() {
    let mr = arena(64 * MIB);
    std::thread::scope(|scope| {
        for t in 0..8usize {
            let mr = mr.clone();
            scope.spawn(move || {
                let stream = if t % 2 == 0 {
                    Stream::PER_THREAD
                } else {
                    // SAFETY: a key only, on simulated memory.
                    unsafe { Stream::from_raw(0x1000 + 0x100 * (t % 3)) }
                };
                let mut live = Vec::new();
                for i in 0..2000usize {
                    let n = 256 + (i * 7919 + t * 104_729) % (256 << 10);
                    if live.len() < 16 && (i % 3 != 0 || live.is_empty()) {
                        live.push((mr.allocate(n, stream).unwrap(), n));
                    } else {
                        let (p, n) = live.swap_remove(i % live.len());
                        free_on(&mr, p, n, stream).unwrap();
                    }
                }
                for (p, n) in live {
                    free_on(&mr, p, n, stream).unwrap();
                }
            });
        }
    });
    assert_eq!(mr.free_bytes(), 64 * MIB);
    mr.defragment().unwrap();
    assert_eq!(mr.global_free_bytes(), 64 * MIB);
}

fn recorded(size: usize) -> (ArenaMemoryResource, Arc<RecordingStreamEvents>) {
    let events = RecordingStreamEvents::new();
    let mr =
        ArenaMemoryResource::with_events(sim(4 * size), Some(size), None, events.clone()).unwrap();
    (mr, events)
}

#[test]
fn default_streams_reuse_large_blocks_with_no_event_call() {
    let (mr, events) = recorded(16 * MIB);
    let a = mr.allocate(3 * MIB, Stream::DEFAULT).unwrap();
    free_on(&mr, a, 3 * MIB, Stream::DEFAULT).unwrap();
    let b = mr.allocate(3 * MIB, Stream::PER_THREAD).unwrap();
    free_on(&mr, b, 3 * MIB, Stream::PER_THREAD).unwrap();
    let c = mr.allocate(2 * MIB, Stream::LEGACY).unwrap();
    // This thread's arena takes a superblock: for both default streams, each ordered after the
    // pending legacy and this thread's PTDS frees.
    let d = mr.allocate(256, Stream::PER_THREAD).unwrap();
    assert_eq!((a, b, c), (a, a, a), "the same range each time");
    assert_ne!(d, a);
    assert_eq!(events.log(), vec![], "no CUDA call on the default streams");
    free_on(&mr, c, 2 * MIB, Stream::DEFAULT).unwrap();
    free_on(&mr, d, 256, Stream::DEFAULT).unwrap();
}

#[test]
fn a_range_freed_on_a_default_stream_reaches_another_stream_after_an_event_wait() {
    let (mr, events) = recorded(16 * MIB);
    let legacy = StreamKey::of(Stream::DEFAULT);
    let (ptds, s1) = (StreamKey::of(Stream::PER_THREAD), StreamKey::of(S1));
    let a = mr.allocate(3 * MIB, Stream::DEFAULT).unwrap();
    let freed = events.tick();
    free_on(&mr, a, 3 * MIB, Stream::DEFAULT).unwrap();
    let b = mr.allocate(3 * MIB, S1).unwrap();
    assert_eq!(b, a);
    let log = events.log();
    assert!(
        matches!(log.as_slice(), [EventCall::Record { stream: r, id, seq }, EventCall::Wait { stream: w, id: wid, .. }]
            if *r == legacy && *w == s1 && id == wid && *seq > freed),
        "{log:?}"
    );
    // Freed on S1: synchronized on the host at once, never pending.
    free_on(&mr, b, 3 * MIB, S1).unwrap();
    // The legacy free stays pending: S2's superblock waits too, and so does S1's again after
    // a free on this thread's PTDS, which is waited on as well.
    let c = mr.allocate(256, S2).unwrap();
    let d = mr.allocate(2 * MIB, Stream::PER_THREAD).unwrap();
    free_on(&mr, d, 2 * MIB, Stream::PER_THREAD).unwrap();
    let e = mr.allocate(2 * MIB, S1).unwrap();
    let log = events.log();
    let calls: Vec<(char, StreamKey)> = log[2..]
        .iter()
        .map(|c| match *c {
            EventCall::Record { stream, .. } => ('r', stream),
            EventCall::Wait { stream, .. } => ('w', stream),
            EventCall::SynchronizeAll { .. } => ('s', legacy),
        })
        .collect();
    let s2 = StreamKey::of(S2);
    assert_eq!(
        calls,
        vec![
            ('r', legacy),
            ('w', s2),
            ('r', legacy),
            ('w', s1),
            ('r', ptds),
            ('w', s1)
        ]
    );
    free_on(&mr, c, 256, S2).unwrap();
    free_on(&mr, e, 2 * MIB, S1).unwrap();
}

#[test]
fn another_threads_ptds_frees_are_covered_by_synchronizing_every_stream() {
    let (mr, events) = recorded(16 * MIB);
    let freed = std::thread::spawn({
        let (mr, events) = (mr.clone(), events.clone());
        move || {
            let p = mr.allocate(4 * MIB, Stream::PER_THREAD).unwrap();
            let t = events.tick();
            free_on(&mr, p, 4 * MIB, Stream::PER_THREAD).unwrap();
            t
        }
    })
    .join()
    .unwrap();
    // The legacy stream is ordered after every PTDS: no call.
    let a = mr.allocate(4 * MIB, Stream::DEFAULT).unwrap();
    assert!(events.log().is_empty());
    free_on(&mr, a, 4 * MIB, Stream::DEFAULT).unwrap();
    // This thread's PTDS is not, and no thread but the freeing one may record on its PTDS.
    let b = mr.allocate(4 * MIB, Stream::PER_THREAD).unwrap();
    let log = events.log();
    assert!(
        matches!(log.as_slice(), [EventCall::SynchronizeAll { seq }] if *seq > freed),
        "{log:?}"
    );
    free_on(&mr, b, 4 * MIB, Stream::PER_THREAD).unwrap();
    // The synchronisation cleared the other thread's PTDS; this thread's is ordered.
    let c = mr.allocate(4 * MIB, Stream::PER_THREAD).unwrap();
    assert_eq!(events.log().len(), 1);
    free_on(&mr, c, 4 * MIB, Stream::PER_THREAD).unwrap();
}

#[test]
fn defragment_clears_the_pending_streams_it_synchronized() {
    let (mr, events) = recorded(16 * MIB);
    std::thread::spawn({
        let mr = mr.clone();
        move || {
            let p = mr.allocate(4 * MIB, Stream::PER_THREAD).unwrap();
            free_on(&mr, p, 4 * MIB, Stream::PER_THREAD).unwrap();
        }
    })
    .join()
    .unwrap();
    mr.defragment().unwrap();
    let p = mr.allocate(4 * MIB, Stream::PER_THREAD).unwrap();
    let q = mr.allocate(256, Stream::PER_THREAD).unwrap();
    assert!(
        matches!(events.log().as_slice(), [EventCall::SynchronizeAll { .. }]),
        "only the defragmentation's: {:?}",
        events.log()
    );
    free_on(&mr, p, 4 * MIB, Stream::PER_THREAD).unwrap();
    free_on(&mr, q, 256, Stream::PER_THREAD).unwrap();
}

/// Stream events that fail every call.
#[derive(Debug)]
struct FailingEvents;

impl StreamEvents for FailingEvents {
    fn make_wait(&self, _waiter: StreamKey, _owner: StreamKey) -> Result<()> {
        Err(Error::Logic("make_wait failed".into()))
    }
    fn record_after_free(&self, _owner: StreamKey) -> Result<()> {
        Err(Error::Logic("record failed".into()))
    }
    fn synchronize_all(&self) -> Result<()> {
        Err(Error::Logic("synchronize failed".into()))
    }
}

#[test]
fn a_failed_wait_gives_the_range_back() {
    let mr = ArenaMemoryResource::with_events(
        sim(64 * MIB),
        Some(8 * MIB),
        None,
        Arc::new(FailingEvents),
    )
    .unwrap();
    let a = mr.allocate(2 * MIB, Stream::DEFAULT).unwrap();
    free_on(&mr, a, 2 * MIB, Stream::DEFAULT).unwrap();
    let e = mr.allocate(2 * MIB, S1).unwrap_err();
    assert_eq!(e, Error::Logic("record failed".into()));
    assert!(mr.allocate(256, S2).is_err(), "a superblock for S2 too");
    assert_eq!(mr.global_free_bytes(), 8 * MIB, "both ranges given back");
    assert_eq!(mr.arena_count(), 1, "S2's arena exists, and holds nothing");
    assert_eq!(mr.free_bytes(), 8 * MIB);
    // The default streams need no call: they still work.
    let b = mr.allocate(2 * MIB, Stream::PER_THREAD).unwrap();
    free_on(&mr, b, 2 * MIB, Stream::PER_THREAD).unwrap();
}
