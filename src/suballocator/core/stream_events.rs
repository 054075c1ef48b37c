//! Cross-stream ordering for the stream-ordered suballocators.
//!
//! The core (`stream_ordered.rs`) keeps one free list per stream. A block freed on stream A
//! may be handed to stream B only after B waits on an event recorded on A after the free. The
//! core asks for that ordering through [`StreamEvents`]; this module has the three answers: real
//! CUDA events ([`CudaStreamEvents`]), nothing at all for memory with no device behind it
//! ([`NoStreamEvents`]), and a log for tests ([`RecordingStreamEvents`]).
//!
//! # Per-thread default streams
//! `Stream::PER_THREAD` names a different stream on every thread, so free lists are keyed by
//! [`StreamKey`] = (stream, thread tag for PTDS). Another thread cannot record an event on a PTDS
//! of another thread (the handle would name its own PTDS). So for a PTDS owner on another
//! thread, [`StreamEvents::make_wait`] only waits on the owner's event as last recorded by the
//! owner thread itself through [`StreamEvents::record_after_free`]; the core calls it that way only
//! when that record came after the latest free into the list, and has the owner thread record
//! when another thread asked for it (see the core's docs). For the calling thread's own PTDS, or
//! any ordinary stream, the event is recorded at steal time. No path records an event unless
//! memory crosses streams.

use crate::cuda::{self, ContextGuard, Event, Stream};
use crate::error::Result;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A unique, never reused tag for the calling thread (1, 2, ...).
pub fn current_thread_tag() -> u64 {
    // Why process-wide: tags are unique in the process, so per-thread keys never collide.
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        // Why process-wide: the calling thread's tag, fixed for its life.
        static TAG: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    TAG.with(|t| *t)
}

/// The stream a free list belongs to: the stream handle, plus the thread for the per-thread
/// default stream (a different stream on every thread). The two legacy default handles (0 and
/// 0x1) are one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamKey {
    raw: usize,
    thread: u64,
}

impl StreamKey {
    /// The key of `stream` as used from the calling thread.
    #[inline]
    pub fn of(stream: Stream) -> StreamKey {
        if stream.is_per_thread_default() {
            StreamKey {
                raw: stream.raw(),
                thread: current_thread_tag(),
            }
        } else if stream.is_legacy_default() {
            StreamKey { raw: 0, thread: 0 }
        } else {
            StreamKey {
                raw: stream.raw(),
                thread: 0,
            }
        }
    }

    /// The stream handle (for PTDS: valid only on the thread [`StreamKey::thread`]).
    pub fn stream(self) -> Stream {
        // SAFETY: `raw` was taken from a `Stream` in `StreamKey::of`, whose maker vouched for
        // the handle; this gives the same handle back.
        #[allow(unsafe_code)]
        unsafe {
            Stream::from_raw(self.raw)
        }
    }

    /// The thread tag of a per-thread default stream; 0 for every other stream.
    pub fn thread(self) -> u64 {
        self.thread
    }

    /// Whether this is some thread's per-thread default stream.
    pub fn is_per_thread(self) -> bool {
        self.thread != 0
    }

    /// Whether this is the calling thread's per-thread default stream, or not a PTDS at all
    /// (that is: whether the calling thread may enqueue work on it).
    pub fn is_reachable_here(self) -> bool {
        self.thread == 0 || self.thread == current_thread_tag()
    }
}

/// How the stream-ordered core orders one stream after another.
///
/// Implementations are called with core locks held, in the order the core needs them
/// (`make_wait` under the shared lock and the owner list's lock, `record_after_free` under the
/// owner list's lock, `synchronize_all` under the shared lock); their own lock comes last in the
/// core's lock order.
pub trait StreamEvents: Send + Sync + std::fmt::Debug {
    /// Makes `waiter` wait (on the device) for the frees of memory now in `owner`'s free list:
    /// on `owner`'s event as last recorded by [`StreamEvents::record_after_free`], which the core
    /// asks for only when that record came after the list's latest free. Never records on
    /// `owner` (it may have been destroyed). Called on the thread that allocates on `waiter`.
    ///
    /// # Errors
    /// CUDA errors from the event calls.
    fn make_wait(&self, waiter: StreamKey, owner: StreamKey) -> Result<()>;

