//! This process's entry in the ledger: what it holds, written whole at every change and every
//! [`super::listener`] period; its history of events; the ledger as it reads it (the others'
//! holdings, in the rules' terms, and in words for a refusal).

use super::entry::{now, Entry, Event, HISTORY_IN_ENTRY, VERSION};
use super::ledger_dir::Listing;
use super::member::Member;
use super::rules::{self, Holder};
use crate::pressure::{self, Place};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The most events kept in the process.
const HISTORY_KEPT: usize = 256;
/// How often the entry is written when nothing happens.
pub(super) const PUBLISH_EVERY: Duration = Duration::from_millis(250);

impl Member {
    /// This process's holder row now.
    pub(super) fn me(&self) -> Holder {
        let figures = pressure::figures(self.place);
        Holder {
            pid: self.me.pid,
            live: figures.live() as u64,
            cached: figures.cached as u64,
            soft_share: self.soft_share,
            hard_limit: self.hard_limit,
            idle: self.idle(),
            asleep: self.asleep_bytes(),
        }
    }

    /// This process's entry now.
    pub(super) fn entry(&self) -> Entry {
        let me = self.me();
        let history = self.history.lock();
        let skip = history.len().saturating_sub(HISTORY_IN_ENTRY);
        let live = me.live.min(self.total);
        Entry {
            version: VERSION,
            holder: Holder {
                live,
                cached: me.cached.min(self.total - live),
                ..me
            },
            pid_ns: self.me.pid_ns,
            started: self.me.started,
            name: self.name.clone(),
            total: self.total,
            hard_limit_from: self.hard_limit_from.clone(),
            waiting: self.waiting.load(Ordering::Relaxed).min(self.total),
            updated: now(),
            history: history.iter().skip(skip).cloned().collect(),
        }
    }

    /// Writes this process's entry now (nothing once it left the ledger).
    pub fn publish(&self) {
        let _writing = self.writing.lock();
        if self.stopped() {
            return;
        }
        self.dirty.store(false, Ordering::Release);
        let _ = self.dir.write(&self.entry());
    }

    /// Adds `event` to the history (the entry is written soon after).
    pub(super) fn record(&self, event: Event) {
        let mut history = self.history.lock();
        if history.len() == HISTORY_KEPT {
            history.pop_front();
        }
        history.push_back(event);
        self.dirty.store(true, Ordering::Release);
    }

    /// The events this process recorded, oldest first.
    pub fn history(&self) -> Vec<Event> {
        self.history.lock().iter().cloned().collect()
    }

    /// The ledger now: every live process's entry (this one's fresh), the stale ones of
    /// processes this one cannot see, and the files refused.
    pub fn listing(&self) -> Listing {
        self.publish();
        self.dir.list(self.total)
    }

    /// Who holds what on the GPU now, in words: each process's live and cached bytes, its soft
    /// share, whether it is idle or has data asleep on the host (the message of an allocation
    /// refused after asking).
    pub fn describe(&self) -> String {
        let listing = self.listing();
        let holders: Vec<Holder> = listing.entries.iter().map(|e| e.holder).collect();
        let shares = rules::soft_shares(self.total, &holders);
        let gib = |b: u64| crate::report::human_bytes(b as usize);
        let rows: Vec<String> = listing
            .entries
            .iter()
            .zip(shares)
            .map(|(e, share)| {
                let h = &e.holder;
                let mut row = format!(
                    "pid {}{} ({}) live {}, cached {}, share {}",
                    h.pid,
                    if self.is_me(e) { " (this one)" } else { "" },
                    e.name,
                    gib(h.live),
                    gib(h.cached),
                    gib(share)
                );
                if h.idle {
                    row.push_str(", idle");
                }
                if h.asleep > 0 {
                    row.push_str(&format!(", {} asleep on the host", gib(h.asleep)));
                }
                row
            })
            .collect();
        let unanswered = self.last_unanswered.lock().clone();
        format!(
            "the other processes on this GPU were asked first (a busy process, or one within \
             its soft share, is not put to sleep): {}{}{unanswered}",
            rows.join("; "),
            if unanswered.is_empty() { "" } else { "; " }
        )
    }

    /// Free bytes of the device now: the driver's figure for a GPU; a shared simulated
    /// device's own (its table of every process's charges, [`super::simulated_device`]); for a
    /// simulated device of this process alone, what the processes of `listing` leave of it (the
    /// entries, up to a quarter second old, are then the only shared state).
    pub(super) fn free_now(&self, listing: &Listing) -> u64 {
        if let Place::Device(ordinal) = self.place {
            return crate::cuda::device_memory_info(ordinal).map_or(0, |(free, _)| free as u64);
        }
        let resource = self.resource.lock().clone();
        if let Some((free, _)) = resource
            .filter(|r| r.link().device_key.is_some())
            .and_then(|r| r.memory_info())
        {
            return free as u64;
        }
        let held: u64 = listing
            .entries
            .iter()
            .map(|e| e.holder.held())
            .fold(0, u64::saturating_add);
        self.total.saturating_sub(held)
    }

    /// The rules' view of `listing`: every other process as published, and this one as it is
    /// now (last).
    pub(super) fn holders(&self, listing: &Listing) -> Vec<Holder> {
        let mut holders: Vec<Holder> = listing
            .entries
            .iter()
            .filter(|e| !self.is_me(e))
            .map(|e| e.holder)
            .collect();
        holders.push(self.me());
        holders
    }

    /// Reads the others' waits and this process's share from the ledger (the listener, every
    /// [`PUBLISH_EVERY`]).
    pub(super) fn read_others(&self) {
        let listing = self.dir.list(self.total);
        let waiting = listing
            .entries
            .iter()
            .filter(|e| !self.is_me(e))
            .map(|e| e.waiting)
            .fold(0u64, u64::saturating_add);
        let shares = rules::soft_shares(self.total, &self.holders(&listing));
        self.share
            .store(*shares.last().unwrap_or(&self.total), Ordering::Relaxed);
        self.others_waiting.store(waiting, Ordering::Relaxed);
    }
}
