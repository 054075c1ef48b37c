//! [`Exporter`]: one process's shared segments and named buffers, served to importers on a
//! socket by a thread of its own (`serve.rs`).

use super::book::{Book, BookFigures, BufferId, Withdrawal};
use super::codec::check_text;
use super::error::ShareError;
use super::message::{limits, BufferSpec, SegmentId};
use super::segment::{PlacedRange, ShareableSegment};
use super::transport::{self, Channel, Listener};
use crate::shared_gpu::ledger_dir::LedgerDir;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How an exporter serves.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// How long a reply to one importer may wait for room in its queue before that importer is
    /// muted (served no more; its leases hold until its socket closes). The exporter's thread
    /// waits this long at most for one importer.
    pub send_timeout: Duration,
    /// The most importers connected at once; more are refused (busy).
    pub max_importers: usize,
    /// How many refused requests an importer may send before it is muted.
    pub max_refusals: u32,
    /// Whether an importer may hand segments and names back (adoption: this exporter takes
    /// over from one that died).
    pub accept_adoption: bool,
    /// The bytes of the range its placed segments lie in ([`ShareableSegment::at`]: an
    /// expandable pool's reservation); 0 when it has none. Importers reserve as much once and
    /// map each placed segment at its place there.
    pub range: u64,
}

impl Default for ExportOptions {
    fn default() -> ExportOptions {
        ExportOptions {
            send_timeout: Duration::from_millis(200),
            max_importers: 64,
            max_refusals: 16,
            accept_adoption: false,
            range: 0,
        }
    }
}

/// An exporter's figures, one record: what it exports, who holds it, what waited and what was
/// refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ExportFigures {
    /// Segments exported.
    pub segments: u64,
    /// Names exported now.
    pub names: u64,
    /// Importers connected now.
    pub importers: u64,
    /// Leases importers hold now.
    pub leases: u64,
    /// Frees waiting for importers now.
    pub deferred_frees: u64,
    /// Frees that ever waited.
    pub deferred_total: u64,
    /// Frees done once their last importer let go or died.
    pub frees_after_wait: u64,
    /// Requests refused (malformed, out of order, unexpected, not allowed).
    pub refused: u64,
    /// Importers muted (too many refusals, or a reply that could not be sent in time).
    pub muted: u64,
    /// Connections of another user, closed at once.
    pub other_users: u64,
    /// Connections refused because as many importers as allowed were connected.
    pub busy: u64,
    /// Segments taken over from importers.
    pub adopted_segments: u64,
    /// Names exported again from importers.
    pub adopted_names: u64,
}

impl ExportFigures {
    /// Its fields by name (the Python dict; every field once, from the one declaration).
    pub fn to_map(&self) -> serde_json::Map<String, serde_json::Value> {
        fields_of(self)
    }
}

/// The fields of a record of figures by name (empty for a value that is not a struct).
pub fn fields_of(record: &impl Serialize) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::to_value(record) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}

/// What a free of an exported buffer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeOutcome {
    /// No importer held it: its free ran now.
    Now,
    /// Importers hold it: its free runs when the last of them lets go or dies.
    Deferred {
        /// How many hold it.
        holders: usize,
    },
}

/// What runs when a withdrawn buffer's block may be reused.
pub(super) type OnFree = Box<dyn FnOnce() + Send>;

/// The state the exporter's thread and its callers share.
pub(super) struct State {
    pub(super) book: Book,
    pub(super) segments: BTreeMap<SegmentId, Arc<dyn ShareableSegment>>,
    /// The placed segments by where they lie in the range.
    placed: BTreeMap<u64, SegmentId>,
    /// The bytes of the range placed segments lie in, as importers are told
    /// ([`ExportOptions::range`], or an adoption's: [`super::adopt`]).
    pub(super) range: u64,
    /// This process's range for placed segments it adopted (reserved at the first).
    pub(super) adopted_range: Option<PlacedRange>,
    next_segment: SegmentId,
    pub(super) pending: HashMap<BufferId, OnFree>,
    /// The serving figures (the book keeps its own).
    pub(super) figures: ExportFigures,
    /// Taking no importer (the memory it serves sleeps): [`Exporter::pause_if_unused`].
    pub(super) paused: bool,
}

impl State {
    pub(super) fn add_segment(&mut self, segment: Arc<dyn ShareableSegment>) -> SegmentId {
        self.next_segment += 1;
        if let Some(at) = segment.at() {
            self.placed.insert(at, self.next_segment);
        }
        self.segments.insert(self.next_segment, segment);
        self.next_segment
    }

    /// The placed segment that lies at `at` with `size` bytes, `Ok(None)` where none lies
    /// within `at .. at + size`, `Err` where another one overlaps it.
    pub(super) fn placed_at(&self, at: u64, size: u64) -> Result<Option<SegmentId>, ()> {
        let size_of = |id: &SegmentId| self.segments.get(id).map_or(0, |s| s.size());
        let end = at.saturating_add(size);
        match self.placed.range(..end).next_back() {
            Some((&start, id)) if start == at && size_of(id) == size => Ok(Some(*id)),
            Some((&start, id)) if start.saturating_add(size_of(id)) > at => Err(()),
            _ => Ok(None),
        }
    }

