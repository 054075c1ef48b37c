//! Which frees into the global arena a range handed out of it must be ordered after, and how.
//!
//! A large block freed on the legacy default stream or on a per-thread default stream goes back
//! to the global arena at once, with no CUDA call: the global arena notes the freeing stream as
//! *pending* ([`PendingFrees::note`]). A range handed out later is for some streams (its
//! *users*: the stream of a large block, or both default streams of the thread whose arena takes
//! a superblock, or the one stream of a stream's arena). For every pending stream, either every
//! user is already ordered after it by CUDA's implicit synchronisation ([`ordered_after`]), or
//! [`PendingFrees::plan`] says what makes it so: an event recorded on the pending stream and
//! waited on by the users (a stream the calling thread may enqueue on), or a host
//! synchronisation of every stream (another thread's per-thread default stream, on which this
//! thread cannot record). Only a host synchronisation clears a pending stream
//! ([`PendingFrees::clear_through`]); the default streams are never destroyed, so recording on
//! a pending one later is safe.
//!
//! Pure bookkeeping: no CUDA calls, no `unsafe`; the resource makes the calls a plan lists.

use crate::suballocator::core::StreamKey;

/// Whether work enqueued on `user` from now on runs after all work enqueued so far on
/// `pending`, with no event: the same stream; or a default stream after the legacy default
/// stream; or the legacy default stream after a per-thread default stream (both are blocking
/// streams: work on the legacy default stream waits for all earlier work on blocking streams,
/// and work on a blocking stream waits for all earlier work on the legacy default stream).
/// Whether an ordinary stream is blocking is not known here, so one is ordered only after
/// itself.
pub(super) fn ordered_after(user: StreamKey, pending: StreamKey) -> bool {
    let legacy = |k: StreamKey| k.stream().is_legacy_default();
    user == pending
        || (legacy(pending) && user.stream().is_default())
        || (pending.is_per_thread() && legacy(user))
}

/// Default streams with frees into the global arena that no host synchronisation has covered.
#[derive(Debug, Default)]
pub(super) struct PendingFrees {
    /// Each pending stream with the stamp of its latest free.
    streams: Vec<(StreamKey, u64)>,
    /// Stamps handed out so far.
    stamp: u64,
}

/// What must happen before a range reaches its users: nothing, event waits, or a host
/// synchronisation of every stream.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    /// (pending stream, user) pairs: record the pending stream's event, then make the user wait
    /// on it. Both are streams the calling thread may enqueue on.
    pub waits: Vec<(StreamKey, StreamKey)>,
    /// Synchronize every stream on the host (then the waits are moot).
    pub synchronize_all: bool,
    /// [`PendingFrees::stamp`] when the plan was made, for [`PendingFrees::clear_through`].
    pub stamp: u64,
}

impl Plan {
    /// Whether nothing needs doing.
    pub(super) fn is_empty(&self) -> bool {
        self.waits.is_empty() && !self.synchronize_all
    }
}

impl PendingFrees {
    /// Notes a free on `freer`, a default stream (legacy or per-thread).
    pub(super) fn note(&mut self, freer: StreamKey) {
        debug_assert!(freer.stream().is_default());
        self.stamp += 1;
        let stamp = self.stamp;
        match self.streams.iter_mut().find(|(k, _)| *k == freer) {
            Some(entry) => entry.1 = stamp,
            None => self.streams.push((freer, stamp)),
        }
    }

    /// The stamp of the latest free so far.
    pub(super) fn stamp(&self) -> u64 {
        self.stamp
    }

    /// Forgets the streams whose latest free came at or before `stamp`, after a host
    /// synchronisation of every stream that began once `stamp` was read.
    pub(super) fn clear_through(&mut self, stamp: u64) {
        self.streams.retain(|&(_, s)| s > stamp);
    }

    /// What orders `users` (streams of the calling thread) after every pending free.
    ///
    /// # Time Complexity
    /// O(pending streams x users).
    pub(super) fn plan(&self, users: &[StreamKey]) -> Plan {
        let mut plan = Plan {
            stamp: self.stamp,
            ..Plan::default()
        };
        for &(pending, _) in &self.streams {
            for &user in users {
                if ordered_after(user, pending) {
                    continue;
                }
                if !pending.is_reachable_here() {
                    plan.waits.clear();
                    plan.synchronize_all = true;
                    return plan;
                }
                plan.waits.push((pending, user));
            }
        }
        plan
    }
}

#[cfg(test)]
// Tests make fake stream keys, each with its SAFETY line.
#[allow(unsafe_code)]
mod tests {
    use super::*;
    use crate::cuda::Stream;

    fn legacy() -> StreamKey {
        StreamKey::of(Stream::DEFAULT)
    }

    fn ptds() -> StreamKey {
        StreamKey::of(Stream::PER_THREAD)
    }

    fn other_ptds() -> StreamKey {
        std::thread::spawn(ptds).join().unwrap()
    }

    fn stream(raw: usize) -> StreamKey {
        // SAFETY: a key only; no CUDA call is made with it.
        StreamKey::of(unsafe { Stream::from_raw(raw) })
    }

    #[test]
    fn implicit_order_between_default_and_blocking_streams() {
        let (l, p, q, s) = (legacy(), ptds(), other_ptds(), stream(0x1000));
        assert_eq!(StreamKey::of(Stream::LEGACY), l);
        for user in [l, p, q] {
            assert!(ordered_after(user, l), "any default stream after legacy");
        }
        assert!(ordered_after(l, p) && ordered_after(p, p) && ordered_after(l, q));
        assert!(!ordered_after(q, p), "two threads' PTDS are unordered");
        assert!(
            !ordered_after(s, l) && !ordered_after(s, p),
            "an ordinary stream"
        );
        assert!(ordered_after(s, s));
    }

    #[test]
    fn plans_wait_on_events_where_this_thread_can_record_else_synchronize_all() {
        let (l, p, q, s) = (legacy(), ptds(), other_ptds(), stream(0x1000));
        let mut pending = PendingFrees::default();
        assert!(pending.plan(&[s]).is_empty());
        pending.note(l);
        pending.note(p);
        assert!(pending.plan(&[l, p]).is_empty(), "this thread's arena");
        assert!(pending.plan(&[l]).is_empty());
        let plan = pending.plan(&[s]);
        assert_eq!(plan.waits, vec![(l, s), (p, s)]);
        assert!(!plan.synchronize_all);
        pending.note(q);
        assert!(pending.plan(&[l]).is_empty(), "legacy after every PTDS");
        let plan = pending.plan(&[l, p]);
        assert!(plan.synchronize_all && plan.waits.is_empty());
        assert_eq!(plan.stamp, 3);
    }

    #[test]
    fn clear_through_keeps_streams_freed_on_after_the_stamp() {
        let (l, p) = (legacy(), ptds());
        let mut pending = PendingFrees::default();
        pending.note(l);
        pending.note(p);
        let stamp = pending.stamp();
        pending.note(l);
        pending.clear_through(stamp);
        assert_eq!(pending.streams, vec![(l, 3)]);
        pending.clear_through(pending.stamp());
        assert!(pending.streams.is_empty());
    }
}
