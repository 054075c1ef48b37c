//! This process's membership of a shared GPU: the state the other modules work on (its
//! identity and terms, its socket, the requests it waits on, what it recorded) and its plain
//! accessors. Each job on it lives in its own module: [`super::membership`] (joining and
//! leaving, the hard limit), [`super::publishing`] (its entry, its history, the ledger as it
//! reads it), [`super::asking`], [`super::answering`], [`super::idle`] (sleeping and waking)
//! and [`super::listener`].

use super::entry::Event;
use super::ledger_dir::LedgerDir;
use super::pending::Pending;
use super::process::Identity;
use super::socket::LedgerSocket;
use crate::pressure::Place;
use crate::resource::SharedResource;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// This process on one shared GPU (see the module docs).
pub struct Member {
    pub(super) place: Place,
    pub(super) dir: LedgerDir,
    /// This process as the ledger names it.
    pub(super) me: Identity,
    /// Its user (answers from another user's processes are refused).
    pub(super) uid: u32,
    pub(super) name: String,
    pub(super) total: u64,
    pub(super) soft_share: Option<u64>,
    pub(super) hard_limit: Option<u64>,
    pub(super) hard_limit_from: String,
    /// The resource whose pools sleep when the ledger asks (its link's sleepers).
    pub(super) resource: Mutex<Option<SharedResource>>,
    /// Whether the process declared itself idle (shared with the ledger's sleeps in flight,
    /// which are abandoned once it turns false).
    pub(super) idle: Arc<AtomicBool>,
    pub(super) waiting: AtomicU64,
    /// Held through a ledger sleep and by a declaration of busy: busy returns only once the
    /// sleep in flight is done or abandoned, then wakes what slept. The pools keep the state
    /// of what slept for the ledger ([`SleepCause::Ledger`](crate::resource::sleep::SleepCause)).
    pub(super) moving: Mutex<()>,
    pub(super) socket: LedgerSocket,
    /// The requests this process waits on.
    pub(super) pending: Pending,
    /// Processes (pid, pid namespace) that did not answer in time, with their entry's
    /// `updated` then: not asked again until their entry is written again (a stopped process
    /// writes nothing).
    pub(super) silent: Mutex<HashMap<(u32, u64), f64>>,
    /// The last ask's words on who did not answer (for a refusal's message).
    pub(super) last_unanswered: Mutex<String>,
    pub(super) history: Mutex<VecDeque<Event>>,
    /// Set when the member leaves: its threads stop, its entry is no longer written.
    pub(super) stop: AtomicBool,
    /// The listener and the worker.
    pub(super) threads: Mutex<Vec<JoinHandle<()>>>,
    pub(super) dirty: AtomicBool,
    /// Held while the entry is made and written: a write of older figures never lands after
    /// a newer one (an answer's count reads the entry written before it).
    pub(super) writing: Mutex<()>,
    /// What the others wait for, and this process's soft share, as the listener last read
    /// the ledger: a growth past the share while others wait gives back this process's cache
    /// first ([`Member::admit`]).
    pub(super) others_waiting: AtomicU64,
    pub(super) share: AtomicU64,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("place", &self.place)
            .field("dir", &self.dir.path())
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

impl Member {
    /// The place this membership is for.
    pub fn place(&self) -> Place {
        self.place
    }

    /// The ledger's directory.
    pub fn directory(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// This process's socket in the ledger.
    pub fn socket_path(&self) -> std::path::PathBuf {
        self.dir.socket_path(self.me.pid, self.me.pid_ns)
    }

    /// The hard limit and where it comes from (`"user"`, `"mps"`).
    pub fn hard_limit(&self) -> (Option<u64>, &str) {
        (self.hard_limit, &self.hard_limit_from)
    }

    /// The soft share this process asked for.
    pub fn soft_share(&self) -> Option<u64> {
        self.soft_share
    }

    /// Makes `resource`'s pools the ones that sleep when asked.
    pub fn set_resource(&self, resource: Option<SharedResource>) {
        *self.resource.lock() = resource;
    }

    /// Whether the process declared itself idle.
    pub fn idle(&self) -> bool {
        self.idle.load(Ordering::Acquire)
    }

    /// Whether the member left.
    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Whether `entry` is this process's.
    pub(super) fn is_me(&self, entry: &super::entry::Entry) -> bool {
        entry.pid() == self.me.pid && entry.pid_ns == self.me.pid_ns
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.dir.remove(self.me.pid, self.me.pid_ns);
    }
}
