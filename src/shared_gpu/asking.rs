//! Asking the others for room when an allocation runs out ([`Member::ask_for`]): whom, by
//! [`super::rules`]; trims first, then sleeps; each wait with a deadline.

use super::answering::on_answering_thread;
use super::entry::Event;
use super::member::{AnswerFrom, Member};
use super::message::Message;
use super::publishing::now;
use super::rules::{self, Step};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Room asked beyond an allocation (a page of the expandable pool, what the driver keeps).
const SLACK: u64 = 64 << 20;
/// How long an ask waits for the trims' answers.
const TRIM_WAIT: Duration = Duration::from_secs(1);
/// How long an ask waits for a sleep beyond the copy at 2 GB/s.
const SLEEP_WAIT: Duration = Duration::from_secs(5);

/// What the others answered to one ask.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AskReport {
    /// Bytes the ask was for.
    pub bytes: u64,
    /// What was missing on the device when it began.
    pub shortfall: u64,
    /// Bytes given back by trims.
    pub trimmed: u64,
    /// Bytes freed by sleeps.
    pub slept: u64,
    /// The processes asked to trim, then to sleep.
    pub trim_asked: Vec<u32>,
    /// The processes asked to sleep.
    pub sleep_asked: Vec<u32>,
    /// Seconds from the start of the ask to its last answer.
    pub seconds: f64,
    /// Why nobody was asked, or not enough was given (may be empty).
    pub note: String,
}

impl Member {
    /// Sends `message` to process `pid`; whether it could be sent (false: the process is gone).
    pub(super) fn send(&self, pid: u32, message: &Message) -> bool {
        self.socket
            .send_to(&message.encode(), self.dir.socket_path(pid))
            .is_ok()
    }

    /// Sends one request to each of `pids` and waits up to `wait` for their answers; the
    /// bytes given by each that answered.
    pub(super) fn request(
        &self,
        pids: &[u32],
        make: impl Fn(u64) -> Message,
        wait: Duration,
    ) -> Vec<AnswerFrom> {
        let (tx, rx) = mpsc::channel();
        let mut ids = Vec::new();
        for &pid in pids {
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            self.pending.lock().insert(id, tx.clone());
            if self.send(pid, &make(id)) {
                ids.push(id);
            } else {
                self.pending.lock().remove(&id);
            }
        }
        drop(tx);
        let deadline = Instant::now() + wait;
        let mut answers = Vec::new();
        while answers.len() < ids.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(answer) => answers.push(answer),
                Err(_) => break,
            }
        }
        let mut pending = self.pending.lock();
        for id in ids {
            pending.remove(&id);
        }
        answers
    }

    /// Asks the other processes to make room for `bytes` more (see [`super::rules`]): trims
    /// first, then sleeps of idle processes above their share; what they gave.
    pub fn ask_for(&self, bytes: u64) -> AskReport {
        let started = Instant::now();
        let mut report = AskReport {
            bytes,
            ..AskReport::default()
        };
        if on_answering_thread() {
            report.note = "not asked from the thread that answers requests".into();
            return report;
        }
        self.waiting.store(bytes, Ordering::Relaxed);
        let listing = self.listing();
        let free = self.free_now(&listing);
        report.shortfall = bytes.saturating_add(SLACK).saturating_sub(free);
        let holders = self.holders(&listing);
        let plan = rules::plan(self.total, &holders, self.pid, report.shortfall);
        report.trim_asked = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Trim { pid, .. } => Some(*pid),
                Step::Sleep { .. } => None,
            })
            .collect();
        let me = self.pid;
        let give = |id| Message::Give {
            id,
            from: me,
            bytes: report.shortfall,
        };
        for (_, given, _) in self.request(&report.trim_asked, give, TRIM_WAIT) {
            report.trimmed += given;
        }
        if report.trimmed < report.shortfall && report.shortfall > 0 {
            // Entries are up to a moment old: whoever was not asked may have cached since.
            let rest: Vec<u32> = holders
                .iter()
                .map(|h| h.pid)
                .filter(|pid| *pid != me && !report.trim_asked.contains(pid))
                .collect();
            for (pid, given, _) in self.request(&rest, give, TRIM_WAIT) {
                if given > 0 {
                    report.trim_asked.push(pid);
                }
                report.trimmed += given;
            }
        }
        if plan.covers {
            for step in &plan.steps {
                let Step::Sleep { pid, bytes: holds } = *step else {
                    continue;
                };
                if report.trimmed + report.slept >= report.shortfall {
                    break;
                }
                report.sleep_asked.push(pid);
                let wait = SLEEP_WAIT + Duration::from_secs(holds / 2_000_000_000);
                let missing = report.shortfall - report.trimmed - report.slept;
                for (_, given, _) in self.request(
                    &[pid],
                    |id| Message::Sleep {
                        id,
                        from: me,
                        bytes: missing,
                    },
                    wait,
                ) {
                    report.slept += given;
                }
            }
        } else if report.shortfall > 0 {
            report.note = "the others' caches and idle processes above their share hold too \
                           little"
                .into();
        }
        if !listing.refused.is_empty() {
            report.note.push_str(&format!(
                "{}{} ledger file(s) refused",
                if report.note.is_empty() { "" } else { "; " },
                listing.refused.len()
            ));
        }
        report.seconds = started.elapsed().as_secs_f64();
        self.waiting.store(0, Ordering::Relaxed);
        self.record(Event {
            at: now(),
            kind: "asked".into(),
            peer: 0,
            bytes,
            given: report.trimmed + report.slept,
            seconds: report.seconds,
            note: report.note.clone(),
        });
        self.publish();
        report
    }
}