    /// The segments `spec` lies in: its own, and for a placed segment the placed segments
    /// after it that the buffer runs into, one after the other.
    ///
    /// # Errors
    /// [`ShareError::Invalid`] for a segment not exported or a range outside the segments.
    pub(super) fn segments_of(&self, spec: &BufferSpec) -> Result<Vec<SegmentId>, ShareError> {
        let Some(segment) = self.segments.get(&spec.segment) else {
            return Err(ShareError::invalid(
                "segment",
                format!("segment {} is not exported", spec.segment),
            ));
        };
        let outside = || {
            ShareError::invalid(
                "buffer",
                format!(
                    "{} bytes at {} pass segment {}'s {} bytes",
                    spec.size,
                    spec.offset,
                    spec.segment,
                    segment.size()
                ),
            )
        };
        if spec.fits(segment.size()) {
            return Ok(vec![spec.segment]);
        }
        let at = segment.at().ok_or_else(outside)?;
        let end = at
            .checked_add(spec.offset)
            .and_then(|s| s.checked_add(spec.size))
            .ok_or_else(outside)?;
        let mut ids = vec![spec.segment];
        let mut next = at + segment.size();
        while next < end {
            let id = *self.placed.get(&next).ok_or_else(outside)?;
            ids.push(id);
            next += self.segments.get(&id).map_or(0, |s| s.size()).max(1);
        }
        Ok(ids)
    }

    /// Checks and exports `spec` as `name`.
    pub(super) fn publish(&mut self, name: &str, spec: BufferSpec) -> Result<BufferId, ShareError> {
        check_text(name, limits::NAME, false, "name")
            .map_err(|e| ShareError::invalid("name", e.to_string()))?;
        spec.check()
            .map_err(|e| ShareError::invalid("buffer", e.to_string()))?;
        let ids = self.segments_of(&spec)?;
        if let Some(id) = ids
            .iter()
            .find(|id| !spec.readonly && !self.segments.get(id).is_some_and(|s| s.writable()))
        {
            return Err(ShareError::invalid(
                "readonly",
                format!("segment {id} is exported read-only"),
            ));
        }
        self.book.publish(name, spec)
    }

    /// Takes the frees of `freed` buffers, to run outside the lock.
    pub(super) fn take_frees(&mut self, freed: &[BufferId]) -> Vec<OnFree> {
        freed
            .iter()
            .filter_map(|id| self.pending.remove(id))
            .collect()
    }

    fn figures(&self) -> ExportFigures {
        let BookFigures {
            names,
            leases,
            deferred_frees,
            deferred_total,
            frees_after_wait,
        } = self.book.figures();
        ExportFigures {
            segments: self.segments.len() as u64,
            names,
            leases,
            deferred_frees,
            deferred_total,
            frees_after_wait,
            ..self.figures
        }
    }
}

/// What the exporter's callers and its thread share.
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    pub(super) options: ExportOptions,
    pub(super) stop: AtomicBool,
}

/// Shares segments and named buffers with importers of the same user, on a Unix socket.
///
/// Each segment is exported once, as a descriptor; each importer receives a segment's
/// descriptor once, with the first name it resolves in it, and maps it once. A free of an
/// exported buffer ([`Exporter::free`]) waits for the importers that hold it. Dropping the
/// exporter stops its thread and removes its socket; importers keep what they map, and frees
/// still waiting are dropped unrun (their blocks stay out of use).
pub struct Exporter {
    shared: Arc<Shared>,
    path: PathBuf,
    waker: Channel,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("path", &self.path)
            .field("figures", &self.figures())
            .finish()
    }
}

