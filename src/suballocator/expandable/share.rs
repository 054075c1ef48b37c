//! Sharing an expandable pool's memory with other processes (issue 49): export once, map once.
//!
//! A pool made shareable ([`ExpandableOptions::shareable`]) maps pages that other processes can
//! map too: the driver's shareable handle on a device, a memory file per page on the host (the
//! CPU stand-in, [`HostVirtualMemory::shareable`]). [`ExpandableMemoryResource::publish`] starts
//! an [`Exporter`] for the pool ([`PoolExport`]); [`PoolExport::name`] names a block of the pool
//! as a buffer. Each page a named buffer lies on becomes a segment once, placed at its offset in
//! the pool's range ([`ShareableSegment::at`]); its descriptor is made when an importer first
//! needs it. Importers reserve the pool's range size once and map each page at its own offset,
//! so a buffer across pages is contiguous there as here, and an address translates by one base
//! difference.
//!
//! # Lifetimes
//! - A free of a named block ([`MemoryResource::deallocate`], which CuPy, PyTorch and
//!   `DeviceBuffer` call) withdraws its names and runs once the last importer holding one of
//!   them lets go or dies ([`Exporter::free`]); until then the block stays allocated (the
//!   pool's allocated bytes count it) and [`PoolShareFigures::deferred_free_bytes`] counts it.
//! - A page that was exported stays mapped while the pool is published: the trim skips it
//!   ([`PoolShareFigures::kept_pages`]). A sleep is refused while an importer is attached (it
//!   may map them); with none attached, attaching is refused until the wake, the pages'
//!   descriptors are let go with their memory, and the pages made at the wake are exported
//!   under the same segments and names.
//! - [`PoolExport::close`] stops serving: a named block that an importer still holds is kept
//!   out of use for good (its free does nothing; the importer may still read it), and frees
//!   still waiting never run ([`PoolShareFigures::held_out_of_use_bytes`]).
//!
//! Allocation does not look at any of this; a free of a pool with no named block reads one
//! atomic.
//!
//! [`ExpandableOptions::shareable`]: super::ExpandableOptions::shareable
//! [`HostVirtualMemory::shareable`]: crate::resource::HostVirtualMemory::shareable
//! [`MemoryResource::deallocate`]: crate::resource::MemoryResource::deallocate

use super::{ExpandableMemoryResource, Inner};
use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::resource::{MemoryKind, VirtualMemory};
use crate::shared_memory::{
    BufferSpec, ExportFigures, ExportOptions, Exporter, FreeOutcome, SegmentId, SegmentKind,
    ShareError, ShareableSegment,
};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

/// A page of the pool as a segment: exported (its descriptor made) when an importer first
/// needs it, once.
#[derive(Debug)]
struct PageSegment {
    vm: Arc<dyn VirtualMemory>,
    addr: usize,
    size: u64,
    kind: SegmentKind,
    fd: OnceLock<OwnedFd>,
}

impl ShareableSegment for PageSegment {
    fn kind(&self) -> SegmentKind {
        self.kind
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn base(&self) -> usize {
        self.addr
    }

    fn writable(&self) -> bool {
        true
    }

    fn descriptor(&self) -> std::result::Result<BorrowedFd<'_>, ShareError> {
        if self.fd.get().is_none() {
            // Two threads may export at once: one descriptor is kept, the other closed.
            let _ = self.fd.set(self.vm.export_page(self.addr)?);
        }
        self.fd
            .get()
            .map(AsFd::as_fd)
            .ok_or_else(|| ShareError::Protocol("a page's descriptor was not kept".into()))
    }

    fn at(&self) -> Option<u64> {
        Some((self.addr - self.vm.base()) as u64)
    }
}

/// A shareable pool's record of what it shares: the one owner of which pages are kept and
/// which blocks are named (the trim, the free and the sleep ask it).
#[derive(Debug, Default)]
pub(crate) struct PoolShare {
    /// The publication, while there is one.
    exporter: Mutex<Option<Publication>>,
    /// Pages exported (kept mapped while published): address -> segment.
    pages: Mutex<BTreeMap<usize, SegmentId>>,
    /// Named blocks and blocks held out of use: start -> record.
    blocks: Mutex<HashMap<usize, Named>>,
    /// `blocks.len()`, read without the lock by every free.
    watched: AtomicUsize,
    deferred_bytes: AtomicUsize,
    deferred_blocks: AtomicUsize,
    held_out_of_use: AtomicUsize,
    /// Publications made, so a closed one's handle reaches no later one.
    generation: AtomicU64,
}