    /// Records `owner`'s event on the owner's thread, after frees into the list of the
    /// per-thread default stream `owner` that another thread wants (only for those); see the
    /// module docs.
    ///
    /// # Errors
    /// CUDA errors from the event calls.
    fn record_after_free(&self, owner: StreamKey) -> Result<()>;

    /// Waits on the host until all work on every stream is complete, after which every free
    /// list may be used by every stream.
    ///
    /// # Errors
    /// CUDA errors from the synchronisation.
    fn synchronize_all(&self) -> Result<()>;
}

/// Events for resources whose memory no device work can touch (simulated or host upstreams):
/// every call is a no-op.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoStreamEvents;

impl StreamEvents for NoStreamEvents {
    fn make_wait(&self, _waiter: StreamKey, _owner: StreamKey) -> Result<()> {
        Ok(())
    }
    fn record_after_free(&self, _owner: StreamKey) -> Result<()> {
        Ok(())
    }
    fn synchronize_all(&self) -> Result<()> {
        Ok(())
    }
}

/// Real CUDA events: one cached [`Event`] per owner stream, created the first time memory
/// leaves that stream, recorded on the owner and waited on by the waiter.
///
/// A stream is touched only by its own users' calls (`record_after_free`, from an allocate or
/// free on it): a stream destroyed after its frees is never recorded on, as in RMM, which
/// records at free time; waiting uses the last recorded event, or synchronizes the context.
/// Calls run in the primary context of the resource's device.
#[derive(Debug)]
pub struct CudaStreamEvents {
    device: Option<usize>,
    events: Mutex<HashMap<StreamKey, Event>>,
}

impl CudaStreamEvents {
    /// Events in the primary context of `device` (the current device's when `None`).
    pub fn new(device: Option<usize>) -> Self {
        CudaStreamEvents {
            device,
            events: Mutex::new(HashMap::new()),
        }
    }

    /// The device's primary context made current (for a resource with no device, such as
    /// pinned host memory: the current device's).
    fn context(&self) -> Result<ContextGuard> {
        let device = match self.device {
            Some(d) => d,
            None => cuda::current_device()?,
        };
        ContextGuard::new(device)
    }
}

/// The cached event of `owner`, created on first use.
fn event_of(events: &mut HashMap<StreamKey, Event>, owner: StreamKey) -> Result<&mut Event> {
    Ok(match events.entry(owner) {
        std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => v.insert(Event::new()?),
    })
}

impl StreamEvents for CudaStreamEvents {
    fn make_wait(&self, waiter: StreamKey, owner: StreamKey) -> Result<()> {
        let _ctx = self.context()?;
        let events = self.events.lock();
        // The owner's event was recorded by a user of the owner stream after the list's latest
        // free (the core asks only then); the owner stream itself is never touched here, as it
        // may have been destroyed since.
        match events.get(&owner) {
            Some(event) => event.wait_on(waiter.stream()),
            None => cuda::context_synchronize(),
        }
    }

    fn record_after_free(&self, owner: StreamKey) -> Result<()> {
        let _ctx = self.context()?;
        let mut events = self.events.lock();
        event_of(&mut events, owner)?.record(owner.stream())
    }

    fn synchronize_all(&self) -> Result<()> {
        let _ctx = self.context()?;
        cuda::context_synchronize()
    }
}

/// One call logged by [`RecordingStreamEvents`], with its place in the global order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventCall {
    /// Event `id` recorded on `stream` at sequence number `seq`.
    Record {
        /// The stream recorded on.
        stream: StreamKey,
        /// The event (one per owner stream, reused).
        id: u64,
        /// Global sequence number.
        seq: u64,
    },
    /// `stream` made to wait on event `id` at sequence number `seq`.
    Wait {
        /// The waiting stream.
        stream: StreamKey,
        /// The event waited on.
        id: u64,
        /// Global sequence number.
        seq: u64,
    },
    /// Host synchronisation of every stream at sequence number `seq`.
    SynchronizeAll {
        /// Global sequence number.
        seq: u64,
    },
}

