//! The listener thread: receives datagrams on the member's socket and routes them, and keeps
//! the entry written. It only receives and routes: answers to this process's asks go to the
//! asker that waits for them ([`super::pending`], judged there), requests go to the worker
//! ([`super::answering`]), or are declined at once when its queue is full. So a flood of
//! requests costs no thread, and answers keep flowing while the worker sleeps a pool.

use super::answering::{self, mark_answering_thread, Queue, Request};
use super::entry::{now, Event};
use super::member::Member;
use super::message::{Message, MAX_MESSAGE};
use super::pending::{Judge, Routed};
use super::process;
use super::publishing::PUBLISH_EVERY;
use super::socket::Received;
use super::trust::{Asked, Holding};
use crate::error::{Error, Result};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How long the listener waits for a datagram before it looks at the member again (whether
/// it left, whether its entry is due).
const RECEIVE_WAIT: Duration = Duration::from_millis(50);
/// The least time between two writes of the entry for a change (a flood of requests writes
/// it at most this often).
const WRITE_AT_MOST_EVERY: Duration = Duration::from_millis(20);

/// Starts the listener and the worker of `member`.
///
/// # Errors
/// [`Error::Logic`] when a thread cannot start.
pub(super) fn spawn(member: &Arc<Member>) -> Result<()> {
    let no_thread = |e: std::io::Error| Error::Logic(format!("shared GPU ledger: no thread: {e}"));
    let (queue, worker) = answering::spawn_worker(Arc::downgrade(member)).map_err(no_thread)?;
    let weak = Arc::downgrade(member);
    let listener = std::thread::Builder::new()
        .name("rrmm-shared-gpu".into())
        .spawn(move || listen(&weak, &queue))
        .map_err(no_thread)?;
    member.threads.lock().extend([listener, worker]);
    Ok(())
}

/// The listener: routes datagrams until the member leaves or drops; writes the entry when
/// something changed, and every [`PUBLISH_EVERY`] regardless.
fn listen(member: &Weak<Member>, queue: &Queue) {
    mark_answering_thread();
    let mut last_read = Instant::now();
    let mut last_write = Instant::now();
    loop {
        let Some(m) = member.upgrade() else {
            return;
        };
        if m.stopped() {
            return;
        }
        match m.socket.receive(MAX_MESSAGE, RECEIVE_WAIT) {
            Ok(Some(datagram)) => m.route(datagram, queue),
            Ok(None) => {}
            // Never a busy loop on a broken socket.
            Err(_) => std::thread::sleep(RECEIVE_WAIT),
        }
        let due = last_read.elapsed() >= PUBLISH_EVERY;
        if due
            || (m.dirty.load(std::sync::atomic::Ordering::Acquire)
                && last_write.elapsed() >= WRITE_AT_MOST_EVERY)
        {
            m.publish();
            last_write = Instant::now();
        }
        if due {
            m.read_others();
            last_read = Instant::now();
        }
    }
}

impl Member {
    /// Routes one datagram: an answer to its asker, a request to the worker (declined at once
    /// when the worker's queue is full); anything else is dropped.
    fn route(&self, datagram: Received, queue: &Queue) {
        let Some(message) = Message::decode(&datagram.bytes) else {
            return;
        };
        let sender = datagram.sender;
        let (asked, id, from, bytes) = match message {
            Message::Answer {
                id, given, note, ..
            } => {
                let holding_now = |asked: &process::Identity| {
                    self.dir
                        .entry_of(asked.pid, asked.pid_ns, self.total)
                        .ok()
                        .map(|e| Holding::from(&e))
                };
                let judge = Judge {
                    me: self.me,
                    uid: self.uid,
                    total: self.total,
                    seen: &process::seen_from_here,
                    holding_now: &holding_now,
                };
                if let Routed::Refused { peer, why } =
                    self.pending.route(id, given, &note, sender, &judge)
                {
                    self.record(Event {
                        at: now(),
                        kind: "refused".into(),
                        peer,
                        bytes: 0,
                        given: 0,
                        seconds: 0.0,
                        note: why,
                    });
                }
                return;
            }
            Message::Give { id, from, bytes } => (Asked::Give, id, from, bytes),
            Message::Sleep { id, from, bytes } => (Asked::Sleep, id, from, bytes),
        };
        // An answer goes where the request came from: a sender that cannot be answered is not.
        let Some(reply_to) = datagram.reply_to else {
            return;
        };
        let request = Request {
            asked,
            id,
            peer: sender.map(|s| s.pid).filter(|&p| p != 0).unwrap_or(from),
            bytes,
            reply_to,
        };
        if let Err(request) = queue.offer(request) {
            self.decline_busy(&request);
        }
    }
}