#[derive(Debug)]
struct Publication {
    exporter: Arc<Exporter>,
    generation: u64,
}

/// A named block: its names (each withdrawn at its free), or held out of use for good.
#[derive(Debug, Default)]
struct Named {
    names: Vec<String>,
    held_out_of_use: bool,
}

/// A free that waits for the importers of a block's names: the block goes back to the pool
/// when the last name's free runs; dropped unrun (the exporter closed), it is held out of use.
struct PendingFree {
    pool: Weak<Inner>,
    share: Weak<PoolShare>,
    ptr: usize,
    bytes: usize,
    stream: Stream,
    left: AtomicUsize,
    deferred: AtomicBool,
    done: AtomicBool,
}

impl PendingFree {
    /// One name's free ran (or needed none): the last one frees the block.
    fn one_done(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.done.store(true, Ordering::Release);
        if let Some(inner) = self.pool.upgrade() {
            let pool = ExpandableMemoryResource { inner };
            // A free that fails here has nobody to tell: the pool's own checks refused it.
            let _ = pool.deallocate_now(self.ptr, self.bytes, self.stream);
        }
        // Counted as waiting until the pool has it back: a caller that sees no free waiting
        // sees the block free.
        if self.deferred.load(Ordering::Acquire) {
            if let Some(share) = self.share.upgrade() {
                share
                    .deferred_bytes
                    .fetch_sub(self.bytes, Ordering::Release);
                share.deferred_blocks.fetch_sub(1, Ordering::Release);
            }
        }
    }
}

impl Drop for PendingFree {
    fn drop(&mut self) {
        if !self.done.load(Ordering::Acquire) {
            if let Some(share) = self.share.upgrade() {
                if self.deferred.load(Ordering::Acquire) {
                    share
                        .deferred_bytes
                        .fetch_sub(self.bytes, Ordering::Relaxed);
                    share.deferred_blocks.fetch_sub(1, Ordering::Relaxed);
                }
                share
                    .held_out_of_use
                    .fetch_add(self.bytes, Ordering::Relaxed);
            }
        }
    }
}

/// What a shareable pool shares, one record (the Python dict comes from this declaration).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PoolShareFigures {
    /// The exporter's figures (segments, names, importers, leases, frees that waited...).
    #[serde(flatten)]
    pub export: ExportFigures,
    /// Pages exported, kept mapped while the pool is published (the trim skips them).
    pub kept_pages: u64,
    /// Their bytes.
    pub kept_bytes: u64,
    /// Blocks freed by the pool's user whose free waits for importers.
    pub deferred_free_blocks: u64,
    /// Their bytes (still allocated in the pool's figures).
    pub deferred_free_bytes: u64,
    /// Bytes of blocks kept out of use for good: held by an importer when the publication
    /// closed, or freed and waiting then.
    pub held_out_of_use_bytes: u64,
}

impl PoolShareFigures {
    /// Its fields by name (the Python dict; every field once, from the one declaration).
    pub fn to_map(&self) -> serde_json::Map<String, serde_json::Value> {
        crate::shared_memory::exporter::fields_of(self)
    }
}

impl PoolShare {
    /// Whether a free must look at the named blocks (one atomic load).
    #[inline]
    pub(crate) fn watching(&self) -> bool {
        self.watched.load(Ordering::Acquire) > 0
    }

    /// The ranges of `lo .. hi` (whole pages) that hold no kept page, lowest first: what the
    /// trim may unmap.
    pub(crate) fn unkept(&self, lo: usize, hi: usize, page: usize) -> Vec<(usize, usize)> {
        let pages = self.pages.lock();
        let mut out = Vec::new();
        let mut at = lo;
        for &kept in pages.range(lo..hi).map(|(a, _)| a) {
            if kept > at {
                out.push((at, kept));
            }
            at = kept + page;
        }
        if hi > at {
            out.push((at, hi));
        }
        out
    }

