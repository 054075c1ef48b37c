//! Disk backups: a sleeping pool's bytes in files of a directory instead of host memory
//! (torch_memory_saver's `enable_disk_backup`), for data larger than the host's memory or not
//! worth holding there.
//!
//! A sleep with a [`DiskTarget`] makes one file per live block it keeps (space reserved with
//! `fallocate` first, so a full disk refuses the sleep before anything moves) and streams the
//! bytes through a ring of [`STAGING_CHUNKS`] chunks in one range of the host page supply
//! (pinned for a device): the host memory a transition holds while it moves, which the supply
//! keeps for the next transition as it keeps any range. The device copies a chunk into a free
//! chunk of the ring while I/O threads write the chunks before it, each at its file offset, so
//! the disk is busy from the first chunk to the last and the sleep runs at the slower of the
//! link and the disk. The file calls go `O_DIRECT`: no copy into the page cache and no
//! writeback left for the sync at the end (buffered writes left the disk idle until that
//! sync). A chunk's file offset, length and address in the ring are aligned to a page for
//! it; an unaligned head or tail, and every call where the file system refuses `O_DIRECT`
//! (tmpfs), goes buffered. A stream's first chunk is a quarter chunk, so that the disk waits
//! only for a short copy before its first write. Once written, the files are synced and
//! their pages dropped from the page cache (`fadvise(DONTNEED)`). The wake checks every file
//! is there with its length before it maps a page (a file that vanished or shrank is an
//! error and the pool stays asleep with its files), then the I/O threads read chunks ahead
//! into the ring while the device copies the ones before them (a stream's last chunk a
//! quarter chunk: the disk waits only for a short copy after its last read). The files are
//! removed when the copy is dropped (after a wake, or with the pool).
//!
//! `unsafe` here is the FFI edge only: the ring's chunks are host memory at raw addresses,
//! seen as byte slices for the file calls.

use super::registered::{HostPageSupply, HostPages, PageSpec};
use crate::error::{Error, Result};
use crate::resource::{CopyFence, Toward, VirtualMemory};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

/// Bytes of one staging chunk unless the target says (a ring of [`STAGING_CHUNKS`] is held
/// while a sleep or wake streams).
pub const DEFAULT_DISK_CHUNK_BYTES: usize = 64 << 20;

/// Staging chunks a transition streams through, a ring (fewer for a copy of fewer chunks):
/// the host memory a disk backup holds while it moves is at most this many chunks (each
/// rounded up to a page). Two: one being filled while the other is written or read, and two
/// file calls in flight; more measured no faster (see `disk_backup_rates`).
pub const STAGING_CHUNKS: usize = 2;

/// Threads that make a stream's file calls, each one chunk's call at a time (an `O_DIRECT`
/// call of a chunk already keeps many requests in flight).
const IO_THREADS: usize = 2;

/// Where a sleep writes its bytes: a directory (it must exist and be writable) and the bytes
/// of each of the chunks the copies stream through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskTarget {
    /// The directory the files are made in.
    pub dir: PathBuf,
    /// Bytes per staging chunk.
    pub chunk_bytes: usize,
    /// Tests: a write that would pass this many bytes of the copy fails as a full disk would.
    #[cfg(test)]
    fail_writes_after: Option<usize>,
    /// Tests: the ring's chunks, the I/O threads, and whether calls may go `O_DIRECT`.
    #[cfg(test)]
    io_shape: Option<(usize, usize, bool)>,
}

impl DiskTarget {
    /// A target in `dir` streaming through chunks of `chunk_bytes` (default
    /// [`DEFAULT_DISK_CHUNK_BYTES`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a chunk of 0 bytes.
    pub fn new(dir: impl Into<PathBuf>, chunk_bytes: Option<usize>) -> Result<DiskTarget> {
        let chunk_bytes = chunk_bytes.unwrap_or(DEFAULT_DISK_CHUNK_BYTES);
        if chunk_bytes == 0 {
            return Err(Error::invalid(
                "disk_chunk_bytes",
                "must be at least 1 byte",
            ));
        }
        Ok(DiskTarget {
            dir: dir.into(),
            chunk_bytes,
            #[cfg(test)]
            fail_writes_after: None,
            #[cfg(test)]
            io_shape: None,
        })
    }

    /// The ring's chunks, the I/O threads per stream, and whether calls may go `O_DIRECT`.
    fn io_shape(&self) -> (usize, usize, bool) {
        #[cfg(test)]
        if let Some(shape) = self.io_shape {
            return shape;
        }
        (STAGING_CHUNKS, IO_THREADS, true)
    }

    /// Tests: streams through `ring` chunks with `threads` I/O threads, `direct` or buffered.
    #[cfg(test)]
    pub(crate) fn with_io(mut self, ring: usize, threads: usize, direct: bool) -> DiskTarget {
        self.io_shape = Some((ring, threads, direct));
        self
    }

    /// Tests: writes past `bytes` of the copy fail with `ENOSPC`.
    #[cfg(test)]
    pub(crate) fn failing_after(mut self, bytes: usize) -> DiskTarget {
        self.fail_writes_after = Some(bytes);
        self
    }

    /// Refuses a directory that is missing or not a directory.
    fn check_dir(&self) -> Result<()> {
        match std::fs::metadata(&self.dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(Error::invalid(
                "disk_dir",
                format!("{} is not a directory", self.dir.display()),
            )),
            Err(e) => Err(Error::invalid(
                "disk_dir",
                format!("the disk backup directory {}: {e}", self.dir.display()),
            )),
        }
    }
}

/// A piece of a stream: `n` bytes (at most a chunk) of file `file` at `file_off`, at the device
/// address `dev`, held in its staging chunk from `pad`: the file offset's remainder of the
/// direct alignment (0 without direct calls), so that the aligned part of the piece sits at an
/// aligned address (`pad + n` is at most the step, see [`DiskCopy::pieces`]).
#[derive(Clone, Copy, Debug)]
struct Chunk {
    file: usize,
    file_off: usize,
    dev: usize,
    n: usize,
    pad: usize,
}

/// One file of a disk backup: the copy's bytes `off .. off + len`.
#[derive(Debug)]
struct BackupFile {
    path: PathBuf,
    off: usize,
    len: usize,
}

/// A file of the copy opened for a transition: a buffered handle (unaligned heads and tails,
/// the sync, the page cache advice; everything where `O_DIRECT` is refused) and an `O_DIRECT`
/// one where the file system takes it.
#[derive(Debug)]
struct OpenFile {
    buffered: File,
    direct: Option<File>,
    /// A direct call was refused (see [`OpenFile::direct_calls`]): the rest goes buffered.
    refused: AtomicBool,
}

impl OpenFile {
    /// The part `head .. head + mid` of a call of `n` bytes at file offset `off` from memory at
    /// `addr` that goes `O_DIRECT` (aligned to `align` in the file, in length and in memory);
    /// `mid` is 0 when none does.
    fn direct_part(
        &self,
        addr: usize,
        off: usize,
        n: usize,
        align: Option<usize>,
    ) -> (usize, usize) {
        let Some(a) = align.filter(|_| self.direct.is_some() && !self.refused.load(Relaxed)) else {
            return (0, 0);
        };
        let head = ((a - off % a) % a).min(n);
        let mid = (n - head) / a * a;
        if (addr + head) % a == 0 {
            (head, mid)
        } else {
            (0, 0)
        }
    }

