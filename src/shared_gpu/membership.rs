//! Joining and leaving a shared GPU's ledger, and the membership's face to allocations
//! ([`pressure::Neighbours`]: asks, the hard limit, who holds what).

use super::entry::{now, Event, MAX_NAME};
use super::ledger_dir::{default_base, LedgerDir};
use super::listener;
use super::member::Member;
use super::options::ShareOptions;
use super::pending::Pending;
use super::process;
use super::rules::{self, Holder};
use super::socket::LedgerSocket;
use crate::error::{Error, Result};
use crate::pressure::{self, Place};
use crate::resource::SharedResource;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The longest [`Member::leave`] waits for the member's threads: the listener stops within a
/// twentieth of a second; a worker in the middle of a sleep finishes it on its own.
const LEAVE_WAIT: Duration = Duration::from_secs(1);

impl Member {
    /// Joins the ledger of `place` (memory of device `ordinal`, `total` bytes) with
    /// `options`; the pools under `resource` sleep when the ledger asks.
    ///
    /// # Errors
    /// As [`ShareOptions::terms`] and [`LedgerDir::open`]; the socket's I/O error.
    pub(super) fn join(
        place: Place,
        ordinal: Option<usize>,
        total: u64,
        key: &str,
        resource: Option<SharedResource>,
        options: &ShareOptions,
    ) -> Result<Arc<Member>> {
        let terms = options.terms(ordinal, total)?;
        let base = options.directory.clone().unwrap_or_else(default_base);
        let dir = LedgerDir::open(&base, key)?;
        let me = process::this_process();
        let socket_path = dir.socket_path(me.pid, me.pid_ns);
        let socket = LedgerSocket::bind(&socket_path).map_err(|e| {
            Error::Logic(format!(
                "shared GPU ledger: cannot open {}: {e}",
                socket_path.display()
            ))
        })?;
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
        let seed = (u64::from(me.pid) << 24) ^ (now() * 1e6) as u64;
        let member = Arc::new(Member {
            place,
            dir,
            me,
            uid: rustix::process::getuid().as_raw(),
            name,
            total,
            soft_share: terms.soft_share,
            hard_limit: terms.hard_limit,
            hard_limit_from: terms.hard_limit_from.into(),
            resource: Mutex::new(resource),
            idle: Arc::new(AtomicBool::new(false)),
            waiting: AtomicU64::new(0),
            moving: Mutex::new(()),
            socket,
            pending: Pending::new(seed),
            silent: Mutex::new(HashMap::new()),
            last_unanswered: Mutex::new(String::new()),
            history: Mutex::new(VecDeque::new()),
            stop: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            dirty: AtomicBool::new(true),
            writing: Mutex::new(()),
            others_waiting: AtomicU64::new(0),
            share: AtomicU64::new(total),
        });
        member.publish();
        if let Err(e) = listener::spawn(&member) {
            member.leave();
            return Err(e);
        }
        let neighbours: Weak<dyn pressure::Neighbours> = Arc::downgrade(&member) as _;
        pressure::set_neighbours(place, neighbours);
        Ok(member)
    }

    /// Leaves the ledger: the listener and the worker stop, the entry and socket go. Returns
    /// within a second (`LEAVE_WAIT`) whatever the others do (a worker still in a sleep
    /// finishes it on its own).
    pub fn leave(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        let deadline = Instant::now() + LEAVE_WAIT;
        for thread in threads {
            if thread.thread().id() == std::thread::current().id() {
                continue;
            }
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            if thread.is_finished() {
                let _ = thread.join();
            }
        }
        // Under the writing lock: a write that began before the stop lands before the removal.
        let _writing = self.writing.lock();
        self.dir.remove(self.me.pid, self.me.pid_ns);
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
        // Another try where an answer gave what its entry does not show yet (written every
        // quarter second): the allocation itself then says whether the room is there.
        report.trimmed + report.slept > 0 || report.claimed > 0
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
    fn past_its_share_while_others_wait_a_process_gives_back_its_cache_first() {
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
            soft_share: Some((64 * MIB as u64).into()),
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

    #[test]
    fn an_answer_from_another_process_counts_nothing_and_a_flood_holds_nothing() {
        use super::super::entry::Entry;
        use super::super::message::{Message, MAX_MESSAGE};
        use crate::resource::SimulatedMemoryResource;
        const MIB: u64 = 1 << 20;
        let sim: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 30));
        let dir = std::env::temp_dir().join(format!("rrmm-forged-{}", std::process::id()));
        let options = ShareOptions {
            directory: Some(dir.clone()),
            ..ShareOptions::default()
        };
        let place = sim.link().place;
        let m = Member::join(place, None, 1 << 30, "forged", Some(sim), &options).unwrap();
        // A peer as its entry names it: process 1 of another pid namespace (never judged dead
        // from here), 300 MiB cached; its socket is this test's.
        let ns = m.me.pid_ns + 1;
        let who = process::Identity {
            pid: 1,
            pid_ns: ns,
            started: 5,
        };
        let mut peer = Entry::of(who, 1 << 30);
        peer.holder.cached = 300 * MIB;
        m.dir.write(&peer).unwrap();
        let socket = LedgerSocket::bind(&m.dir.socket_path(1, ns)).unwrap();
        // Every request answered with all it asks for and its entry emptied, but from this
        // process: the kernel names the sender, which is not the process asked.
        let answerer = std::thread::spawn(move || {
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(3) {
                let Ok(Some(got)) = socket.receive(MAX_MESSAGE, Duration::from_millis(50)) else {
                    continue;
                };
                if let (Some(Message::Give { id, bytes, .. }), Some(to)) =
                    (Message::decode(&got.bytes), got.reply_to)
                {
                    let answer = Message::Answer {
                        id,
                        from: 1,
                        given: bytes,
                        note: String::new(),
                    };
                    let _ = socket.send_to(&answer.encode(), &to);
                    return;
                }
            }
        });
        let report = m.ask_for(900 * MIB);
        answerer.join().unwrap();
        assert_eq!((report.trimmed, report.slept), (0, 0), "{report:?}");
        assert!(
            m.history()
                .iter()
                .any(|e| e.kind == "refused" && e.note.contains("not by process 1")),
            "{:?}",
            m.history()
        );
        // Thousands of requests from a socket nobody reads: answered or declined at once,
        // each answer failing once its queue is full; the member keeps its two threads and
        // leaves at once.
        let quiet = LedgerSocket::bind(&dir.join("quiet.sock")).unwrap();
        let request = Message::Sleep {
            id: 1,
            from: 1,
            bytes: 1,
        }
        .encode();
        // The sends succeed as fast as the listener drains its socket: a minute at most, for
        // a machine whose cores other work holds (5 s sent 967 of them on a loaded 2-core
        // machine, issue 50).
        let started = Instant::now();
        let mut sent = 0;
        while sent < 3000 && started.elapsed() < Duration::from_secs(60) {
            if quiet.send_to(&request, &m.socket_path()).is_ok() {
                sent += 1;
            }
        }
        assert_eq!(sent, 3000);
        assert_eq!(m.threads.lock().len(), 2, "the listener and the worker");
        let started = Instant::now();
        m.leave();
        assert!(started.elapsed() < Duration::from_millis(500));
        assert!(!m.dir.entry_path(m.me.pid, m.me.pid_ns).exists());
        let _ = std::fs::remove_dir_all(dir);
    }
}