    /// Starts a sleep of a pool with exported pages: refused while an importer is connected
    /// (it may map them; the sleep would unmap them under it). With none, the publication
    /// takes no importer until [`end_sleep`](Self::end_sleep), and each exported page's
    /// descriptor is let go (the sleep releases its memory); the page made at the wake is
    /// exported under the same segment at the next need, so every name stays and importers
    /// attach again as before.
    pub(crate) fn begin_sleep(&self, vm: &Arc<dyn VirtualMemory>) -> Result<()> {
        let pages = self.pages.lock();
        if pages.is_empty() {
            return Ok(());
        }
        let exporter = self.exporter.lock().as_ref().map(|p| p.exporter.clone());
        let Some(exporter) = exporter else {
            return Ok(());
        };
        if !exporter.pause_if_unused() {
            let importers = exporter.figures().importers;
            return Err(Error::Logic(format!(
                "expandable: {} pages are exported and {importers} importers are attached \
                 (they may map them); the pool sleeps once they close their attachments",
                pages.len()
            )));
        }
        for (&addr, &id) in pages.iter() {
            if let Some(old) = exporter.segment(id) {
                exporter.replace_segment(
                    id,
                    PageSegment {
                        vm: vm.clone(),
                        addr,
                        size: old.size(),
                        kind: old.kind(),
                        fd: OnceLock::new(),
                    },
                );
            }
        }
        Ok(())
    }

    /// Ends what [`begin_sleep`](Self::begin_sleep) began (the pool woke, or its sleep was
    /// refused or undone): the publication takes importers again.
    pub(crate) fn end_sleep(&self) {
        if let Some(p) = self.exporter.lock().as_ref() {
            p.exporter.resume();
        }
    }