    /// Runs `call` (a direct read or write at a file offset) over `buf`'s bytes `from .. to`
    /// at file offset `off + from` until it has moved them all, and returns how far it got:
    /// short of `to` when the call was refused (`EINVAL`, `EFAULT` for memory a direct call
    /// cannot pin, `EOPNOTSUPP`: the rest goes buffered from then on) or a call moved nothing
    /// or an unaligned count (the buffered calls that move the rest report what is wrong).
    fn direct_calls(
        &self,
        (from, to): (usize, usize),
        off: usize,
        align: usize,
        mut call: impl FnMut(&File, usize, usize, u64) -> std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        let Some(direct) = self.direct.as_ref() else {
            return Ok(from);
        };
        let mut done = from;
        while done < to {
            match call(direct, done, to, (off + done) as u64) {
                Ok(0) => break,
                Ok(k) => {
                    done += k;
                    if k % align != 0 {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // Refused for this file, memory or offset (not a failure of the disk): the
                // buffered calls take the rest, and report it if they fail too.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINVAL | libc::EFAULT | libc::EOPNOTSUPP)
                    ) =>
                {
                    self.refused.store(true, Relaxed);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Writes `buf` at file offset `off`: its aligned middle `O_DIRECT`, the rest buffered.
    fn write_all_at(&self, buf: &[u8], off: usize, align: Option<usize>) -> std::io::Result<()> {
        let (head, mid) = self.direct_part(buf.as_ptr() as usize, off, buf.len(), align);
        let done = match align {
            Some(a) if mid > 0 => {
                self.direct_calls((head, head + mid), off, a, |f, i, j, at| {
                    f.write_at(&buf[i..j], at)
                })?
            }
            _ => 0,
        };
        let done = done.max(head);
        self.buffered.write_all_at(&buf[..head], off as u64)?;
        self.buffered
            .write_all_at(&buf[done..], (off + done) as u64)
    }

    /// Reads `buf.len()` bytes at file offset `off` into `buf`: its aligned middle
    /// `O_DIRECT`, the rest buffered.
    fn read_exact_at(
        &self,
        buf: &mut [u8],
        off: usize,
        align: Option<usize>,
    ) -> std::io::Result<()> {
        let (head, mid) = self.direct_part(buf.as_ptr() as usize, off, buf.len(), align);
        let done = match align {
            Some(a) if mid > 0 => {
                self.direct_calls((head, head + mid), off, a, |f, i, j, at| {
                    f.read_at(&mut buf[i..j], at)
                })?
            }
            _ => 0,
        };
        let done = done.max(head);
        self.buffered.read_exact_at(&mut buf[..head], off as u64)?;
        self.buffered
            .read_exact_at(&mut buf[done..], (off + done) as u64)
    }
}

/// What a transition streaming through the copy holds: the ring of staging chunks, the files
/// it opened, and per staging chunk the fence of the copy into the device still reading it
/// (or, after a failure, of a copy out of the device still writing it).
struct Io {
    /// One range of the supply holding the ring's chunks (one range, so that the supply keeps
    /// it whole for the next transition rather than making chunks anew each time).
    _staging: HostPages,
    /// The address of each chunk of the ring in `_staging`.
    slots: Vec<usize>,
    open: HashMap<usize, OpenFile>,
    fences: Vec<Option<CopyFence>>,
    /// The staging chunk the next stream starts with.
    next: usize,
}

impl Drop for Io {
    fn drop(&mut self) {
        // The ring goes back to the supply only once no copy uses it.
        for f in self.fences.iter_mut().filter_map(Option::take) {
            let _ = f.wait();
        }
    }
}

/// A chunk's file call for an I/O thread: written from, or read into, staging chunk `slot`
/// once `fence` is done (the copy that filled it, or the last copy that read it).
struct Job {
    index: usize,
    slot: usize,
    chunk: Chunk,
    fence: Option<CopyFence>,
}

/// What a stream's I/O threads and the thread that copies share.
#[derive(Default)]
struct Lanes {
    state: Mutex<LaneState>,
    /// A job queued, the queue closed, or a failure.
    work: Condvar,
    /// A job done, or a failure.
    progress: Condvar,
}

#[derive(Default)]
struct LaneState {
    /// Jobs not yet taken, in order.
    queue: VecDeque<Job>,
    /// No more jobs come.
    closed: bool,
    /// The first failure, of the copies or of a file call: the threads take no more jobs.
    error: Option<Error>,
    /// Staging ranges no write uses (a write stream takes them in this order).
    free: VecDeque<usize>,
    /// Which jobs are done, by index (a read stream copies them in order).
    done: Vec<bool>,
}

impl Lanes {
    fn push(&self, job: Job) {
        self.state.lock().queue.push_back(job);
        self.work.notify_one();
    }

    /// Records a failure (the first one is kept) and stops the threads and the copies.
    fn fail(&self, e: Error) {
        self.state.lock().error.get_or_insert(e);
        self.work.notify_all();
        self.progress.notify_all();
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.work.notify_all();
    }

    /// The next job, or `None` once the queue is closed and empty or something failed.
    fn take(&self) -> Option<Job> {
        let mut st = self.state.lock();
        loop {
            if st.error.is_some() {
                return None;
            }
            if let Some(job) = st.queue.pop_front() {
                return Some(job);
            }
            if st.closed {
                return None;
            }
            self.work.wait(&mut st);
        }
    }

    /// An I/O thread: runs jobs until there are none or something failed.
    fn serve(&self, run: &(dyn Fn(&mut Job) -> Result<()> + Sync)) {
        while let Some(mut job) = self.take() {
            match run(&mut job) {
                Ok(()) => {
                    let mut st = self.state.lock();
                    st.free.push_back(job.slot);
                    if let Some(d) = st.done.get_mut(job.index) {
                        *d = true;
                    }
                    drop(st);
                    self.progress.notify_all();
                }
                Err(e) => self.fail(e),
            }
        }
    }

    /// A staging chunk no write uses (waited for), or `None` after a failure.
    fn free_slot(&self) -> Option<usize> {
        let mut st = self.state.lock();
        loop {
            if st.error.is_some() {
                return None;
            }
            if let Some(slot) = st.free.pop_front() {
                return Some(slot);
            }
            self.progress.wait(&mut st);
        }
    }

    /// Waits for job `index` to be done: `false` after a failure.
    fn wait_done(&self, index: usize) -> bool {
        let mut st = self.state.lock();
        loop {
            if st.error.is_some() {
                return false;
            }
            if st.done.get(index).copied().unwrap_or(false) {
                return true;
            }
            self.progress.wait(&mut st);
        }
    }

    /// Ends a stream once its threads are joined: the fences of the jobs never run go back to
    /// their staging chunks (waited for before a chunk is used again or the ring given back);
    /// the first failure.
    fn end(self, fences: &mut [Option<CopyFence>]) -> Result<()> {
        let st = self.state.into_inner();
        for job in st.queue {
            if let (Some(fence), Some(slot)) = (job.fence, fences.get_mut(job.slot)) {
                *slot = Some(fence);
            }
        }
        match st.error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Starts up to `threads` I/O threads in `scope` serving `lanes` with `run`; how many started
/// (the last error when none did).
fn spawn_io<'scope, 'env>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    lanes: &'env Lanes,
    threads: usize,
    run: &'env (dyn Fn(&mut Job) -> Result<()> + Sync),
) -> std::result::Result<usize, std::io::Error> {
    let mut started = 0;
    let mut last = None;
    for _ in 0..threads.max(1) {
        let spawned = std::thread::Builder::new()
            .name("rrmm-disk-io".into())
            .spawn_scoped(scope, move || lanes.serve(run));
        match spawned {
            Ok(_) => started += 1,
            Err(e) => last = Some(e),
        }
    }
    match (started, last) {
        (0, Some(e)) => Err(e),
        _ => Ok(started),
    }
}

/// Runs `copy` on this thread beside `threads` I/O threads serving `lanes` with `run`, then
/// closes the lanes and waits for the I/O threads. A failure of `copy`, or no I/O thread
/// started, stops the lanes (their end reports it).
fn beside_io(
    lanes: &Lanes,
    threads: usize,
    run: &(dyn Fn(&mut Job) -> Result<()> + Sync),
    copy: impl FnOnce() -> Result<()>,
) {
    std::thread::scope(|s| {
        let copied = match spawn_io(s, lanes, threads, run) {
            Ok(_) => copy(),
            Err(e) => Err(Error::Logic(format!(
                "disk backup: starting a thread for the file calls: {e}"
            ))),
        };
        if let Err(e) = copied {
            lanes.fail(e);
        }
        lanes.close();
    });
}

/// A sleep's bytes on disk: files of a [`DiskTarget`]'s directory holding the copy's bytes
/// in offset order (one per kept live block). Removed when dropped.
pub struct DiskCopy {
    target: DiskTarget,
    files: Vec<BackupFile>,
    len: usize,
    supply: &'static HostPageSupply,
    spec: PageSpec,
    /// The alignment of `O_DIRECT` calls (see [`direct_align`]); `None`: every call buffered
    /// (a chunk smaller than it).
    align: Option<usize>,
    /// The bytes a chunk spans in a file: the target's chunk rounded down to the alignment
    /// (every chunk but a stream's first starts aligned).
    step: usize,
    /// Staging ranges in the ring.
    ring: usize,
    /// I/O threads per stream.
    threads: usize,
    io: Mutex<Option<Io>>,
    #[cfg(test)]
    written: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for DiskCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskCopy")
            .field("dir", &self.target.dir)
            .field("files", &self.files.len())
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// The alignment of `O_DIRECT` calls' file offsets, lengths and memory: a page, at least 4 KiB
/// (a multiple of the logical block sizes in use), so that a direct range never shares a page
/// of the page cache with a buffered one.
fn direct_align() -> usize {
    rustix::param::page_size().max(4096)
}

/// The error of file call `doing` on `path` that failed with `e`, for `bytes` bytes: a full
/// disk is out of memory (nothing moved: the caller undoes), a directory that refuses a new
/// file is a bad `disk_dir`, anything else a logic error naming the file.
fn file_error(
    target: &DiskTarget,
    path: &Path,
    doing: &str,
    e: &std::io::Error,
    bytes: usize,
) -> Error {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => Error::out_of_memory(
            bytes,
            format!(
                "disk backup: no room in {} ({doing} {}: {e})",
                target.dir.display(),
                path.display()
            ),
        ),
        Some(libc::ENOENT | libc::ENOTDIR | libc::EACCES | libc::EPERM | libc::EROFS)
            if doing == "creating" =>
        {
            Error::invalid(
                "disk_dir",
                format!(
                    "the disk backup directory {} refuses a new file ({e})",
                    target.dir.display()
                ),
            )
        }
        _ => Error::Logic(format!("disk backup: {doing} {}: {e}", path.display())),
    }
}

/// Reserves `len` bytes of disk for `file` (a full disk refuses here, before any byte is
/// written); a file system without `fallocate` gets the length alone.
fn reserve(target: &DiskTarget, path: &Path, file: &File, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let flags = rustix::fs::FallocateFlags::empty();
    match rustix::fs::fallocate(file, flags, 0, len as u64) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::INVAL => file
            .set_len(len as u64)
            .map_err(|e| file_error(target, path, "sizing", &e, len)),
        Err(e) => Err(file_error(target, path, "reserving", &e.into(), len)),
    }
}

impl DiskCopy {
    /// Files for a copy of `lengths` bytes each (in offset order) in `target`'s directory,
    /// named `{name}-{i}.bin`, their space reserved; streamed through ranges of `spec` from
    /// `supply`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (`disk_dir`) when the directory is missing or refuses a new
    /// file; out of memory when the disk has no room for them all (checked first, and again by
    /// each file's reservation). Nothing is left behind.
    pub fn create(
        target: &DiskTarget,
        supply: &'static HostPageSupply,
        spec: PageSpec,
        name: &str,
        lengths: &[usize],
    ) -> Result<DiskCopy> {
        target.check_dir()?;
        let total: usize = lengths.iter().sum();
        if let Ok(fs) = rustix::fs::statvfs(&target.dir) {
            let room = u128::from(fs.f_bavail) * u128::from(fs.f_frsize);
            if room < total as u128 {
                return Err(Error::out_of_memory(
                    total,
                    format!(
                        "disk backup: no room in {} ({room} bytes free)",
                        target.dir.display()
                    ),
                ));
            }
        }
        let (ring, threads, direct) = target.io_shape();
        let a = direct_align();
        let align = (direct && target.chunk_bytes >= a).then_some(a);
        let step = align.map_or(target.chunk_bytes, |a| target.chunk_bytes / a * a);
        // Dropped on an error: the files made so far are removed.
        let mut copy = DiskCopy {
            target: target.clone(),
            files: Vec::with_capacity(lengths.len()),
            len: total,
            supply,
            spec,
            align,
            step,
            ring: ring.clamp(1, total.div_ceil(step).max(1)),
            threads,
            io: Mutex::new(None),
            #[cfg(test)]
            written: std::sync::atomic::AtomicUsize::new(0),
        };
        let mut off = 0;
        for (i, &len) in lengths.iter().enumerate() {
            let path = target.dir.join(format!("{name}-{i}.bin"));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| file_error(target, &path, "creating", &e, len))?;
            copy.files.push(BackupFile {
                path: path.clone(),
                off,
                len,
            });
            reserve(target, &path, &file, len)?;
            off += len;
        }
        Ok(copy)
    }

    /// Bytes it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The files' paths, in offset order.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.files.iter().map(|f| f.path.clone()).collect()
    }

    /// The pieces `(file index, offset in the file, offset in the copy, bytes)` of the copy's
    /// bytes `off .. off + len`, in order: split at the multiples of the step in each file, so
    /// a piece is at most a step and only the first one of a file's run may start unaligned,
    /// where it ends at the next multiple, which keeps its remainder of the alignment plus its
    /// bytes within a step.
    fn pieces(&self, off: usize, len: usize) -> Vec<(usize, usize, usize, usize)> {
        let step = self.step;
        let mut out = Vec::new();
        let end = off + len;
        let first = self.files.partition_point(|f| f.off + f.len <= off);
        for (i, f) in self.files.iter().enumerate().skip(first) {
            if f.off >= end {
                break;
            }
            let mut at = off.max(f.off);
            let stop = end.min(f.off + f.len);
            while at < stop {
                let in_file = at - f.off;
                let n = (step - in_file % step).min(stop - at);
                out.push((i, in_file, at, n));
                at += n;
            }
        }
        out
    }

    /// The streaming state, made on first use in a transition: the ring of staging chunks.
    fn io(&self) -> Result<parking_lot::MappedMutexGuard<'_, Io>> {
        let mut io = self.io.lock();
        if io.is_none() {
            // Each chunk of the ring starts at an aligned address (the supply's ranges start at
            // a page).
            let chunk = self
                .target
                .chunk_bytes
                .min(self.len.max(1))
                .checked_next_multiple_of(direct_align())
                .ok_or_else(|| Error::invalid("disk_chunk_bytes", "larger than memory"))?;
            let bytes = chunk
                .checked_mul(self.ring)
                .ok_or_else(|| Error::invalid("disk_chunk_bytes", "larger than memory"))?;
            let staging = self.supply.take(self.spec, bytes)?;
            let slots = (0..self.ring).map(|k| staging.addr() + k * chunk).collect();
            *io = Some(Io {
                fences: (0..self.ring).map(|_| None).collect(),
                _staging: staging,
                slots,
                open: HashMap::new(),
                next: 0,
            });
        }
        Ok(parking_lot::MutexGuard::map(io, |io| {
            io.as_mut().expect("made above")
        }))
    }

    /// Opens file `i` for a transition (see [`OpenFile`]).
    fn open_file(&self, i: usize) -> Result<OpenFile> {
        let f = &self.files[i];
        let open = |flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(flags)
                .open(&f.path)
        };
        let buffered =
            open(0).map_err(|err| file_error(&self.target, &f.path, "opening", &err, f.len))?;
        // Refused by some file systems (tmpfs: `EINVAL`): then every call is buffered.
        let direct = self.align.and_then(|_| open(libc::O_DIRECT).ok());
        // Buffered front to back, the kernel reads ahead while the chunk before is copied; with
        // direct calls, only heads and tails are buffered: no read ahead.
        let advice = match direct {
            Some(_) => rustix::fs::Advice::Random,
            None => rustix::fs::Advice::Sequential,
        };
        let len = std::num::NonZeroU64::new(f.len as u64);
        let _ = rustix::fs::fadvise(&buffered, 0, len, advice);
        Ok(OpenFile {
            buffered,
            direct,
            refused: AtomicBool::new(false),
        })
    }

    /// Streams the copy's bytes `off .. off + len` between the files and the device addresses
    /// `dev ..` through the ring of staging chunks, with the file calls made by I/O threads
    /// (several in flight), `toward` the files ([`Toward::Copy`]: the copies of the next
    /// chunks run while chunks before them are written; done when this returns) or the device
    /// ([`Toward::Device`]: chunks are read ahead while the ones before them are copied; the
    /// last copies may still run until [`finish`](Self::finish) or the virtual memory's
    /// `wait_copies`).
    ///
    /// # Safety
    /// 1. As [`VirtualMemory::copy_out`]'s (toward the files) or [`VirtualMemory::copy_in`]'s
    ///    (toward the device) first precondition for `dev .. dev + len`.
    ///
    /// # Errors
    /// Out of memory when the disk is full; a file shorter than written or unreadable, other
    /// file errors (logic errors naming the file); the virtual memory's copy errors; no
    /// thread could be started for the file calls. A failed write leaves the device bytes as
    /// they were.
    pub unsafe fn stream(
        &self,
        vm: &dyn VirtualMemory,
        toward: Toward,
        dev: usize,
        off: usize,
        len: usize,
    ) -> Result<()> {
        let mut io = self.io()?;
        let chunk = |(file, file_off, at, n): (usize, usize, usize, usize)| Chunk {
            file,
            file_off,
            dev: dev + (at - off),
            n,
            pad: self.align.map_or(0, |a| file_off % a),
        };
        let mut pieces = self.pieces(off, len);
        // The disk waits for a write stream's first copy and for a read stream's last copy:
        // those pieces are made a quarter step, the copy of the piece after (before) them
        // runs while they are written (read).
        let a = self.align.unwrap_or(1);
        let quarter = (self.step / 4 / a * a).max(a);
        let end = match toward {
            Toward::Copy => 0,
            Toward::Device => pieces.len().saturating_sub(1),
        };
        if let Some(&(file, file_off, at, n)) = pieces.get(end) {
            let split = match toward {
                Toward::Copy => (file_off + quarter).next_multiple_of(a),
                Toward::Device => (file_off + n).saturating_sub(quarter) / a * a,
            };
            if split > file_off && split < file_off + n {
                let k = split - file_off;
                pieces[end] = (file, file_off, at, k);
                pieces.insert(end + 1, (file, split, at + k, n - k));
            }
        }
        let chunks: Vec<Chunk> = pieces.into_iter().map(chunk).collect();
        for c in &chunks {
            if let std::collections::hash_map::Entry::Vacant(e) = io.open.entry(c.file) {
                e.insert(self.open_file(c.file)?);
            }
        }
        match toward {
            // SAFETY: the caller's precondition 1, passed on.
            Toward::Copy => unsafe { self.write_chunks(&mut io, vm, &chunks) },
            // SAFETY: the caller's precondition 1, passed on.
            Toward::Device => unsafe { self.read_chunks(&mut io, vm, &chunks) },
        }
    }

    /// Writes `chunks` from the device to the files (see [`stream`](Self::stream)): this
    /// thread copies each chunk into a staging chunk no write uses, the I/O threads write it
    /// once its copy is done.
    ///
    /// # Safety
    /// 1. As [`VirtualMemory::copy_out`]'s first precondition for every chunk's device bytes.
    unsafe fn write_chunks(
        &self,
        io: &mut Io,
        vm: &dyn VirtualMemory,
        chunks: &[Chunk],
    ) -> Result<()> {
        if chunks.is_empty() {
            return Ok(());
        }
        let Io {
            slots: addrs,
            open,
            fences,
            next,
            ..
        } = io;
        let addrs: &[usize] = addrs;
        let ring = addrs.len();
        let lanes = Lanes::default();
        lanes.state.lock().free = (0..ring).map(|k| (*next + k) % ring).collect();
        let open = &*open;
        let run = |job: &mut Job| self.write_job(open, addrs, job);
        beside_io(&lanes, self.threads.min(chunks.len()), &run, || {
            // SAFETY: the caller's precondition 1, passed on.
            unsafe { self.copy_out_chunks(&lanes, vm, chunks, addrs, fences, next) }
        });
        lanes.end(fences)
    }

    /// The copying thread of [`write_chunks`](Self::write_chunks): each chunk into a free
    /// staging chunk, queued for the I/O threads; stops at a failure of theirs.
    ///
    /// # Safety
    /// 1. As [`VirtualMemory::copy_out`]'s first precondition for every chunk's device bytes.
    unsafe fn copy_out_chunks(
        &self,
        lanes: &Lanes,
        vm: &dyn VirtualMemory,
        chunks: &[Chunk],
        addrs: &[usize],
        fences: &mut [Option<CopyFence>],
        next: &mut usize,
    ) -> Result<()> {
        for (index, &chunk) in chunks.iter().enumerate() {
            let Some(slot) = lanes.free_slot() else {
                return Ok(());
            };
            *next = (slot + 1) % addrs.len();
            if let Some(fence) = fences[slot].take() {
                fence.wait()?;
            }
            // SAFETY: the caller's precondition 1 for the device bytes; the staging chunk
            // `slot` holds `pad + n` bytes (at most a step, see `pieces`), nothing else uses it
            // (it was free: its last write is done, and the copy that used it before was
            // waited for above).
            unsafe { vm.copy_out(chunk.dev, addrs[slot] + chunk.pad, chunk.n) }?;
            let fence = vm.copy_fence()?;
            lanes.push(Job {
                index,
                slot,
                chunk,
                fence: Some(fence),
            });
        }
        Ok(())
    }

    /// An I/O thread's write of a chunk: once the copy into its staging chunk is done, to its
    /// file at its offset.
    fn write_job(
        &self,
        open: &HashMap<usize, OpenFile>,
        addrs: &[usize],
        job: &mut Job,
    ) -> Result<()> {
        if let Some(fence) = job.fence.take() {
            fence.wait()?;
        }
        let Chunk {
            file: i,
            file_off,
            n,
            pad,
            ..
        } = job.chunk;
        let f = &self.files[i];
        #[cfg(test)]
        self.count_write(f, n)?;
        let file = self.opened(open, i)?;
        // SAFETY: the staging chunk holds at least `pad + n` bytes, all of these written by the
        // copy waited for above, and nothing writes them until this job is done (the range is
        // free for a copy only then).
        let bytes = unsafe { std::slice::from_raw_parts((addrs[job.slot] + pad) as *const u8, n) };
        file.write_all_at(bytes, file_off, self.align)
            .map_err(|e| file_error(&self.target, &f.path, "writing", &e, n))
    }

    /// File `i`, opened before the I/O threads start.
    fn opened<'a>(&self, open: &'a HashMap<usize, OpenFile>, i: usize) -> Result<&'a OpenFile> {
        open.get(&i).ok_or_else(|| {
            Error::Logic(format!(
                "disk backup: {} was not opened",
                self.files[i].path.display()
            ))
        })
    }

    /// Tests: fails a write that passes the target's injected limit, as a full disk would.
    #[cfg(test)]
    fn count_write(&self, f: &BackupFile, n: usize) -> Result<()> {
        let done = self
            .written
            .fetch_add(n, std::sync::atomic::Ordering::SeqCst);
        match self.target.fail_writes_after {
            Some(limit) if done + n > limit => Err(file_error(
                &self.target,
                &f.path,
                "writing",
                &std::io::Error::from_raw_os_error(libc::ENOSPC),
                n,
            )),
            _ => Ok(()),
        }
    }

    /// Reads `chunks` from the files into the device (see [`stream`](Self::stream)): the I/O
    /// threads read up to a ring of chunks ahead, each into a staging chunk once the copy
    /// that last read it is done; this thread copies each chunk into the device once read.
    ///
    /// # Safety
    /// 1. As [`VirtualMemory::copy_in`]'s first precondition for every chunk's device bytes.
    unsafe fn read_chunks(
        &self,
        io: &mut Io,
        vm: &dyn VirtualMemory,
        chunks: &[Chunk],
    ) -> Result<()> {
        if chunks.is_empty() {
            return Ok(());
        }
        let Io {
            slots: addrs,
            open,
            fences,
            next,
            ..
        } = io;
        let addrs: &[usize] = addrs;
        let ring = addrs.len();
        let start = *next;
        let lanes = Lanes::default();
        lanes.state.lock().done = vec![false; chunks.len()];
        let open = &*open;
        let run = |job: &mut Job| self.read_job(open, addrs, job);
        beside_io(&lanes, self.threads.min(chunks.len()), &run, || {
            // SAFETY: the caller's precondition 1, passed on.
            unsafe { self.copy_in_chunks(&lanes, vm, chunks, addrs, fences, start) }
        });
        *next = (start + chunks.len()) % ring;
        lanes.end(fences)
    }

    /// The copying thread of [`read_chunks`](Self::read_chunks): chunk `k` goes through
    /// staging chunk `(start + k) % ring`; its read is queued once the copy of chunk
    /// `k - ring` (the range's last) is queued, with that copy's fence.
    ///
    /// # Safety
    /// 1. As [`VirtualMemory::copy_in`]'s first precondition for every chunk's device bytes.
    unsafe fn copy_in_chunks(
        &self,
        lanes: &Lanes,
        vm: &dyn VirtualMemory,
        chunks: &[Chunk],
        addrs: &[usize],
        fences: &mut [Option<CopyFence>],
        start: usize,
    ) -> Result<()> {
        let ring = addrs.len();
        let slot_of = |k: usize| (start + k) % ring;
        let mut issued = 0;
        for (k, chunk) in chunks.iter().enumerate() {
            while issued < chunks.len() && issued < k + ring {
                let slot = slot_of(issued);
                lanes.push(Job {
                    index: issued,
                    slot,
                    chunk: chunks[issued],
                    fence: fences[slot].take(),
                });
                issued += 1;
            }
            if !lanes.wait_done(k) {
                return Ok(());
            }
            let slot = slot_of(k);
            // SAFETY: the caller's precondition 1 for the device bytes; the staging chunk holds
            // the chunk's `n` bytes from `pad`, read by the job waited for above, and no read
            // writes it again until this copy's fence, kept below, is done.
            unsafe { vm.copy_in(chunk.dev, addrs[slot] + chunk.pad, chunk.n) }?;
            fences[slot] = Some(vm.copy_fence()?);
        }
        Ok(())
    }

    /// An I/O thread's read of a chunk: once the copy that last read its staging chunk is
    /// done, from its file at its offset.
    fn read_job(
        &self,
        open: &HashMap<usize, OpenFile>,
        addrs: &[usize],
        job: &mut Job,
    ) -> Result<()> {
        if let Some(fence) = job.fence.take() {
            fence.wait()?;
        }
        let Chunk {
            file: i,
            file_off,
            n,
            pad,
            ..
        } = job.chunk;
        let f = &self.files[i];
        let file = self.opened(open, i)?;
        // SAFETY: the staging chunk holds at least `pad + n` bytes, and nothing else uses them
        // until this job is done (the copy that last read them was waited for above; the copy
        // out of them is queued once this is done).
        let bytes =
            unsafe { std::slice::from_raw_parts_mut((addrs[job.slot] + pad) as *mut u8, n) };
        file.read_exact_at(bytes, file_off, self.align)
            .map_err(|e| {
                Error::Logic(format!(
                    "disk backup: reading {n} bytes at {file_off} of {}: {e} (the file changed \
                     since the sleep)",
                    f.path.display()
                ))
            })
    }

    /// Ends a transition's streaming: after writes, the files are synced and their pages
    /// dropped from the page cache; the ring goes back to the supply (once no copy uses it)
    /// and the files are closed.
    ///
    /// # Errors
    /// A sync that fails (out of memory for a full disk); the copies' errors.
    pub fn finish(&self, wrote: bool) -> Result<()> {
        let Some(mut io) = self.io.lock().take() else {
            return Ok(());
        };
        for f in io.fences.iter_mut().filter_map(Option::take) {
            f.wait()?;
        }
        if wrote {
            for (&i, file) in &io.open {
                let f = &self.files[i];
                let file = &file.buffered;
                file.sync_data()
                    .map_err(|e| file_error(&self.target, &f.path, "syncing", &e, f.len))?;
                let len = std::num::NonZeroU64::new(f.len as u64);
                let _ = rustix::fs::fadvise(file, 0, len, rustix::fs::Advice::DontNeed);
            }
        }
        Ok(())
    }

    /// Checks every file is there with the length it was made with (before a wake maps a
    /// page).
    ///
    /// # Errors
    /// A logic error naming the first file that is missing or of another length.
    pub fn check(&self) -> Result<()> {
        for f in &self.files {
            let found = std::fs::metadata(&f.path).map(|m| m.len());
            let why = match found {
                Ok(n) if n == f.len as u64 => continue,
                Ok(n) => format!("has {n} bytes, {} were written", f.len),
                Err(e) => format!("is gone ({e})"),
            };
            return Err(Error::Logic(format!(
                "disk backup: the file {} {why}; the pool is still asleep with its other files: \
                 put the file back and resume again",
                f.path.display()
            )));
        }
        Ok(())
    }
}

