//! Asking the others for room when an allocation runs out ([`Member::ask_for`]): whom, by
//! [`super::rules`]; trims first, then sleeps.
//!
//! Every wait has a deadline ([`TRIM_WAIT`]; a sleep's grows with what it copies), and a send
//! never waits ([`super::socket`]): a stopped, slow or dead process costs at most the deadline.
//! The report names who did not answer in time, or could not be reached. A process that did
//! not answer is not asked again until it writes its entry again (a stopped process writes
//! nothing), so the next asks do not wait for it. What each answer counts is judged where it
//! arrives ([`super::pending`]).

use super::answering::on_answering_thread;
use super::entry::{now, Entry, Event};
use super::member::Member;
use super::message::Message;
use super::pending::Answered;
use super::rules::{self, Holder, Step};
use super::socket::SendError;
use super::trust::{Asked, Holding};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Room asked beyond an allocation (a page of the expandable pool, what the driver keeps).
const SLACK: u64 = 64 << 20;
/// How long an ask waits for the trims' answers.
pub const TRIM_WAIT: Duration = Duration::from_secs(1);
/// How long an ask waits for a sleep beyond the copy at 2 GB/s.
const SLEEP_WAIT: Duration = Duration::from_secs(5);

/// What the others answered to one ask.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AskReport {
    /// Bytes the ask was for.
    pub bytes: u64,
    /// What was missing on the device when it began.
    pub shortfall: u64,
    /// Bytes given back by trims (as the answerers' entries show them; at most the device).
    pub trimmed: u64,
    /// Bytes freed by sleeps (likewise; trims and sleeps together at most the device).
    pub slept: u64,
    /// Bytes the believed answers claimed, counted or not (an answerer's entry written before
    /// its pool's cache grew shows less than it gave): a reason to try the allocation again,
    /// never a figure of what was given.
    pub claimed: u64,
    /// The processes asked to trim, then to sleep.
    pub trim_asked: Vec<u32>,
    /// The processes asked to sleep.
    pub sleep_asked: Vec<u32>,
    /// The processes that did not answer in time, could not be reached, or were not asked
    /// for they had not answered before (the note says which and the deadline).
    pub unanswered: Vec<u32>,
    /// Seconds from the start of the ask to its last answer.
    pub seconds: f64,
    /// Why nobody was asked, or not enough was given (may be empty).
    pub note: String,
}

/// What one round of requests came to.
#[derive(Default)]
struct Round {
    /// The answers believed (each counting what its entry shows).
    answers: Vec<Answered>,
    /// Who did not answer before the deadline.
    silent: Vec<u32>,
    /// Who could not be sent the request, and why.
    unreachable: Vec<(u32, String)>,
}

/// What an ask learns of who did not answer, and what the answers said, in words for its
/// note.
#[derive(Default)]
struct Unanswered {
    pids: Vec<u32>,
    words: Vec<String>,
    /// What the answers said (why less, or nothing, was given).
    answered: Vec<String>,
}

impl Unanswered {
    /// What `round`, a round of requests of kind `asked` that waited at most `wait`, left
    /// unanswered, in words: who did not answer and the deadline (a sleep not answered in time
    /// may still finish: the asker no longer counts it, and says so).
    fn add(&mut self, round: &Round, asked: Asked, wait: Duration) {
        for answer in round.answers.iter().filter(|a| !a.note.is_empty()) {
            self.answered
                .push(format!("pid {}: {}", answer.pid, answer.note));
        }
        if !round.silent.is_empty() {
            let what = match asked {
                Asked::Give => "to trim",
                Asked::Sleep => "to sleep",
            };
            let after = match asked {
                Asked::Give => "",
                Asked::Sleep => {
                    " (its sleep may still finish: what it frees is there for the next try, not \
                     counted here)"
                }
            };
            self.words.push(format!(
                "no answer {what} within the deadline of {:.1} s from {}{after}",
                wait.as_secs_f64(),
                pids(&round.silent)
            ));
        }
        for (pid, why) in &round.unreachable {
            self.words.push(format!("pid {pid} not reached: {why}"));
        }
        self.pids.extend(&round.silent);
        self.pids
            .extend(round.unreachable.iter().map(|(pid, _)| *pid));
    }
}

fn pids(pids: &[u32]) -> String {
    let list: Vec<String> = pids.iter().map(|p| format!("pid {p}")).collect();
    list.join(", ")
}

