//! This process's membership of a shared GPU: its entry, kept up to date; its socket, where it
//! answers the others' requests; and its asks, when an allocation on the GPU runs out.

use super::entry::{Entry, Event, HISTORY_IN_ENTRY, MAX_NAME, VERSION};
use super::ledger_dir::{process_started, LedgerDir};
use super::message::{Message, MAX_MESSAGE};
use super::rules::{self, Holder, Step};
use crate::error::{Error, Result};
use crate::pressure::{self, Place};
use crate::resource::sleep::{MovingPool, SleepPlan};
use crate::resource::SharedResource;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Room asked beyond an allocation (a page of the expandable pool, what the driver keeps).
const SLACK: u64 = 64 << 20;
/// How long an ask waits for the trims' answers.
const TRIM_WAIT: Duration = Duration::from_secs(1);
/// How long an ask waits for a sleep beyond the copy at 2 GB/s.
const SLEEP_WAIT: Duration = Duration::from_secs(5);
/// The most events kept in the process.
const HISTORY_KEPT: usize = 256;
/// How often the entry is written when nothing happens.
const PUBLISH_EVERY: Duration = Duration::from_millis(250);

/// An answer: who answered, the bytes given, why not more.
type AnswerFrom = (u32, u64, String);

/// What a process joining a shared GPU says of itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShareOptions {
    /// Its soft share in bytes (default: an equal part of what others' asked shares leave).
    pub soft_share: Option<u64>,
    /// Its hard limit in bytes (default: the MPS pinned memory limit where one is set, else
    /// none).
    pub hard_limit: Option<u64>,
    /// A name for people (default: the program's).
    pub name: Option<String>,
    /// The ledgers' directory (default: [`super::ledger_dir::default_base`]).
    pub directory: Option<std::path::PathBuf>,
    /// The device's ledger (default: the GPU's UUID; for a simulated device
    /// `simulated-<bytes>`).
    pub device_key: Option<String>,
}

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

