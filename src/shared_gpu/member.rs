//! This process's membership of a shared GPU: the state the other modules work on (its
//! identity and options, its socket, what it waits for, what it recorded) and its plain
//! accessors. Each job on it lives in its own module: [`super::membership`] (joining and
//! leaving), [`super::publishing`] (its entry), [`super::asking`], [`super::answering`],
//! [`super::idle`] (sleeping and waking) and [`super::listener`].

use super::entry::Event;
use super::ledger_dir::LedgerDir;
use crate::pressure::Place;
use crate::resource::sleep::Sleeper;
use crate::resource::SharedResource;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

/// An answer: who answered, the bytes given, why not more.
pub(super) type AnswerFrom = (u32, u64, String);

/// This process on one shared GPU (see the module docs).
pub struct Member {
    pub(super) place: Place,
    pub(super) dir: LedgerDir,
    pub(super) pid: u32,
    pub(super) started: u64,
    pub(super) name: String,
    pub(super) total: u64,
    pub(super) soft_share: Option<u64>,
    pub(super) hard_limit: Option<u64>,
    pub(super) hard_limit_from: String,
    /// The resource whose pools sleep when the ledger asks (its link's sleepers).
    pub(super) resource: Mutex<Option<SharedResource>>,
    pub(super) idle: AtomicBool,
    pub(super) waiting: AtomicU64,
    /// Pools put to sleep by the ledger, and the bytes each moved to the host.
    pub(super) slept: Mutex<Vec<(Arc<dyn Sleeper>, u64)>>,
    pub(super) socket: UnixDatagram,
    pub(super) pending: Mutex<HashMap<u64, mpsc::Sender<AnswerFrom>>>,
    pub(super) next_id: AtomicU64,
    pub(super) history: Mutex<VecDeque<Event>>,
    pub(super) stop: AtomicBool,
    pub(super) listener: Mutex<Option<JoinHandle<()>>>,
    pub(super) dirty: AtomicBool,
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
            .field("pid", &self.pid)
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
}

impl Drop for Member {
    fn drop(&mut self) {
        self.dir.remove(self.pid);
    }
}