impl Drop for DiskCopy {
    fn drop(&mut self) {
        drop(self.io.lock().take());
        for f in &self.files {
            let _ = std::fs::remove_file(&f.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::HostVirtualMemory;

    const PAGE: usize = 2 << 20;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rrmm-disk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn supply() -> &'static HostPageSupply {
        Box::leak(Box::default())
    }

    /// Host virtual memory with `bytes` mapped, filled with a pattern of `seed`: the pretend
    /// device, its first address, and its bytes.
    fn device(bytes: usize, seed: usize) -> (HostVirtualMemory, usize, Vec<u8>) {
        let mapped = bytes.next_multiple_of(PAGE);
        let vm = HostVirtualMemory::new(mapped, Some(PAGE), false, None).unwrap();
        let base = vm.base();
        vm.map(base, mapped).unwrap();
        // Blocks of a prime length (4099 bytes), each the one before rotated by a byte: bytes
        // that change with their offset in no 4 KiB period (a chunk at a wrong offset shows),
        // made at memcpy speed (a formula per byte was most of these tests' debug-build time).
        let mut block: Vec<u8> = (0..4099)
            .map(|i| ((i * 31 + seed * 7) % 251) as u8)
            .collect();
        let mut want = Vec::with_capacity(bytes);
        while want.len() < bytes {
            let n = block.len().min(bytes - want.len());
            want.extend_from_slice(&block[..n]);
            block.rotate_left(1);
        }
        // SAFETY: mapped pages of the reservation, used only by this test.
        unsafe { std::slice::from_raw_parts_mut(base as *mut u8, bytes) }.copy_from_slice(&want);
        (vm, base, want)
    }

    /// The device's bytes `base .. base + n`.
    fn device_bytes(base: usize, n: usize) -> Vec<u8> {
        // SAFETY: mapped pages of a test's device.
        unsafe { std::slice::from_raw_parts(base as *const u8, n) }.to_vec()
    }

    /// The calls `(off, len)` of a stream over `total` bytes cut at `cuts` (copy offsets).
    fn calls(total: usize, cuts: &[usize]) -> Vec<(usize, usize)> {
        let mut at: Vec<usize> = cuts.iter().map(|&c| c.min(total)).collect();
        at.extend([0, total]);
        at.sort_unstable();
        at.dedup();
        at.windows(2).map(|w| (w[0], w[1] - w[0])).collect()
    }

    /// Writes files of `lengths` through `target` in calls cut at `cuts`, checks the files
    /// hold the device's bytes in order, zeroes the device, reads it back in the same calls
    /// and checks every byte; the files are removed with the copy.
    fn round_trip(target: &DiskTarget, lengths: &[usize], cuts: &[usize]) {
        let total: usize = lengths.iter().sum();
        let (vm, base, want) = device(total, lengths.len() + target.chunk_bytes);
        let copy = DiskCopy::create(target, supply(), PageSpec::plain(), "rt", lengths).unwrap();
        for (off, len) in calls(total, cuts) {
            // SAFETY: mapped pages nothing else uses.
            unsafe { copy.stream(&vm, Toward::Copy, base + off, off, len) }.unwrap();
        }
        copy.finish(true).unwrap();
        let mut on_disk = Vec::with_capacity(total);
        for path in copy.paths() {
            on_disk.extend_from_slice(&std::fs::read(path).unwrap());
        }
        assert!(
            on_disk == want,
            "the files hold the bytes: {target:?} {lengths:?}"
        );
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(base as *mut u8, 0, total) };
        copy.check().unwrap();
        for (off, len) in calls(total, cuts).into_iter().rev() {
            // SAFETY: as above.
            unsafe { copy.stream(&vm, Toward::Device, base + off, off, len) }.unwrap();
        }
        copy.finish(false).unwrap();
        vm.wait_copies().unwrap();
        assert!(
            device_bytes(base, total) == want,
            "every byte back: {target:?} {lengths:?} {cuts:?}"
        );
        let paths = copy.paths();
        drop(copy);
        assert!(paths.iter().all(|p| !p.exists()), "removed with the copy");
    }

    #[test]
    fn every_ring_thread_count_and_chunk_moves_every_byte_there_and_back() {
        let dir = temp_dir("shapes");
        // Files with unaligned lengths and ends; calls cut inside files at unaligned offsets.
        let lengths = [1000, PAGE + 4097, 5, 3 * 4096, PAGE - 123];
        let cuts = [333, PAGE + 5, PAGE + 1000 + 4096 * 3 + 1, 2 * PAGE + 12_000];
        let chunks = [1000, 4096 + 17, 3 * 4096 + 100, 64 << 10, PAGE];
        let shapes = [
            (1, 1, true),
            (2, 2, true),
            (3, 3, true),
            (4, 2, true),
            (2, 1, false),
            (3, 2, false),
        ];
        for chunk in chunks {
            for (ring, threads, direct) in shapes {
                let target = DiskTarget::new(&dir, Some(chunk))
                    .unwrap()
                    .with_io(ring, threads, direct);
                round_trip(&target, &lengths, &cuts);
            }
        }
        // The default shape, one call per file and one for all.
        let target = DiskTarget::new(&dir, Some(64 << 10)).unwrap();
        round_trip(&target, &lengths, &[1000, PAGE + 5097, PAGE + 5102]);
        round_trip(&target, &lengths, &[]);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_system_without_o_direct_gets_buffered_calls() {
        // tmpfs refused `O_DIRECT` before Linux 6.6; either way the bytes make the trip.
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            return;
        }
        let dir = shm.join(format!("rrmm-disk-shm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let target = DiskTarget::new(&dir, Some(3 * 4096 + 5)).unwrap();
        round_trip(&target, &[PAGE + 3, 4096, 77], &[5000, PAGE]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_refused_direct_call_sends_the_rest_buffered_and_other_errors_are_reported() {
        let dir = temp_dir("refused-direct");
        let path = dir.join("f.bin");
        let a = 4096;
        std::fs::write(&path, vec![0u8; 3 * a]).unwrap();
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap()
        };
        let file = || OpenFile {
            buffered: open(),
            direct: Some(open()),
            refused: AtomicBool::new(false),
        };
        let errno = |e: i32| std::io::Error::from_raw_os_error(e);
        // A block moves, then the file system refuses: the rest goes buffered from then on.
        let f = file();
        let mut calls = 0;
        let done = f
            .direct_calls((0, 3 * a), 0, a, |_, _, _, _| {
                calls += 1;
                if calls == 1 {
                    Ok(a)
                } else {
                    Err(errno(libc::EINVAL))
                }
            })
            .unwrap();
        assert_eq!((done, f.refused.load(Relaxed)), (a, true));
        assert_eq!(
            f.direct_part(0, 0, 3 * a, Some(a)),
            (0, 0),
            "no direct call more"
        );
        let bytes: Vec<u8> = (0..3 * a).map(|i| (i % 253) as u8).collect();
        f.write_all_at(&bytes, 0, Some(a)).unwrap();
        assert!(std::fs::read(&path).unwrap() == bytes);
        let mut back = vec![0u8; 3 * a - 10];
        f.read_exact_at(&mut back, 10, Some(a)).unwrap();
        assert!(back == bytes[10..]);
        // A failure of the disk is reported; a short unaligned count leaves the rest buffered.
        let f = file();
        let e = f
            .direct_calls((0, a), 0, a, |_, _, _, _| Err(errno(libc::EIO)))
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert!(!f.refused.load(Relaxed));
        let done = f
            .direct_calls((0, 2 * a), 0, a, |_, _, _, _| Ok(100))
            .unwrap();
        assert_eq!(done, 100);
        // Heads and tails: the aligned middle only, and only from aligned memory (the ring
        // holds a chunk at its file offset's remainder).
        assert_eq!(f.direct_part(100, 100, 3 * a, Some(a)), (a - 100, 2 * a));
        assert_eq!(f.direct_part(0, 100, 3 * a, Some(a)), (0, 0));
        assert_eq!(f.direct_part(0, 0, a - 1, Some(a)), (0, 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        #[test]
        fn any_lengths_chunks_calls_and_shape_make_the_trip(
            lengths in proptest::collection::vec(1usize..40_000, 1..4),
            chunk in 1usize..30_000,
            cuts in proptest::collection::vec(0usize..120_000, 0..4),
            ring in 1usize..4,
            threads in 1usize..4,
            direct in proptest::bool::ANY,
        ) {
            let dir = temp_dir("proptest");
            let target = DiskTarget::new(&dir, Some(chunk)).unwrap().with_io(ring, threads, direct);
            round_trip(&target, &lengths, &cuts);
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn a_write_failing_in_one_io_thread_mid_stream_is_reported_and_loses_nothing() {
        let dir = temp_dir("fail-mid-stream");
        let chunk = 16 << 10;
        let lengths = [PAGE, PAGE];
        let (vm, base, want) = device(2 * PAGE, 3);
        // The first call's writes all pass, the second call's fail after a few chunks, on
        // whichever of the three threads passes the limit first.
        let target = DiskTarget::new(&dir, Some(chunk))
            .unwrap()
            .with_io(3, 3, true)
            .failing_after(PAGE + 5 * chunk);
        let copy = DiskCopy::create(&target, supply(), PageSpec::plain(), "t", &lengths).unwrap();
        // SAFETY: mapped pages nothing else uses.
        unsafe { copy.stream(&vm, Toward::Copy, base, 0, PAGE) }.unwrap();
        // SAFETY: as above.
        let e = unsafe { copy.stream(&vm, Toward::Copy, base + PAGE, PAGE, PAGE) }.unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        let second = copy.paths()[1].display().to_string();
        assert!(e.to_string().contains(&second), "names the file: {e}");
        assert!(
            device_bytes(base, 2 * PAGE) == want,
            "the device bytes untouched"
        );
        // Undone as a sleep undoes: the first call's bytes come back from its file.
        // SAFETY: as above.
        unsafe { std::ptr::write_bytes(base as *mut u8, 0, PAGE) };
        // SAFETY: as above.
        unsafe { copy.stream(&vm, Toward::Device, base, 0, PAGE) }.unwrap();
        copy.finish(false).unwrap();
        assert!(device_bytes(base, 2 * PAGE) == want, "every byte back");
        drop(copy);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_read_failing_in_one_io_thread_names_the_file_and_stops() {
        let dir = temp_dir("fail-read");
        let lengths = [PAGE, PAGE + 100];
        let (vm, base, _) = device(2 * PAGE + 100, 4);
        let target = DiskTarget::new(&dir, Some(16 << 10))
            .unwrap()
            .with_io(3, 2, true);
        let copy = DiskCopy::create(&target, supply(), PageSpec::plain(), "t", &lengths).unwrap();
        // SAFETY: mapped pages nothing else uses.
        unsafe { copy.stream(&vm, Toward::Copy, base, 0, 2 * PAGE + 100) }.unwrap();
        copy.finish(true).unwrap();
        // Shortened after the wake's check: a read past its end fails.
        let second = copy.paths()[1].clone();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&second)
            .unwrap()
            .set_len(PAGE as u64 / 2)
            .unwrap();
        // SAFETY: as above.
        let e = unsafe { copy.stream(&vm, Toward::Device, base, 0, 2 * PAGE + 100) }
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&second.display().to_string()) && e.contains("changed since the sleep"),
            "{e}"
        );
        copy.finish(false).unwrap();
        drop(copy);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bytes_go_to_files_and_come_back_in_chunks() {
        let dir = temp_dir("round-trip");
        let vm = HostVirtualMemory::new(8 * PAGE, Some(PAGE), false, None).unwrap();
        let base = vm.base();
        vm.map(base, 2 * PAGE).unwrap();
        // SAFETY: two mapped pages of the reservation.
        let dev = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, 2 * PAGE) };
        for (i, b) in dev.iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8;
        }
        let want = dev.to_vec();
        let target = DiskTarget::new(&dir, Some(4096 + 17)).unwrap();
        let lengths = [1000, PAGE, PAGE - 1000];
        let copy = DiskCopy::create(&target, supply(), PageSpec::plain(), "t", &lengths).unwrap();
        assert_eq!(copy.paths().len(), 3);
        // Two calls that cross file boundaries.
        // SAFETY: mapped pages nothing else uses.
        unsafe {
            copy.stream(&vm, Toward::Copy, base, 0, PAGE + 5).unwrap();
            copy.stream(&vm, Toward::Copy, base + PAGE + 5, PAGE + 5, PAGE - 5)
                .unwrap();
        }
        copy.finish(true).unwrap();
        for (p, n) in copy.paths().iter().zip(lengths) {
            assert_eq!(std::fs::metadata(p).unwrap().len(), n as u64);
        }
        dev.fill(0);
        copy.check().unwrap();
        // SAFETY: as above.
        unsafe { copy.stream(&vm, Toward::Device, base, 0, 2 * PAGE).unwrap() };
        copy.finish(false).unwrap();
        assert!(dev == want.as_slice(), "every byte back");
        let paths = copy.paths();
        drop(copy);
        assert!(paths.iter().all(|p| !p.exists()), "removed with the copy");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_directory_or_a_full_disk_refuses_and_leaves_nothing() {
        let dir = temp_dir("refusals");
        let missing = DiskTarget::new(dir.join("nope"), None).unwrap();
        let e = DiskCopy::create(&missing, supply(), PageSpec::plain(), "t", &[10]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    argument: "disk_dir",
                    ..
                }
            ),
            "{e}"
        );
        // More than any disk holds: refused before a file is made.
        let target = DiskTarget::new(&dir, None).unwrap();
        let e = DiskCopy::create(
            &target,
            supply(),
            PageSpec::plain(),
            "t",
            &[10, usize::MAX / 4],
        )
        .unwrap_err();
        assert!(
            e.is_out_of_memory() && e.to_string().contains("no room"),
            "{e}"
        );
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "nothing left behind"
        );
        // A full disk while writing (injected): out of memory.
        let target = DiskTarget::new(&dir, Some(4096))
            .unwrap()
            .failing_after(8192);
        let vm = HostVirtualMemory::new(4 * PAGE, Some(PAGE), false, None).unwrap();
        vm.map(vm.base(), PAGE).unwrap();
        let copy = DiskCopy::create(&target, supply(), PageSpec::plain(), "t", &[PAGE]).unwrap();
        // SAFETY: a mapped page nothing else uses.
        let e = unsafe { copy.stream(&vm, Toward::Copy, vm.base(), 0, PAGE) }.unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        drop(copy);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_that_vanished_or_shrank_is_named_before_anything_is_read() {
        let dir = temp_dir("vanished");
        let target = DiskTarget::new(&dir, None).unwrap();
        let copy =
            DiskCopy::create(&target, supply(), PageSpec::plain(), "t", &[100, 200]).unwrap();
        copy.check().unwrap();
        let paths = copy.paths();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&paths[1])
            .unwrap()
            .set_len(50)
            .unwrap();
        let e = copy.check().unwrap_err().to_string();
        assert!(e.contains("has 50 bytes, 200 were written"), "{e}");
        std::fs::remove_file(&paths[0]).unwrap();
        let e = copy.check().unwrap_err().to_string();
        assert!(e.contains("is gone") && e.contains("still asleep"), "{e}");
        drop(copy);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The disk backup's rates against the disk's own, on the pretend device (a `memcpy` link):
/// `cargo test --lib disk_backup_rates -- --ignored --nocapture`, with `RRMM_DISK_BENCH_DIR`
/// (default the temp dir), `RRMM_DISK_BENCH_GIB` (4), `RRMM_DISK_BENCH_CHUNK_MB` (256),
/// `RRMM_DISK_BENCH_REPEATS` (3), `RRMM_DISK_BENCH_CALL_MB` (1024) and
/// `RRMM_DISK_BENCH_SHAPES` (ring, threads, direct or buffered to compare, e.g. `2x2d,4x1b`).
/// The disk's own rates are probed right before each backup: `O_DIRECT` writes of a chunk at a
/// time from huge pages (as the ring's) and `fdatasync`, then `O_DIRECT` reads; or, with
/// `RRMM_DISK_BENCH_BUFFERED_PROBE`, the benches' probe (64 MiB buffered writes and `fsync`;
/// its pages dropped, 64 MiB buffered reads). The backup streams as a sleep and a wake do: in
/// calls of 1 GiB (a device's map chunk), over files of 1 GiB; its pause counts the files'
/// making and the sync, its wake the check. Removed files are let settle (their discards)
/// before the next timing. Prints each run and the medians.
#[cfg(test)]
mod bench {
    use super::*;
    use crate::resource::HostVirtualMemory;
    use std::time::Instant;

    const GIB: usize = 1 << 30;

    fn env(name: &str, default: usize) -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    fn gbps(bytes: usize, t: Instant) -> f64 {
        bytes as f64 / t.elapsed().as_secs_f64() / 1e9
    }

    /// The disk's own write and read rates for `bytes` in pieces of `piece` from `buf`
    /// (page-aligned), buffered (synced; read with its pages dropped) or `O_DIRECT`.
    fn probe(dir: &Path, buf: &mut [u8], bytes: usize, piece: usize, direct: bool) -> (f64, f64) {
        let path = dir.join("rrmm-probe.bin");
        let flags = if direct { libc::O_DIRECT } else { 0 };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(flags)
            .open(&path)
            .unwrap();
        let t = Instant::now();
        for off in (0..bytes).step_by(piece) {
            file.write_all_at(&buf[..piece], off as u64).unwrap();
        }
        file.sync_data().unwrap();
        let write = gbps(bytes, t);
        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed);
        let t = Instant::now();
        for off in (0..bytes).step_by(piece) {
            file.read_exact_at(&mut buf[..piece], off as u64).unwrap();
        }
        let read = gbps(bytes, t);
        drop(file);
        std::fs::remove_file(&path).unwrap();
        settle(dir);
        (write, read)
    }

    /// Lets the file system finish with files removed (the discards of their blocks, which
    /// would slow what comes next) before anything is timed.
    fn settle(dir: &Path) {
        let d = File::open(dir).unwrap();
        rustix::fs::syncfs(&d).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(500));
    }

    #[test]
    #[ignore = "a benchmark: minutes of disk traffic"]
    fn disk_backup_rates() {
        let dir = std::env::var_os("RRMM_DISK_BENCH_DIR")
            .map_or_else(std::env::temp_dir, PathBuf::from)
            .join(format!("rrmm-disk-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bytes = env("RRMM_DISK_BENCH_GIB", 4) * GIB;
        let chunk = env("RRMM_DISK_BENCH_CHUNK_MB", 256) << 20;
        let repeats = env("RRMM_DISK_BENCH_REPEATS", 3);
        let call = env("RRMM_DISK_BENCH_CALL_MB", 1024) << 20;
        let vm = HostVirtualMemory::new(bytes, Some(GIB), false, None).unwrap();
        let base = vm.base();
        vm.map(base, bytes).unwrap();
        // SAFETY: mapped pages of the reservation, used only here.
        let dev = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, bytes) };
        for (i, w) in dev.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&(i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
        }
        let want = dev.to_vec();
        // Shapes to compare, `RxT` plus `d` (direct) or `b` (buffered), comma separated.
        let shapes: Vec<Option<(usize, usize, bool)>> = std::env::var("RRMM_DISK_BENCH_SHAPES")
            .map(|v| {
                v.split(',')
                    .map(|s| {
                        let (r, t) = s[..s.len() - 1].split_once('x').unwrap();
                        Some((r.parse().unwrap(), t.parse().unwrap(), s.ends_with('d')))
                    })
                    .collect()
            })
            .unwrap_or_else(|_| vec![None]);
        let buffered_probe = std::env::var_os("RRMM_DISK_BENCH_BUFFERED_PROBE").is_some();
        let supply: &'static HostPageSupply = Box::leak(Box::default());
        let files = vec![GIB; bytes / GIB];
        println!(
            "disk backup bench: {} GiB to {} in {} MiB chunks",
            bytes / GIB,
            dir.display(),
            chunk >> 20
        );
        // Per shape: the disk's own rates (probed right before), the backup's, its sync.
        let mut rows = vec![Vec::new(); shapes.len()];
        for r in 0..repeats {
            // Each repeat starts at another shape: none always follows the same one.
            for k in 0..shapes.len() {
                let k = (k + r) % shapes.len();
                let (shape, rows) = (shapes[k], &mut rows[k]);
                let own = if buffered_probe {
                    probe(&dir, &mut dev[..GIB], bytes, 64 << 20, false)
                } else {
                    probe(&dir, &mut dev[..GIB], bytes, chunk, true)
                };
                dev[..GIB].copy_from_slice(&want[..GIB]);
                let mut target = DiskTarget::new(&dir, Some(chunk)).unwrap();
                if let Some((ring, threads, direct)) = shape {
                    target = target.with_io(ring, threads, direct);
                }
                let t = Instant::now();
                let copy =
                    DiskCopy::create(&target, supply, PageSpec::plain(), "bench", &files).unwrap();
                for off in (0..bytes).step_by(call) {
                    let n = call.min(bytes - off);
                    // SAFETY: mapped pages nothing else uses.
                    unsafe { copy.stream(&vm, Toward::Copy, base + off, off, n) }.unwrap();
                }
                let synced = Instant::now();
                copy.finish(true).unwrap();
                let sync_s = synced.elapsed().as_secs_f64();
                let pause = gbps(bytes, t);
                dev.fill(0);
                let t = Instant::now();
                copy.check().unwrap();
                for off in (0..bytes).step_by(call) {
                    let n = call.min(bytes - off);
                    // SAFETY: as above.
                    unsafe { copy.stream(&vm, Toward::Device, base + off, off, n) }.unwrap();
                }
                copy.finish(false).unwrap();
                vm.wait_copies().unwrap();
                let wake = gbps(bytes, t);
                assert!(dev == want.as_slice(), "every byte back");
                drop(copy);
                settle(&dir);
                println!(
                    "repeat {r} {shape:?}: disk write {:.2} read {:.2} | backup pause {pause:.2} \
                     ({:.0}%, sync {sync_s:.2} s) wake {wake:.2} ({:.0}%) GB/s",
                    own.0,
                    own.1,
                    100.0 * pause / own.0,
                    100.0 * wake / own.1,
                );
                rows.push([own.0, own.1, pause, wake, pause / own.0, wake / own.1]);
            }
        }
        for (shape, rows) in shapes.iter().zip(&rows) {
            let median = |k: usize| {
                let mut v: Vec<f64> = rows.iter().map(|row| row[k]).collect();
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            println!(
                "median {shape:?}: disk write {:.2} read {:.2} | backup pause {:.2} ({:.0}%) \
                 wake {:.2} ({:.0}%) GB/s",
                median(0),
                median(1),
                median(2),
                100.0 * median(4),
                median(3),
                100.0 * median(5),
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