/// This process on one shared GPU (see the module docs).
pub struct Member {
    place: Place,
    dir: LedgerDir,
    pid: u32,
    started: u64,
    name: String,
    total: u64,
    soft_share: Option<u64>,
    hard_limit: Option<u64>,
    hard_limit_from: String,
    /// The resource whose pools sleep when the ledger asks (its link's sleepers).
    resource: Mutex<Option<SharedResource>>,
    idle: AtomicBool,
    waiting: AtomicU64,
    /// Pools put to sleep by the ledger, and the bytes each moved to the host.
    slept: Mutex<Vec<(Arc<dyn MovingPool>, u64)>>,
    socket: UnixDatagram,
    pending: Mutex<HashMap<u64, mpsc::Sender<AnswerFrom>>>,
    next_id: AtomicU64,
    history: Mutex<VecDeque<Event>>,
    stop: AtomicBool,
    listener: Mutex<Option<JoinHandle<()>>>,
    dirty: AtomicBool,
    /// What the others wait for, and this process's soft share, as the listener last read
    /// the ledger: a growth past the share while others wait gives back this process's cache
    /// first ([`Member::admit`]).
    others_waiting: AtomicU64,
    share: AtomicU64,
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

/// The rules' view of an entry.
fn holder_of(e: &Entry) -> Holder {
    Holder {
        pid: e.pid,
        live: e.live,
        cached: e.cached,
        soft_share: e.soft_share,
        hard_limit: e.hard_limit,
        idle: e.idle,
        asleep: e.asleep,
    }
}

thread_local! {
    /// Whether this thread answers requests (it must never ask: it would wait for itself).
    // Why process-wide: the answering thread is one of this process's, whichever ledger it
    // serves; the flag is per thread.
    static ANSWERING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A size in `s`: a byte specification ([`read_byte_spec`](crate::report::read_byte_spec):
/// `"10GiB"`, `"4GB"`, bytes) or a percentage of `total` (`"25%"`); `None` when it is neither.
pub fn parse_size(s: &str, total: u64) -> Option<u64> {
    let s = s.trim();
    if let Some(percent) = s.strip_suffix('%') {
        let p: f64 = percent.trim().parse().ok()?;
        return (0.0..=100.0)
            .contains(&p)
            .then(|| (total as f64 * p / 100.0) as u64);
    }
    crate::report::read_byte_spec(s)
        .ok()
        .and_then(|b| u64::try_from(b).ok())
}

/// A size as MPS writes it (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`): bytes, or a number with K, M,
/// G or T (powers of 1024); `None` when it is not one or overflows.
fn mps_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (digits, shift) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 10),
        'M' => (&s[..s.len() - 1], 20),
        'G' => (&s[..s.len() - 1], 30),
        'T' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(1u64 << shift)
}

/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` for device `ordinal`: `"2G"` (every device) or
/// `"0=1G,1=2G"` (sizes as MPS writes them).
pub fn mps_limit(value: &str, ordinal: usize) -> Option<u64> {
    if !value.contains('=') {
        return mps_size(value);
    }
    value.split(',').find_map(|part| {
        let (device, limit) = part.split_once('=')?;
        (device.trim().parse::<usize>().ok()? == ordinal).then(|| mps_size(limit))?
    })
}

impl ShareOptions {
    /// The options in the environment: `RRMM_SHARE_SOFT` and `RRMM_SHARE_HARD` (sizes or
    /// percentages of the device's `total` bytes), `RRMM_SHARE_NAME`; the directory is
    /// `RRMM_LEDGER_DIR`'s.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the variable that is not a size.
    pub fn from_env(total: u64) -> Result<ShareOptions> {
        let size = |var: &'static str| -> Result<Option<u64>> {
            match std::env::var(var) {
                Ok(v) if !v.trim().is_empty() => parse_size(&v, total).map(Some).ok_or_else(|| {
                    Error::invalid(var, format!("{v:?} is not a size (bytes, 10GiB, 25%)"))
                }),
                _ => Ok(None),
            }
        };
        Ok(ShareOptions {
            soft_share: size("RRMM_SHARE_SOFT")?,
            hard_limit: size("RRMM_SHARE_HARD")?,
            name: std::env::var("RRMM_SHARE_NAME")
                .ok()
                .filter(|n| !n.is_empty()),
            directory: None,
            device_key: None,
        })
    }
}

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

    /// Whether the process declared itself idle.
    pub fn idle(&self) -> bool {
        self.idle.load(Ordering::Acquire)
    }

    /// Declares the process idle (its pools may be put to sleep when others need the memory)
    /// or busy (pools the ledger put to sleep wake now); the bytes woken.
    ///
    /// # Errors
    /// The first wake's error (the pool stays asleep and wakes at its next use).
    pub fn set_idle(&self, idle: bool) -> Result<u64> {
        self.idle.store(idle, Ordering::Release);
        self.dirty.store(true, Ordering::Release);
        let mut woken = 0;
        let mut first = None;
        if !idle {
            let slept: Vec<(Arc<dyn MovingPool>, u64)> = self.slept.lock().drain(..).collect();
            let started = Instant::now();
            for (pool, bytes) in slept {
                if !pool.asleep() {
                    continue;
                }
                if pool.wake_for_use() {
                    woken += bytes;
                } else {
                    first.get_or_insert_with(|| {
                        Error::Logic("shared GPU: a pool put to sleep could not wake yet".into())
                    });
                    self.slept.lock().push((pool, bytes));
                }
            }
            if woken > 0 {
                self.record(Event {
                    at: now(),
                    kind: "woke".into(),
                    peer: 0,
                    bytes: woken,
                    given: woken,
                    seconds: started.elapsed().as_secs_f64(),
                    note: String::new(),
                });
            }
        }
        self.publish();
        first.map_or(Ok(woken), Err)
    }

    /// This process's holder row now.
    fn me(&self) -> Holder {
        let figures = pressure::figures(self.place);
        Holder {
            pid: self.pid,
            live: figures.live() as u64,
            cached: figures.cached as u64,
            soft_share: self.soft_share,
            hard_limit: self.hard_limit,
            idle: self.idle(),
            asleep: self.asleep_bytes(),
        }
    }

    /// Bytes the ledger's sleeps keep on the host now (pools woken since are forgotten).
    fn asleep_bytes(&self) -> u64 {
        let mut slept = self.slept.lock();
        slept.retain(|(pool, _)| pool.asleep());
        slept.iter().map(|(_, b)| *b).sum()
    }

    /// This process's entry now.
    fn entry(&self) -> Entry {
        let me = self.me();
        let history = self.history.lock();
        let skip = history.len().saturating_sub(HISTORY_IN_ENTRY);
        Entry {
            version: VERSION,
            pid: self.pid,
            started: self.started,
            name: self.name.clone(),
            total: self.total,
            live: me.live.min(self.total),
            cached: me.cached.min(self.total - me.live.min(self.total)),
            soft_share: self.soft_share,
            hard_limit: self.hard_limit,
            hard_limit_from: self.hard_limit_from.clone(),
            idle: me.idle,
            asleep: me.asleep,
            waiting: self.waiting.load(Ordering::Relaxed).min(self.total),
            updated: now(),
            history: history.iter().skip(skip).cloned().collect(),
        }
    }

    /// Writes this process's entry now.
    pub fn publish(&self) {
        self.dirty.store(false, Ordering::Release);
        let _ = self.dir.write(&self.entry());
    }

    fn record(&self, event: Event) {
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

    /// The ledger now: every live process's entry (this one's fresh), and the files refused.
    pub fn listing(&self) -> super::ledger_dir::Listing {
        self.publish();
        self.dir.list(Some(self.total))
    }

    /// Who holds what on the GPU now, in words: each process's live and cached bytes, its soft
    /// share, whether it is idle or has data asleep on the host (the message of an allocation
    /// refused after asking).
    pub fn describe(&self) -> String {
        let listing = self.listing();
        let holders: Vec<Holder> = listing.entries.iter().map(holder_of).collect();
        let shares = rules::soft_shares(self.total, &holders);
        let gib = |b: u64| crate::report::human_bytes(b as usize);
        let rows: Vec<String> = listing
            .entries
            .iter()
            .zip(shares)
            .map(|(e, share)| {
                let mut row = format!(
                    "pid {}{} ({}) live {}, cached {}, share {}",
                    e.pid,
                    if e.pid == self.pid { " (this one)" } else { "" },
                    e.name,
                    gib(e.live),
                    gib(e.cached),
                    gib(share)
                );
                if e.idle {
                    row.push_str(", idle");
                }
                if e.asleep > 0 {
                    row.push_str(&format!(", {} asleep on the host", gib(e.asleep)));
                }
                row
            })
            .collect();
        format!(
            "the other processes on this GPU were asked first (a busy process, or one within \
             its soft share, is not put to sleep): {}",
            rows.join("; ")
        )
    }

    /// Free bytes of the device now: the driver's figure for a GPU; for a simulated device,
    /// what the processes of `listing` leave of it (the ledger is the simulated device's
    /// shared state).
    fn free_now(&self, listing: &super::ledger_dir::Listing) -> u64 {
        if let Place::Device(ordinal) = self.place {
            return crate::cuda::device_memory_info(ordinal).map_or(0, |(free, _)| free as u64);
        }
        let held: u64 = listing
            .entries
            .iter()
            .map(|e| e.live.saturating_add(e.cached))
            .fold(0, u64::saturating_add);
        self.total.saturating_sub(held)
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

    /// The rules' view of `listing`: every other process as published, and this one as it is
    /// now (last).
    fn holders(&self, listing: &super::ledger_dir::Listing) -> Vec<Holder> {
        let mut holders: Vec<Holder> = listing
            .entries
            .iter()
            .filter(|e| e.pid != self.pid)
            .map(holder_of)
            .collect();
        holders.push(self.me());
        holders
    }

    /// Reads the others' waits and this process's share from the ledger (the listener, every
    /// [`PUBLISH_EVERY`]).
    fn read_others(&self) {
        let listing = self.dir.list(Some(self.total));
        let waiting = listing
            .entries
            .iter()
            .filter(|e| e.pid != self.pid)
            .map(|e| e.waiting)
            .fold(0u64, u64::saturating_add);
        let shares = rules::soft_shares(self.total, &self.holders(&listing));
        self.share
            .store(*shares.last().unwrap_or(&self.total), Ordering::Relaxed);
        self.others_waiting.store(waiting, Ordering::Relaxed);
    }

    /// Sends `message` to process `pid`; whether it could be sent (false: the process is gone).
    fn send(&self, pid: u32, message: &Message) -> bool {
        self.socket
            .send_to(&message.encode(), self.dir.socket_path(pid))
            .is_ok()
    }

    /// Sends one request to each of `pids` and waits up to `wait` for their answers; the
    /// bytes given by each that answered.
    fn request(
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
        if ANSWERING.with(std::cell::Cell::get) {
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

    /// Answers a request to give back cached memory: relieves the process's pools (retrying
    /// briefly while one is busy); the bytes given.
    fn give(&self) -> u64 {
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

    /// Answers a request to sleep: only when idle and above its share (checked here, whatever
    /// the asker thought); the bytes freed, or why none.
    fn sleep_for(self: &Arc<Self>) -> (u64, String) {
        if !self.idle() {
            return (0, "busy (not declared idle)".into());
        }
        let mut given = self.give();
        let holders = self.holders(&self.dir.list(Some(self.total)));
        let shares = rules::soft_shares(self.total, &holders);
        let (Some(me), Some(&share)) = (holders.last(), shares.last()) else {
            return (given, String::new());
        };
        if me.live <= share {
            return (
                given,
                format!("at or under its soft share ({} of {share} bytes)", me.live),
            );
        }
        let Some(resource) = self.resource.lock().clone() else {
            return (given, "no pool of this process can sleep".into());
        };
        let sleepers = resource.link().sleep.pools().to_vec();
        if sleepers.is_empty() {
            return (
                given,
                "its pools cannot sleep (only the expandable pool can)".into(),
            );
        }
        let me = Arc::downgrade(self);
        let plan = SleepPlan::for_ledger(Arc::new(move || me.upgrade().is_some_and(|m| m.idle())));
        let mut note = String::new();
        for pool in sleepers {
            if pool.asleep() {
                continue;
            }
            match pool.offload(&plan) {
                Ok(estimate) => {
                    given += estimate.released_bytes as u64;
                    self.slept.lock().push((
                        pool,
                        (estimate.copied_bytes + estimate.discarded_bytes) as u64,
                    ));
                }
                Err(e) => note = format!("a pool could not sleep: {e}"),
            }
        }
        (given, note)
    }

    /// Handles one datagram.
    fn handle(self: &Arc<Self>, bytes: &[u8]) {
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
                        ANSWERING.with(|a| a.set(true));
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

    fn answer(&self, to: u32, id: u64, given: u64, note: String) {
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

impl Drop for Member {
    fn drop(&mut self) {
        self.dir.remove(self.pid);
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

/// The listener: answers requests and routes answers until the member leaves or drops;
/// writes the entry when something changed, and every [`PUBLISH_EVERY`] regardless.
fn listen(member: &Weak<Member>) {
    ANSWERING.with(|a| a.set(true));
    let mut buf = vec![0u8; MAX_MESSAGE + 1];
    let mut last = Instant::now();
    loop {
        let Some(m) = member.upgrade() else {
            return;
        };
        if m.stop.load(Ordering::Acquire) {
            return;
        }
        if let Ok((n, _)) = m.socket.recv_from(&mut buf) {
            m.handle(&buf[..n]);
        }
        if m.dirty.load(Ordering::Acquire) || last.elapsed() >= PUBLISH_EVERY {
            m.publish();
            m.read_others();
            last = Instant::now();
        }
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

    #[test]
    fn mps_limits_are_read_per_device() {
        assert_eq!(mps_limit("2G", 0), Some(2 << 30));
        assert_eq!(mps_limit("0=1G,1=512M", 1), Some(512 << 20));
        assert_eq!(mps_limit("0=1G,1=512M", 2), None);
        assert_eq!(mps_limit("1048576", 3), Some(1 << 20));
        assert_eq!(mps_limit("lots", 0), None);
        assert_eq!(parse_size("25%", 1000), Some(250));
        assert_eq!(parse_size("10GiB", 0), Some(10 << 30));
        assert_eq!(parse_size("3 kb", 0), Some(3000));
        assert_eq!(
            parse_size("4G", 0),
            None,
            "a bare unit, as everywhere in rrmm"
        );
        assert_eq!(parse_size("101%", 1000), None);
        assert_eq!(
            mps_limit("99999999999T", 0),
            None,
            "overflow is no limit, not a wrap"
        );
    }
}
