//! The requests this process waits on, and which of their answers count.
//!
//! Each request gets an id and remembers whom it asked (the entry's identity), what it asked
//! and what that process's entry showed before; an answer is matched by id and judged by
//! [`super::trust`]: the sender must be the process asked, and it counts at most what its
//! entry shows it gave. A refused answer is reported to be recorded; an answer to a request
//! never made is refused; a late one (its asker stopped waiting) is dropped.

use super::process::Identity;
use super::socket::Credentials;
use super::trust::{self, Asked, Holding};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;

/// An answer as the asker counts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answered {
    /// The request's id.
    pub id: u64,
    /// The process asked (its pid in its namespace).
    pub pid: u32,
    /// The bytes that count.
    pub bytes: u64,
    /// The bytes it claimed (more than count where its entry, written every quarter second,
    /// does not show them yet): worth another try of the allocation, never counted.
    pub claimed: u64,
    /// Its note, and why less than claimed counts (may be empty).
    pub note: String,
}

/// What became of an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Routed {
    /// It went to its asker (possibly counting less than it claimed).
    Delivered,
    /// Its asker no longer waits (past the deadline, or answered already).
    Late,
    /// Not believed: `why`, for the history, naming the sender as the kernel knows it (`peer`).
    Refused {
        /// The sender's pid as this process sees it (0: unknown).
        peer: u32,
        /// Why.
        why: String,
    },
}

/// What judging an answer needs from the world.
pub struct Judge<'a> {
    /// This process.
    pub me: Identity,
    /// Its user.
    pub uid: u32,
    /// The device's bytes.
    pub total: u64,
    /// A sender, named by its pid in this namespace, as `/proc` shows it.
    pub seen: &'a dyn Fn(u32) -> Option<Identity>,
    /// What the entry of a process shows now (`None`: unreadable or gone).
    pub holding_now: &'a dyn Fn(&Identity) -> Option<Holding>,
}

struct Waiting {
    asked: Identity,
    kind: Asked,
    before: Holding,
    to: mpsc::Sender<Answered>,
}

/// The requests waiting for an answer.
pub struct Pending {
    first: u64,
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, Waiting>>,
}

impl Pending {
    /// No request yet; ids start at a number drawn from `seed` (answers to ids never given
    /// are told apart).
    pub fn new(seed: u64) -> Pending {
        let first = 1 + seed % (1 << 48);
        Pending {
            first,
            next: AtomicU64::new(first),
            waiting: Mutex::new(HashMap::new()),
        }
    }

