//! Answering the others' requests: give back what the pools keep free, or sleep
//! ([`super::idle`]), and say how much.

use super::entry::Event;
use super::member::Member;
use super::message::Message;
use super::publishing::now;
use crate::pressure;
use std::sync::Arc;
use std::time::{Duration, Instant};

thread_local! {
    /// Whether this thread answers requests (it must never ask: it would wait for itself).
    // Why process-wide: the answering thread is one of this process's, whichever ledger it
    // serves; the flag is per thread.
    static ANSWERING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks this thread as one that answers requests.
pub(super) fn mark_answering_thread() {
    ANSWERING.with(|a| a.set(true));
}

/// Whether this thread answers requests (it must never ask).
pub(super) fn on_answering_thread() -> bool {
    ANSWERING.with(std::cell::Cell::get)
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

    /// Handles one datagram.
    pub(super) fn handle(self: &Arc<Self>, bytes: &[u8]) {
        let Some(message) = Message::decode(bytes) else {
            return;
        };
        match message {
            Message::Answer {
                id,
                from,
                given,
                note,
            } => {
                if let Some(tx) = self.pending.lock().get(&id) {
                    let _ = tx.send((from, given, note));
                }
            }
            Message::Give { id, from, bytes } => {
                let started = Instant::now();
                let given = self.give();
                self.answer(from, id, given, String::new());
                self.record(Event {
                    at: now(),
                    kind: "gave".into(),
                    peer: from,
                    bytes,
                    given,
                    seconds: started.elapsed().as_secs_f64(),
                    note: String::new(),
                });
            }
            Message::Sleep { id, from, bytes } => {
                // A sleep copies at the link's speed: on its own thread, so answers to this
                // process's own asks keep flowing.
                let member = self.clone();
                let _ = std::thread::Builder::new()
                    .name("rrmm-shared-gpu-sleep".into())
                    .spawn(move || {
                        mark_answering_thread();
                        let started = Instant::now();
                        let (given, note) = member.sleep_for();
                        member.answer(from, id, given, note.clone());
                        member.record(Event {
                            at: now(),
                            kind: if given > 0 { "slept" } else { "declined" }.into(),
                            peer: from,
                            bytes,
                            given,
                            seconds: started.elapsed().as_secs_f64(),
                            note,
                        });
                        member.publish();
                    });
            }
        }
    }

    pub(super) fn answer(&self, to: u32, id: u64, given: u64, note: String) {
        let note: String = note.chars().take(400).collect();
        self.send(
            to,
            &Message::Answer {
                id,
                from: self.pid,
                given,
                note,
            },
        );
    }
}