/// A fake for tests: behaves like [`CudaStreamEvents`] (one event id per owner stream, the same
/// PTDS scheme) but only logs the calls, each with a global sequence number from
/// [`RecordingStreamEvents::tick`].
#[derive(Debug, Default)]
pub struct RecordingStreamEvents {
    state: Mutex<RecordingState>,
}

#[derive(Debug, Default)]
struct RecordingState {
    seq: u64,
    ids: HashMap<StreamKey, u64>,
    log: Vec<EventCall>,
}

impl RecordingState {
    fn next(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
    fn id(&mut self, owner: StreamKey) -> u64 {
        let n = self.ids.len() as u64 + 1;
        *self.ids.entry(owner).or_insert(n)
    }
}

impl RecordingStreamEvents {
    /// A new, empty log, shared so that the test keeps a handle while the resource owns one.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Takes the next global sequence number (tests mark their own frees and allocations
    /// with it, so they interleave with the logged calls).
    pub fn tick(&self) -> u64 {
        self.state.lock().next()
    }

    /// A copy of the log so far.
    pub fn log(&self) -> Vec<EventCall> {
        self.state.lock().log.clone()
    }

    /// Logs a call on `owner`'s event: `call` of the event's id and the next sequence number.
    fn push_for(&self, owner: StreamKey, call: impl FnOnce(u64, u64) -> EventCall) -> Result<()> {
        let mut s = self.state.lock();
        let id = s.id(owner);
        let seq = s.next();
        s.log.push(call(id, seq));
        Ok(())
    }
}

impl StreamEvents for RecordingStreamEvents {
    fn make_wait(&self, waiter: StreamKey, owner: StreamKey) -> Result<()> {
        self.push_for(owner, |id, seq| EventCall::Wait {
            stream: waiter,
            id,
            seq,
        })
    }

    fn record_after_free(&self, owner: StreamKey) -> Result<()> {
        self.push_for(owner, |id, seq| EventCall::Record {
            stream: owner,
            id,
            seq,
        })
    }

    fn synchronize_all(&self) -> Result<()> {
        let mut s = self.state.lock();
        let seq = s.next();
        s.log.push(EventCall::SynchronizeAll { seq });
        Ok(())
    }
}

#[cfg(test)]
// Tests call the unsafe `deallocate` and make fake stream keys, each with its SAFETY line.
#[allow(unsafe_code)]
mod tests {
    use super::*;

    #[test]
    fn keys_merge_legacy_handles_and_split_ptds_by_thread() {
        assert_eq!(
            StreamKey::of(Stream::DEFAULT),
            StreamKey::of(Stream::LEGACY)
        );
        let here = StreamKey::of(Stream::PER_THREAD);
        let there = std::thread::spawn(|| StreamKey::of(Stream::PER_THREAD))
            .join()
            .unwrap();
        assert_ne!(here, there);
        assert!(here.is_reachable_here() && !there.is_reachable_here());
        assert_eq!(here.stream(), Stream::PER_THREAD);
    }

    #[test]
    fn recording_fake_logs_record_then_wait_with_one_id_per_owner() {
        let ev = RecordingStreamEvents::new();
        // SAFETY: a key only: simulated memory never passes it to the driver.
        let a = StreamKey::of(unsafe { Stream::from_raw(0x1000) });
        // SAFETY: as above.
        let b = StreamKey::of(unsafe { Stream::from_raw(0x1001) });
        ev.record_after_free(a).unwrap();
        ev.make_wait(b, a).unwrap();
        ev.make_wait(b, a).unwrap();
        let log = ev.log();
        assert_eq!(log.len(), 3, "a wait never records on the owner: {log:?}");
        assert!(matches!(log[0], EventCall::Record { stream, id: 1, seq: 1 } if stream == a));
        assert!(matches!(log[1], EventCall::Wait { stream, id: 1, seq: 2 } if stream == b));
        assert!(matches!(log[2], EventCall::Wait { id: 1, .. }));
    }
}