    /// A new request to `asked`, whose entry showed `before`; its answer goes to `to`. Its id.
    pub fn open(
        &self,
        asked: Identity,
        kind: Asked,
        before: Holding,
        to: mpsc::Sender<Answered>,
    ) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.waiting.lock().insert(
            id,
            Waiting {
                asked,
                kind,
                before,
                to,
            },
        );
        id
    }

    /// Stops waiting for request `id`.
    pub fn close(&self, id: u64) {
        self.waiting.lock().remove(&id);
    }

    /// Whether no request waits.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.waiting.lock().is_empty()
    }

    /// Judges an answer to request `id` claiming `claimed` bytes (with `note`), sent by
    /// `sender`, and hands it to its asker when it is believed.
    pub fn route(
        &self,
        id: u64,
        claimed: u64,
        note: &str,
        sender: Option<Credentials>,
        judge: &Judge<'_>,
    ) -> Routed {
        let peer = sender.map_or(0, |s| s.pid);
        let Some((asked, kind, before)) = self
            .waiting
            .lock()
            .get(&id)
            .map(|w| (w.asked, w.kind, w.before))
        else {
            return if (self.first..self.next.load(Ordering::Relaxed)).contains(&id) {
                Routed::Late
            } else {
                Routed::Refused {
                    peer,
                    why: format!("an answer to request {id}, which this process never made"),
                }
            };
        };
        // The checks read files: outside the lock.
        let seen = sender.and_then(|s| (judge.seen)(s.pid));
        if let Err(why) = trust::sender(&asked, &judge.me, judge.uid, sender, seen) {
            return Routed::Refused {
                peer,
                why: format!("an answer to request {id}: {why}"),
            };
        }
        let after = (judge.holding_now)(&asked);
        let counted = trust::counted(kind, claimed, before, after, judge.total);
        let Some(waiting) = self.waiting.lock().remove(&id) else {
            return Routed::Late;
        };
        let note = [note, &counted.note]
            .into_iter()
            .filter(|n| !n.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        let _ = waiting.to.send(Answered {
            id,
            pid: asked.pid,
            bytes: counted.bytes,
            claimed: if counted.refused.is_some() {
                0
            } else {
                claimed
            },
            note,
        });
        match counted.refused {
            Some(why) => Routed::Refused {
                peer,
                why: format!("an answer to request {id}: {why}"),
            },
            None => Routed::Delivered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Identity = Identity::new(10, 1, 1);
    const PEER: Identity = Identity::new(11, 1, 2);
    const BEFORE: Holding = Holding {
        live: 0,
        cached: 500,
        asleep: 0,
    };

    fn creds(pid: u32) -> Option<Credentials> {
        Some(Credentials { pid, uid: 0 })
    }

    fn route(pending: &Pending, id: u64, claimed: u64, from: u32, cached_after: u64) -> Routed {
        let seen = |pid: u32| Some(Identity { pid, ..PEER });
        let now = move |_: &Identity| {
            Some(Holding {
                cached: cached_after,
                ..BEFORE
            })
        };
        let judge = Judge {
            me: ME,
            uid: 0,
            total: 1000,
            seen: &seen,
            holding_now: &now,
        };
        pending.route(id, claimed, "", creds(from), &judge)
    }

    /// A table seeded with `seed` and one request of kind `asked` open to `PEER`: the table,
    /// where the request's answer arrives, and its id.
    fn one_open(seed: u64, asked: Asked) -> (Pending, mpsc::Receiver<Answered>, u64) {
        let pending = Pending::new(seed);
        let (tx, rx) = mpsc::channel();
        let id = pending.open(PEER, asked, BEFORE, tx);
        (pending, rx, id)
    }

    #[test]
    fn answers_go_to_their_asker_only_from_the_process_asked() {
        let (pending, rx, id) = one_open(41, Asked::Give);
        // Another process answering with the right id: refused, the request still waits.
        assert!(matches!(
            route(&pending, id, 500, 12, 0),
            Routed::Refused { peer: 12, .. }
        ));
        assert!(rx.try_recv().is_err());
        // An id never given.
        let Routed::Refused { why, .. } = route(&pending, id + 100, 1, 11, 0) else {
            panic!("believed");
        };
        assert!(why.contains("never made"), "{why}");
        // The process asked: counted as its entry shows (300 of 500 claimed).
        assert_eq!(route(&pending, id, 500, 11, 200), Routed::Delivered);
        let answer = rx.try_recv().unwrap();
        assert_eq!((answer.pid, answer.bytes), (11, 300));
        assert!(answer.note.contains("shows 300"));
        // Answered already: late, dropped.
        assert_eq!(route(&pending, id, 500, 11, 0), Routed::Late);
        assert!(pending.is_empty());
    }

    #[test]
    fn an_absurd_claim_is_refused_and_ends_the_wait_with_nothing() {
        let (pending, rx, id) = one_open(0, Asked::Sleep);
        assert!(matches!(
            route(&pending, id, 1 << 63, 11, 0),
            Routed::Refused { .. }
        ));
        assert_eq!(rx.try_recv().unwrap().bytes, 0);
        let id = pending.open(PEER, Asked::Give, BEFORE, mpsc::channel().0);
        pending.close(id);
        assert_eq!(route(&pending, id, 1, 11, 0), Routed::Late);
    }
}