impl Member {
    /// Sends a request (`asked`, for `bytes`) to each of `targets` and waits up to `wait` for
    /// their answers.
    fn request(&self, targets: &[&Entry], asked: Asked, bytes: u64, wait: Duration) -> Round {
        let mut round = Round::default();
        let (tx, rx) = mpsc::channel();
        let mut open: Vec<(u64, &Entry)> = Vec::new();
        for &entry in targets {
            // What its entry shows right before the request: an answer counts at most the
            // drop from here.
            let before = self
                .dir
                .entry_of(entry.pid(), entry.pid_ns, self.total)
                .map_or_else(|_| Holding::from(entry), |now| Holding::from(&now));
            let id = self
                .pending
                .open(entry.identity(), asked, before, tx.clone());
            let (from, message) = (self.me.pid, bytes);
            let message = match asked {
                Asked::Give => Message::Give {
                    id,
                    from,
                    bytes: message,
                },
                Asked::Sleep => Message::Sleep {
                    id,
                    from,
                    bytes: message,
                },
            };
            let to = self.dir.socket_path(entry.pid(), entry.pid_ns);
            match self.socket.send_to(&message.encode(), &to) {
                Ok(()) => open.push((id, entry)),
                Err(e) => {
                    self.pending.close(id);
                    if matches!(e, SendError::Full) {
                        self.fell_silent(entry);
                    }
                    round.unreachable.push((entry.pid(), e.to_string()));
                }
            }
        }
        drop(tx);
        let deadline = Instant::now() + wait;
        while round.answers.len() < open.len() {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(answer) => round.answers.push(answer),
                Err(_) => break,
            }
        }
        let answered: HashSet<u64> = round.answers.iter().map(|a| a.id).collect();
        for (id, entry) in open {
            self.pending.close(id);
            if !answered.contains(&id) {
                self.fell_silent(entry);
                round.silent.push(entry.pid());
            }
        }
        round
    }

    /// Remembers that the process of `entry` did not answer: it is not asked again until it
    /// writes its entry again.
    fn fell_silent(&self, entry: &Entry) {
        self.silent
            .lock()
            .insert((entry.pid(), entry.pid_ns), entry.updated);
    }

    /// Whether the process of `entry` did not answer before and has not written its entry
    /// since (one that has is forgotten: it is asked again).
    fn still_silent(&self, entry: &Entry) -> bool {
        let mut silent = self.silent.lock();
        let key = (entry.pid(), entry.pid_ns);
        match silent.get(&key) {
            Some(&updated) if entry.updated <= updated => true,
            Some(_) => {
                silent.remove(&key);
                false
            }
            None => false,
        }
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
            report.note = "not asked from a thread that answers requests".into();
            return report;
        }
        self.waiting.store(bytes, Ordering::Relaxed);
        let listing = self.listing();
        let free = self.free_now(&listing);
        report.shortfall = bytes.saturating_add(SLACK).saturating_sub(free);
        let mut unanswered = Unanswered::default();
        self.silent.lock().retain(|&(pid, pid_ns), _| {
            listing
                .entries
                .iter()
                .any(|e| e.pid() == pid && e.pid_ns == pid_ns)
        });
        let (others, skipped): (Vec<&Entry>, Vec<&Entry>) = listing
            .entries
            .iter()
            .filter(|e| !self.is_me(e))
            .partition(|e| !self.still_silent(e));
        if !skipped.is_empty() {
            let skipped: Vec<u32> = skipped.iter().map(|e| e.pid()).collect();
            unanswered.words.push(format!(
                "not asked: {} (no answer before, and no entry written since)",
                pids(&skipped)
            ));
            unanswered.pids.extend(skipped);
        }
        // The rules name processes by a key of this ask (the same pid may name processes of
        // two pid namespaces): others[key - 1], this process 0.
        let mut holders: Vec<Holder> = others
            .iter()
            .enumerate()
            .map(|(i, e)| Holder {
                pid: i as u32 + 1,
                ..e.holder
            })
            .collect();
        holders.push(Holder {
            pid: 0,
            ..self.me()
        });
        let plan = rules::plan(self.total, &holders, 0, report.shortfall);
        let of = |key: u32| others[key as usize - 1];
        let trims: Vec<&Entry> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Trim { pid, .. } => Some(of(*pid)),
                Step::Sleep { .. } => None,
            })
            .collect();
        report.trim_asked = trims.iter().map(|e| e.pid()).collect();
        let round = self.request(&trims, Asked::Give, report.shortfall, TRIM_WAIT);
        unanswered.add(&round, Asked::Give, TRIM_WAIT);
        report.trimmed += round.answers.iter().map(|a| a.bytes).sum::<u64>();
        report.claimed += round.answers.iter().map(|a| a.claimed).sum::<u64>();
        let mut asked: HashSet<(u32, u64)> = trims.iter().map(|e| (e.pid(), e.pid_ns)).collect();
        if report.trimmed < report.shortfall && report.shortfall > 0 {
            // Entries are up to a moment old: whoever was not asked may have cached since.
            let rest: Vec<&Entry> = others
                .iter()
                .copied()
                .filter(|e| !asked.contains(&(e.pid(), e.pid_ns)))
                .collect();
            asked.extend(rest.iter().map(|e| (e.pid(), e.pid_ns)));
            let round = self.request(&rest, Asked::Give, report.shortfall, TRIM_WAIT);
            unanswered.add(&round, Asked::Give, TRIM_WAIT);
            for answer in &round.answers {
                if answer.bytes > 0 {
                    report.trim_asked.push(answer.pid);
                }
                report.trimmed += answer.bytes;
                report.claimed += answer.claimed;
            }
        }
        report.trimmed = report.trimmed.min(self.total);
        if plan.covers {
            for step in &plan.steps {
                let Step::Sleep {
                    pid: key,
                    bytes: holds,
                } = *step
                else {
                    continue;
                };
                if report.trimmed + report.slept >= report.shortfall {
                    break;
                }
                let entry = of(key);
                if self.still_silent(entry) {
                    continue;
                }
                report.sleep_asked.push(entry.pid());
                let wait = SLEEP_WAIT + Duration::from_secs(holds.min(self.total) / 2_000_000_000);
                let missing = report.shortfall - report.trimmed - report.slept;
                let round = self.request(&[entry], Asked::Sleep, missing, wait);
                unanswered.add(&round, Asked::Sleep, wait);
                report.slept += round.answers.iter().map(|a| a.bytes).sum::<u64>();
                report.claimed += round.answers.iter().map(|a| a.claimed).sum::<u64>();
                report.slept = report.slept.min(self.total - report.trimmed);
            }
        } else if report.shortfall > 0 {
            report.note = "the others' caches and idle processes above their share hold too \
                           little"
                .into();
        }
        if report.shortfall == 0 {
            report.note = format!(
                "nobody asked: the device has {free} bytes free, room for {bytes} and {SLACK} \
                 more"
            );
        }
        report.unanswered = unanswered.pids;
        let mut notes: Vec<String> = Vec::new();
        if !report.note.is_empty() {
            notes.push(std::mem::take(&mut report.note));
        }
        notes.extend(unanswered.words.iter().cloned());
        notes.extend(unanswered.answered);
        if !listing.refused.is_empty() {
            notes.push(format!("{} ledger file(s) refused", listing.refused.len()));
        }
        report.note = notes.join("; ");
        *self.last_unanswered.lock() = unanswered.words.join("; ");
        report.seconds = started.elapsed().as_secs_f64();
        self.waiting.store(0, Ordering::Relaxed);
        self.record(Event {
            at: now(),
            kind: "asked".into(),
            peer: 0,
            bytes,
            given: report.trimmed + report.slept,
            seconds: report.seconds,
            note: report.note.chars().take(400).collect(),
        });
        self.publish();
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_that_runs_out_of_time_names_who_and_the_deadline() {
        let round = Round {
            answers: vec![Answered {
                id: 1,
                pid: 8,
                bytes: 0,
                claimed: 0,
                note: "busy (not declared idle)".into(),
            }],
            silent: vec![7],
            unreachable: vec![(9, "no socket".into())],
        };
        let mut unanswered = Unanswered::default();
        unanswered.add(&round, Asked::Sleep, Duration::from_millis(5500));
        let words = unanswered.words.join("; ");
        assert!(
            words.contains("no answer to sleep within the deadline of 5.5 s from pid 7")
                && words.contains("may still finish")
                && words.contains("pid 9 not reached: no socket"),
            "{words}"
        );
        assert_eq!(unanswered.pids, [7, 9]);
        assert_eq!(unanswered.answered, ["pid 8: busy (not declared idle)"]);
        let mut trims = Unanswered::default();
        trims.add(&round, Asked::Give, TRIM_WAIT);
        assert!(trims.words[0].starts_with("no answer to trim within the deadline of 1.0 s"));
    }
}