impl Exporter {
    /// Starts an exporter listening at `path`.
    ///
    /// # Errors
    /// [`ShareError::NameTaken`] when a live exporter listens there; the I/O error of the
    /// socket or of starting the thread.
    pub fn start(path: &Path, options: ExportOptions) -> Result<Exporter, ShareError> {
        let listener = Listener::bind(path)?;
        let (waker, wake) = transport::pair()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                book: Book::new(),
                segments: BTreeMap::new(),
                placed: BTreeMap::new(),
                range: options.range,
                adopted_range: None,
                next_segment: 0,
                pending: HashMap::new(),
                figures: ExportFigures::default(),
                paused: false,
            }),
            options,
            stop: AtomicBool::new(false),
        });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("rrmm-share".into())
                .spawn(move || super::serve::run(&shared, &listener, &wake))
                .map_err(|e| ShareError::io("starting the exporter's thread", e))?
        };
        Ok(Exporter {
            shared,
            path: path.to_path_buf(),
            waker,
            thread: Some(thread),
        })
    }

    /// Starts an exporter named `name` in the ledger directory `dir` (checked: only its user
    /// can reach it), where importers find it by that name.
    ///
    /// # Errors
    /// As [`Exporter::start`]; [`ShareError::Invalid`] for a name that cannot name a socket.
    pub fn in_ledger(
        dir: &LedgerDir,
        name: &str,
        options: ExportOptions,
    ) -> Result<Exporter, ShareError> {
        Exporter::start(&super::socket_path(dir, name)?, options)
    }

    /// The socket importers attach to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Exports `segment` (its descriptor is made once: when the segment was, or when an
    /// importer first needs it); its number.
    pub fn add_segment(&self, segment: impl ShareableSegment + 'static) -> SegmentId {
        self.shared.state.lock().add_segment(Arc::new(segment))
    }

    /// Puts segment `id` in place of the one it numbers (a page made anew at the same place:
    /// its names stay, importers that attach later map the new one); `false` for a number
    /// not exported.
    pub fn replace_segment(&self, id: SegmentId, segment: impl ShareableSegment + 'static) -> bool {
        let mut state = self.shared.state.lock();
        match state.segments.get_mut(&id) {
            Some(slot) => {
                *slot = Arc::new(segment);
                true
            }
            None => false,
        }
    }

    /// Stops taking importers when none is connected, atomically with the look: `true` when
    /// paused (connections are refused as busy until [`resume`](Self::resume)), `false` with
    /// an importer connected (it may map the segments).
    pub fn pause_if_unused(&self) -> bool {
        let mut state = self.shared.state.lock();
        if state.figures.importers > 0 {
            return false;
        }
        state.paused = true;
        true
    }

    /// Takes importers again after [`pause_if_unused`](Self::pause_if_unused).
    pub fn resume(&self) {
        self.shared.state.lock().paused = false;
    }

    /// The importers holding the buffer exported as `name` now (0 for a name not exported).
    pub fn holders(&self, name: &str) -> usize {
        let state = self.shared.state.lock();
        state
            .book
            .get(name)
            .map_or(0, |(id, _)| state.book.holders(id))
    }

    /// The segment numbered `id`.
    pub fn segment(&self, id: SegmentId) -> Option<Arc<dyn ShareableSegment>> {
        self.shared.state.lock().segments.get(&id).cloned()
    }

    /// Exports a buffer under `name`.
    ///
    /// # Errors
    /// [`ShareError::NameTaken`]; [`ShareError::Invalid`] for a name or dtype that is not
    /// text within its limit, a shape of too many dimensions, a segment not exported, a range
    /// outside it, or a writable buffer in a read-only segment.
    pub fn publish(&self, name: &str, spec: BufferSpec) -> Result<(), ShareError> {
        self.shared.state.lock().publish(name, spec).map(|_| ())
    }

    /// Frees the buffer exported as `name`: the name resolves no more, and `on_free` (which
    /// gives its block back for reuse) runs now when no importer holds it, or, on the
    /// exporter's thread, when the last importer holding it lets go or dies.
    ///
    /// # Errors
    /// [`ShareError::UnknownName`] (and `on_free` does not run).
    pub fn free(
        &self,
        name: &str,
        on_free: impl FnOnce() + Send + 'static,
    ) -> Result<FreeOutcome, ShareError> {
        let outcome = {
            let mut state = self.shared.state.lock();
            let (id, withdrawal) = state.book.withdraw(name)?;
            match withdrawal {
                Withdrawal::Free => FreeOutcome::Now,
                Withdrawal::Deferred { holders } => {
                    state.pending.insert(id, Box::new(on_free));
                    return Ok(FreeOutcome::Deferred { holders });
                }
            }
        };
        on_free();
        Ok(outcome)
    }

    /// Withdraws `name` with nothing to run when it is free ([`Exporter::free`]).
    ///
    /// # Errors
    /// [`ShareError::UnknownName`].
    pub fn withdraw(&self, name: &str) -> Result<FreeOutcome, ShareError> {
        self.free(name, || {})
    }

    /// The names exported now, in order.
    pub fn names(&self) -> Vec<String> {
        self.shared.state.lock().book.names_after("", usize::MAX).0
    }

    /// The buffer exported as `name` now.
    pub fn spec(&self, name: &str) -> Option<BufferSpec> {
        self.shared
            .state
            .lock()
            .book
            .get(name)
            .map(|(_, s)| s.clone())
    }

    /// The figures now.
    pub fn figures(&self) -> ExportFigures {
        self.shared.state.lock().figures()
    }

    /// Waits until `done(figures)` holds or `timeout` passes; whether it held (tests and
    /// callers that wait for importers to let go).
    pub fn wait_for(&self, timeout: Duration, done: impl Fn(&ExportFigures) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if done(&self.figures()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = self
            .waker
            .send(b"stop", &[], Instant::now() + Duration::from_secs(1));
        if let Some(thread) = self.thread.take() {
            // Dropped on its own thread (a free it ran let go of the last handle of what owns
            // it): that thread ends once this returns; it cannot wait for itself.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}
