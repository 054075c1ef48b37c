//! Joining and leaving a shared GPU's ledger, and the membership's face to allocations
//! ([`pressure::Neighbours`]: asks, the hard limit, who holds what).

use super::entry::{Event, MAX_NAME};
use super::ledger_dir::{process_started, LedgerDir};
use super::listener::listen;
use super::member::Member;
use super::options::{mps_limit, ShareOptions};
use super::publishing::{now, PUBLISH_EVERY};
use super::rules::{self, Holder};
use crate::error::{Error, Result};
use crate::pressure::{self, Place};
use crate::resource::SharedResource;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

impl Member {
    /// Joins the ledger of `place` (memory of `device`, `total` bytes) with `options`; the
    /// pools under `resource` sleep when the ledger asks.
    ///
    /// # Errors
    /// As [`LedgerDir::open`]; the socket's I/O error.
    pub(super) fn join(
        place: Place,
        device: Option<usize>,
        total: u64,
        key: &str,
        resource: Option<SharedResource>,
        options: &ShareOptions,
    ) -> Result<Arc<Member>> {
        let base = options
            .directory
            .clone()
            .unwrap_or_else(super::ledger_dir::default_base);
        let dir = LedgerDir::open(&base, key)?;
        let pid = std::process::id();
        let socket_path = dir.socket_path(pid);
        let _ = std::fs::remove_file(&socket_path);
        let socket = UnixDatagram::bind(&socket_path).map_err(|e| {
            Error::Logic(format!(
                "shared GPU ledger: cannot open {}: {e}",
                socket_path.display()
            ))
        })?;
        socket
            .set_read_timeout(Some(PUBLISH_EVERY))
            .map_err(|e| Error::Logic(format!("shared GPU ledger: {e}")))?;
        let mps = std::env::var("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
            .ok()
            .and_then(|v| mps_limit(&v, device.unwrap_or(0)));
        let (hard_limit, hard_limit_from) = match (options.hard_limit, mps) {
            (Some(limit), _) => (Some(limit), "user"),
            (None, Some(limit)) => (Some(limit), "mps"),
            (None, None) => (None, ""),
        };
        let name = options
            .name
            .clone()
            .or_else(|| {
                std::env::args()
                    .next()
                    .map(|a| a.rsplit('/').next().unwrap_or(&a).to_string())
            })
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_control())
            .take(MAX_NAME)
            .collect();
        let member = Arc::new(Member {
            place,
            dir,
            pid,
            started: process_started(pid).unwrap_or(0),
            name,
            total,
            soft_share: options.soft_share.map(|s| s.min(total)),
            hard_limit,
            hard_limit_from: hard_limit_from.into(),
            resource: Mutex::new(resource),
            idle: AtomicBool::new(false),
            waiting: AtomicU64::new(0),
            slept: Mutex::new(Vec::new()),
            socket,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            history: Mutex::new(VecDeque::new()),
            stop: AtomicBool::new(false),
            listener: Mutex::new(None),
            dirty: AtomicBool::new(true),
            others_waiting: AtomicU64::new(0),
            share: AtomicU64::new(total),
        });
        member.publish();
        let weak = Arc::downgrade(&member);
        let listener = std::thread::Builder::new()
            .name("rrmm-shared-gpu".into())
            .spawn(move || listen(&weak))
            .map_err(|e| Error::Logic(format!("shared GPU ledger: no listener thread: {e}")))?;
        *member.listener.lock() = Some(listener);
        let neighbours: Weak<dyn pressure::Neighbours> = Arc::downgrade(&member) as _;
        pressure::set_neighbours(place, neighbours);
        Ok(member)
    }

    /// Leaves the ledger: the listener stops, the entry and socket go.
    pub fn leave(&self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(listener) = self.listener.lock().take() {
            if listener.thread().id() != std::thread::current().id() {
                let _ = listener.join();
            }
        }
        self.dir.remove(self.pid);
    }

    /// Before the process takes `bytes` more from the driver: past its soft share while other
    /// processes wait for memory, its own pools give back what they keep first (the waiters get
    /// it); an allocation past its hard limit is refused.
    ///
    /// # Errors
    /// Out of memory naming the hard limit and what the process holds.
    pub fn admit(&self, bytes: usize) -> Result<()> {
        if self.others_waiting.load(Ordering::Relaxed) > 0 {
            let me = self.me();
            if me.held().saturating_add(bytes as u64) > self.share.load(Ordering::Relaxed) {
                pressure::relieve(self.place);
            }
        }
        let Some(limit) = self.hard_limit else {
            return Ok(());
        };
        let within = |me: &Holder| rules::within_hard_limit(me, bytes as u64);
        if within(&self.me()).is_ok() {
            return Ok(());
        }
        pressure::relieve(self.place);
        match within(&self.me()) {
            Ok(()) => Ok(()),
            Err(refusal) => {
                self.record(Event {
                    at: now(),
                    kind: "refused".into(),
                    peer: 0,
                    bytes: bytes as u64,
                    given: 0,
                    seconds: 0.0,
                    note: format!("hard limit {limit} ({})", self.hard_limit_from),
                });
                Err(Error::out_of_memory(
                    bytes,
                    format!(
                        "shared GPU: this process holds {} bytes and its hard limit is {} \
                         bytes (from {})",
                        refusal.held, refusal.limit, self.hard_limit_from
                    ),
                ))
            }
        }
    }
}

impl pressure::Neighbours for Member {
    fn ask(&self, bytes: usize) -> bool {
        let report = self.ask_for(bytes as u64);
        report.trimmed + report.slept > 0
    }

    fn admit(&self, bytes: usize) -> Result<()> {
        Member::admit(self, bytes)
    }

    fn holders(&self) -> String {
        self.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn past_its_share_while_others_wait_a_process_gives_back_its_cache_first() {
        use crate::cuda::Stream;
        use crate::resource::{MemoryResource, SimulatedMemoryResource};
        const MIB: usize = 1 << 20;
        let sim: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 30));
        let pool: SharedResource =
            Arc::new(crate::suballocator::PoolMemoryResource::new(sim, Some(0), None).unwrap());
        let p = pool.allocate(256 * MIB, Stream::DEFAULT).unwrap();
        // SAFETY: allocated above from this pool with this size, freed once.
        unsafe { pool.deallocate(p, 256 * MIB, Stream::DEFAULT) }.unwrap();
        let place = pool.link().place;
        let dir = std::env::temp_dir().join(format!("rrmm-admit-{}", std::process::id()));
        let options = ShareOptions {
            directory: Some(dir.clone()),
            soft_share: Some(64 * MIB as u64),
            ..ShareOptions::default()
        };
        let m = Member::join(place, None, 1 << 30, "admit", Some(pool.clone()), &options).unwrap();
        let cached = || pressure::figures(place).cached;
        assert!(cached() >= 256 * MIB);
        m.admit(MIB).unwrap();
        assert!(cached() >= 256 * MIB, "nobody waits: the cache stays");
        // The listener stopped, so that its reading of the ledger does not undo the next two
        // lines (admit needs no listener).
        m.leave();
        m.others_waiting.store(1, Ordering::Relaxed);
        m.share.store(64 * MIB as u64, Ordering::Relaxed);
        m.admit(MIB).unwrap();
        assert_eq!(
            cached(),
            0,
            "past its share while another waits: its cache goes first"
        );
        m.leave();
        let _ = std::fs::remove_dir_all(dir);
    }
}
