//! Answering the others' requests, on one worker thread per member whatever arrives: the
//! listener ([`super::listener`]) hands each request to it through a bounded queue
//! ([`Queue`], [`QUEUE`] requests); when the queue is full, the request is answered at once
//! with nothing given and a note that says so ("busy"), never with a new thread. A request to
//! give back cached memory relieves the pools; one to sleep is [`Member::sleep_for`]. The
//! entry is written before the answer is sent: the asker counts at most what it shows
//! ([`super::trust`]).

use super::entry::{now, Event};
use super::member::Member;
use super::message::Message;
use super::trust::Asked;
use crate::pressure;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Weak;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The most requests that wait for the worker; past them a request is declined at once.
pub const QUEUE: usize = 8;
/// How long the worker waits for a request before it looks whether the member left.
const IDLE_CHECK: Duration = Duration::from_millis(50);
/// The longest note an answer carries.
const MAX_NOTE: usize = 400;

thread_local! {
    /// Whether this thread answers requests (it must never ask: it would wait for itself).
    // Why process-wide: the answering threads are this process's, whichever ledger they
    // serve; the flag is per thread.
    static ANSWERING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks this thread as one that answers requests (the listener, the worker).
pub(super) fn mark_answering_thread() {
    ANSWERING.with(|a| a.set(true));
}

/// Whether this thread answers requests (it must never ask).
pub(super) fn on_answering_thread() -> bool {
    ANSWERING.with(std::cell::Cell::get)
}

/// A request of another process, to answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// What it asks.
    pub asked: Asked,
    /// Its id (the answer carries it).
    pub id: u64,
    /// The asking process, as the kernel names it here (else as it names itself).
    pub peer: u32,
    /// What it is short of.
    pub bytes: u64,
    /// Where the answer goes: the asker's socket.
    pub reply_to: PathBuf,
}

/// The listener's end of the worker's queue.
#[derive(Debug)]
pub struct Queue(SyncSender<Request>);

impl Queue {
    /// A queue of at most `bound` requests, and the worker's end of it.
    pub fn bounded(bound: usize) -> (Queue, Receiver<Request>) {
        let (tx, rx) = mpsc::sync_channel(bound);
        (Queue(tx), rx)
    }

    /// Hands `request` to the worker without waiting; gives it back when the queue is full
    /// (or the worker is gone).
    ///
    /// # Errors
    /// The request, to decline.
    pub fn offer(&self, request: Request) -> Result<(), Request> {
        self.0.try_send(request).map_err(|e| match e {
            TrySendError::Full(r) | TrySendError::Disconnected(r) => r,
        })
    }
}

/// Starts the worker of `member`: its thread and the queue that feeds it.
///
/// # Errors
/// The error of the thread's start.
pub(super) fn spawn_worker(member: Weak<Member>) -> std::io::Result<(Queue, JoinHandle<()>)> {
    let (queue, requests) = Queue::bounded(QUEUE);
    let worker = std::thread::Builder::new()
        .name("rrmm-shared-gpu-worker".into())
        .spawn(move || work(&member, &requests))?;
    Ok((queue, worker))
}

/// The worker: answers requests one at a time until the member leaves or drops (or the
/// listener, which feeds it, stops).
fn work(member: &Weak<Member>, requests: &Receiver<Request>) {
    mark_answering_thread();
    loop {
        match requests.recv_timeout(IDLE_CHECK) {
            Ok(request) => {
                let Some(m) = member.upgrade() else {
                    return;
                };
                if m.stopped() {
                    return;
                }
                m.serve(&request);
            }
            Err(RecvTimeoutError::Timeout) => {
                if member.upgrade().map_or(true, |m| m.stopped()) {
                    return;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

impl Member {
    /// Answers a request to give back cached memory: relieves the process's pools (retrying
    /// briefly while one is busy); the bytes given.
    pub(super) fn give(&self) -> u64 {
        let mut given = 0;
        for _ in 0..5 {
            given += pressure::relieve(self.place) as u64;
            if given > 0 || pressure::figures(self.place).cached == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        given
    }

    /// Answers `request` (the worker): gives or sleeps, writes the entry, answers, records.
    pub(super) fn serve(&self, request: &Request) {
        let started = Instant::now();
        let (given, note) = match request.asked {
            Asked::Give => (self.give(), String::new()),
            Asked::Sleep => self.sleep_for(),
        };
        // Before the answer: the asker counts at most what this entry shows.
        self.publish();
        let note = self.reply(request, given, note);
        let kind = match request.asked {
            Asked::Give => "gave",
            Asked::Sleep if given > 0 => "slept",
            Asked::Sleep => "declined",
        };
        self.record(Event {
            at: now(),
            kind: kind.into(),
            peer: request.peer,
            bytes: request.bytes,
            given,
            seconds: started.elapsed().as_secs_f64(),
            note,
        });
    }

    /// Declines `request` at once, the worker's queue being full (the listener).
    pub(super) fn decline_busy(&self, request: &Request) {
        let note = format!("busy: {QUEUE} requests already wait for this process's worker");
        let note = self.reply(request, 0, note);
        self.record(Event {
            at: now(),
            kind: "declined".into(),
            peer: request.peer,
            bytes: request.bytes,
            given: 0,
            seconds: 0.0,
            note,
        });
    }

    /// Sends the answer to `request` without waiting; `note`, and why the answer could not be
    /// sent where it could not.
    fn reply(&self, request: &Request, given: u64, note: String) -> String {
        let answer = Message::Answer {
            id: request.id,
            from: self.me.pid,
            given,
            note: note.chars().take(MAX_NOTE).collect(),
        };
        match self.socket.send_to(&answer.encode(), &request.reply_to) {
            Ok(()) => note,
            Err(e) => {
                let unsent = format!("the answer was not sent: {e}");
                if note.is_empty() {
                    unsent
                } else {
                    format!("{note}; {unsent}")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: u64) -> Request {
        Request {
            asked: Asked::Sleep,
            id,
            peer: 1,
            bytes: 2,
            reply_to: PathBuf::from("/nowhere"),
        }
    }

    #[test]
    fn the_queue_holds_its_bound_and_gives_back_the_rest() {
        let (queue, requests) = Queue::bounded(QUEUE);
        for id in 0..QUEUE as u64 {
            assert!(queue.offer(request(id)).is_ok());
        }
        assert_eq!(
            queue.offer(request(99)),
            Err(request(99)),
            "full: declined, not queued"
        );
        assert_eq!(requests.recv().unwrap().id, 0);
        assert!(queue.offer(request(100)).is_ok(), "room again");
        drop(requests);
        assert_eq!(queue.offer(request(101)), Err(request(101)), "no worker");
    }
}