    /// A free of `ptr` by the pool's user: `true` when the share took it (a named block:
    /// its free waits for the importers, or a block held out of use), `false` when the pool
    /// frees it now.
    pub(crate) fn take_free(
        self: &Arc<Self>,
        pool: &Weak<Inner>,
        ptr: usize,
        bytes: usize,
        stream: Stream,
    ) -> bool {
        let named = {
            let mut blocks = self.blocks.lock();
            match blocks.remove(&ptr) {
                Some(named) => {
                    self.watched.store(blocks.len(), Ordering::Release);
                    named
                }
                None => return false,
            }
        };
        let exporter = self.exporter.lock().as_ref().map(|p| p.exporter.clone());
        let exporter = match exporter {
            Some(e) if !named.held_out_of_use => e,
            _ => {
                // Held out of use for good: an importer may still read it.
                self.held_out_of_use.fetch_add(bytes, Ordering::Relaxed);
                return true;
            }
        };
        let pending = Arc::new(PendingFree {
            pool: pool.clone(),
            share: Arc::downgrade(self),
            ptr,
            bytes,
            stream,
            // One more than the names: the last `one_done` below, after every name's free.
            left: AtomicUsize::new(named.names.len() + 1),
            deferred: AtomicBool::new(false),
            done: AtomicBool::new(false),
        });
        for name in &named.names {
            let on_free = {
                let pending = pending.clone();
                move || pending.one_done()
            };
            match exporter.free(name, on_free) {
                Ok(FreeOutcome::Deferred { .. }) => {
                    if !pending.deferred.swap(true, Ordering::AcqRel) {
                        self.deferred_bytes.fetch_add(bytes, Ordering::Relaxed);
                        self.deferred_blocks.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(FreeOutcome::Now) => {}
                // Withdrawn already (by another path): nothing to wait for.
                Err(_) => pending.one_done(),
            }
        }
        pending.one_done();
        true
    }

    fn publication(&self, generation: u64) -> Result<Arc<Exporter>> {
        match &*self.exporter.lock() {
            Some(p) if p.generation == generation => Ok(p.exporter.clone()),
            _ => Err(Error::Logic(
                "the pool's publication is closed (publish() it again)".into(),
            )),
        }
    }
}

impl ExpandableMemoryResource {
    /// Whether the pool's pages can be shared with other processes (made with
    /// [`ExpandableOptions::shareable`](super::ExpandableOptions::shareable)).
    pub fn is_shareable(&self) -> bool {
        self.inner.share.is_some()
    }

    /// The key of the ledger directory its exporter's socket lies in: the device's UUID, or
    /// `host` for host memory.
    ///
    /// # Errors
    /// The driver's error of the device's UUID.
    pub fn share_key(&self) -> Result<String> {
        match (self.inner.vm.kind(), self.inner.vm.device()) {
            (MemoryKind::Device, Some(device)) => crate::cuda::device_uuid(device),
            _ => Ok("host".to_string()),
        }
    }

    /// Starts serving the pool's memory to other processes of this user on a socket at `path`
    /// (one publication at a time); name buffers with [`PoolExport::name`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a pool that is not shareable or published already; the
    /// exporter's errors (a live exporter at `path`).
    pub fn publish(&self, path: &Path, mut options: ExportOptions) -> Result<PoolExport> {
        let share = self.inner.share.as_ref().ok_or_else(|| {
            Error::invalid(
                "publish",
                "the pool is not shareable: build it with shareable=True",
            )
        })?;
        let mut slot = share.exporter.lock();
        if slot.is_some() {
            return Err(Error::invalid(
                "publish",
                "the pool is published already (one publication at a time)",
            ));
        }
        options.range = self.inner.vm.reserved_bytes() as u64;
        let exporter = Arc::new(Exporter::start(path, options)?);
        let generation = share.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *slot = Some(Publication {
            exporter,
            generation,
        });
        Ok(PoolExport {
            pool: self.clone(),
            generation,
        })
    }

    /// The figures of what the pool shares (`None` for a pool that is not shareable).
    pub fn share_figures(&self) -> Option<PoolShareFigures> {
        let share = self.inner.share.as_ref()?;
        let export = share
            .exporter
            .lock()
            .as_ref()
            .map(|p| p.exporter.figures())
            .unwrap_or_default();
        let kept_pages = share.pages.lock().len() as u64;
        Some(PoolShareFigures {
            export,
            kept_pages,
            kept_bytes: kept_pages * self.page_size() as u64,
            deferred_free_blocks: share.deferred_blocks.load(Ordering::Acquire) as u64,
            deferred_free_bytes: share.deferred_bytes.load(Ordering::Acquire) as u64,
            held_out_of_use_bytes: share.held_out_of_use.load(Ordering::Relaxed) as u64,
        })
    }
}

/// A published expandable pool: names its blocks for importers (cheap to clone; the pool keeps
/// the publication until [`close`](Self::close) or its own drop).
#[derive(Clone, Debug)]
pub struct PoolExport {
    pool: ExpandableMemoryResource,
    generation: u64,
}

impl PoolExport {
    fn share(&self) -> Result<&Arc<PoolShare>> {
        self.pool
            .inner
            .share
            .as_ref()
            .ok_or_else(|| Error::Logic("the pool is not shareable".into()))
    }

    fn exporter(&self) -> Result<Arc<Exporter>> {
        self.share()?.publication(self.generation)
    }

    /// The pool.
    pub fn pool(&self) -> &ExpandableMemoryResource {
        &self.pool
    }

    /// The socket importers attach to.
    ///
    /// # Errors
    /// [`Error::Logic`] once closed.
    pub fn path(&self) -> Result<std::path::PathBuf> {
        Ok(self.exporter()?.path().to_path_buf())
    }

    /// Names `size` bytes at `ptr` (in a block the pool handed out and has not freed: its
    /// start, or a view into it) as the buffer `name`, holding `dtype` elements in `shape`
    /// (C order), read-only for importers when `readonly`. Each page it lies on is exported
    /// once and kept mapped while the pool is published. A block may carry several names; its
    /// free waits for the importers of all of them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a pointer in no live block of the pool, a buffer that
    /// runs past its block's end, a name exported already or not valid, a dtype or shape past
    /// their limits; [`Error::Logic`] once closed.
    ///
    /// # Time Complexity
    /// O(lists + pages of the buffer · log pages) for a block's start; O(blocks) more for a
    /// view into a block.
    pub fn name(
        &self,
        name: &str,
        ptr: usize,
        size: usize,
        dtype: &str,
        shape: &[u64],
        readonly: bool,
    ) -> Result<()> {
        let share = self.share()?;
        let exporter = self.exporter()?;
        let pool = &self.pool;
        if pool.inner.sleep.asleep() {
            return Err(Error::Logic(
                "the pool sleeps: name its blocks once it is awake (restore())".into(),
            ));
        }
        let (start, block) = pool.inner.core.allocated_holding(ptr).ok_or_else(|| {
            Error::invalid(
                "ptr",
                format!("{ptr:#x} lies in no live block of this pool (name its memory only)"),
            )
        })?;
        let room = block - (ptr - start);
        if size == 0 || size > room {
            return Err(Error::invalid(
                "size",
                format!(
                    "{size} bytes at {ptr:#x}: the block at {start:#x} has {room} from there (and \
                     a buffer has some)"
                ),
            ));
        }
        let page = pool.page_size();
        let vm = &pool.inner.vm;
        // Pages lie at the reservation's base plus multiples of the page size (the base need
        // not be aligned to a page: a host reservation is aligned to the system's pages).
        let base = vm.base();
        let first = base + (ptr - base) / page * page;
        let last = base + (ptr + size - 1 - base) / page * page;
        let kind = match vm.kind() {
            MemoryKind::Device => SegmentKind::CudaFd,
            _ => SegmentKind::Memfd,
        };
        let first_id = {
            let mut pages = share.pages.lock();
            let mut first_id = 0;
            for addr in (first..=last).step_by(page) {
                let id = match pages.get(&addr) {
                    Some(&id) => id,
                    None => {
                        let id = exporter.add_segment(PageSegment {
                            vm: vm.clone(),
                            addr,
                            size: page as u64,
                            kind,
                            fd: OnceLock::new(),
                        });
                        pages.insert(addr, id);
                        id
                    }
                };
                if addr == first {
                    first_id = id;
                }
            }
            first_id
        };
        let spec = BufferSpec {
            segment: first_id,
            offset: (ptr - first) as u64,
            size: size as u64,
            dtype: dtype.to_string(),
            shape: shape.to_vec(),
            readonly,
        };
        exporter.publish(name, spec)?;
        let mut blocks = share.blocks.lock();
        blocks
            .entry(start)
            .or_default()
            .names
            .push(name.to_string());
        share.watched.store(blocks.len(), Ordering::Release);
        Ok(())
    }

    /// The names exported now, in order.
    ///
    /// # Errors
    /// [`Error::Logic`] once closed.
    pub fn names(&self) -> Result<Vec<String>> {
        Ok(self.exporter()?.names())
    }

    /// The figures of what the pool shares.
    pub fn figures(&self) -> PoolShareFigures {
        self.pool.share_figures().unwrap_or_default()
    }

    /// Stops serving: importers keep what they map; a named block an importer still holds is
    /// kept out of use for good, frees still waiting never run (their blocks too), the other
    /// names go, and the pages are the trim's again. Closing twice does nothing.
    pub fn close(&self) {
        let Ok(share) = self.share() else {
            return;
        };
        let publication = {
            let mut slot = share.exporter.lock();
            match &*slot {
                Some(p) if p.generation == self.generation => slot.take(),
                _ => None,
            }
        };
        let Some(publication) = publication else {
            return;
        };
        {
            let mut blocks = share.blocks.lock();
            blocks.retain(|_, named| {
                named.held_out_of_use = named.held_out_of_use
                    || named
                        .names
                        .iter()
                        .any(|n| publication.exporter.holders(n) > 0);
                named.held_out_of_use
            });
            share.watched.store(blocks.len(), Ordering::Release);
        }
        share.pages.lock().clear();
        // The last handle of the exporter: its thread stops, the frees waiting are dropped.
        drop(publication);
    }
}

impl std::fmt::Debug for PendingFree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFree")
            .field("ptr", &self.ptr)
            .field("bytes", &self.bytes)
            .finish()
    }
}

#[cfg(test)]
mod tests;
