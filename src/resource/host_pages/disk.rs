//! Disk backups: a sleeping pool's bytes in files of a directory instead of host memory
//! (torch_memory_saver's `enable_disk_backup`), for data larger than the host's memory or not
//! worth holding there.
//!
//! A sleep with a [`DiskTarget`] makes one file per live block it keeps (space reserved with
//! `fallocate` first, so a full disk refuses the sleep before anything moves) and streams the
//! bytes through two staging ranges of the host page supply (pinned for a device): the device
//! copies one chunk into a range while the chunk before it is written from the other, so the
//! sleep runs at the slower of the link and the disk. Once written, the files are synced and
//! their pages dropped from the page cache (`fadvise(DONTNEED)`): the host memory goes back.
//! The wake checks every file is there with its length before it maps a page (a file that
//! vanished or shrank is an error and the pool stays asleep with its files), then reads the
//! chunks back the same way. The files are removed when the copy is dropped (after a wake, or
//! with the pool).
//!
//! `unsafe` here is the FFI edge only: the staging ranges are host memory at raw addresses,
//! seen as byte slices for the file calls.

use super::registered::{HostPageSupply, HostPages, PageSpec};
use crate::error::{Error, Result};
use crate::resource::{CopyFence, Toward, VirtualMemory};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Bytes of one staging chunk unless the target says (two are held while a sleep or wake
/// streams).
pub const DEFAULT_DISK_CHUNK_BYTES: usize = 64 << 20;

/// Where a sleep writes its bytes: a directory (it must exist and be writable) and the bytes
/// of each of the two chunks the copies stream through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskTarget {
    /// The directory the files are made in.
    pub dir: PathBuf,
    /// Bytes per staging chunk.
    pub chunk_bytes: usize,
    /// Tests: a write that would pass this many bytes of the copy fails as a full disk would.
    #[cfg(test)]
    fail_writes_after: Option<usize>,
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
        })
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
/// address `dev`.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    file: usize,
    file_off: usize,
    dev: usize,
    n: usize,
}

/// One file of a disk backup: the copy's bytes `off .. off + len`.
#[derive(Debug)]
struct BackupFile {
    path: PathBuf,
    off: usize,
    len: usize,
}

/// What a transition streaming through the copy holds: the two staging ranges, the files it
/// opened, and the fences of the copies into the device still reading a staging range.
struct Io {
    staging: Vec<HostPages>,
    open: HashMap<usize, File>,
    fences: [Option<CopyFence>; 2],
    /// The staging range the next chunk goes through.
    next: usize,
}

impl Drop for Io {
    fn drop(&mut self) {
        // A staging range goes back to the supply only once no copy reads it.
        for f in self.fences.iter_mut().filter_map(Option::take) {
            let _ = f.wait();
        }
    }
}

/// A sleep's bytes on disk: files of a [`DiskTarget`]'s directory holding the copy's bytes
/// in offset order (one per kept live block). Removed when dropped.
pub struct DiskCopy {
    target: DiskTarget,
    files: Vec<BackupFile>,
    len: usize,
    supply: &'static HostPageSupply,
    spec: PageSpec,
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
        // Dropped on an error: the files made so far are removed.
        let mut copy = DiskCopy {
            target: target.clone(),
            files: Vec::with_capacity(lengths.len()),
            len: total,
            supply,
            spec,
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
    /// bytes `off .. off + len`, none longer than a chunk, in order.
    fn pieces(&self, off: usize, len: usize) -> Vec<(usize, usize, usize, usize)> {
        let chunk = self.target.chunk_bytes;
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
                let n = chunk.min(stop - at);
                out.push((i, at - f.off, at, n));
                at += n;
            }
        }
        out
    }

    /// The streaming state, made on first use in a transition: two staging ranges.
    fn io(&self) -> Result<parking_lot::MappedMutexGuard<'_, Io>> {
        let mut io = self.io.lock();
        if io.is_none() {
            let chunk = self.target.chunk_bytes.min(self.len.max(1));
            let staging = vec![
                self.supply.take(self.spec, chunk)?,
                self.supply.take(self.spec, chunk)?,
            ];
            *io = Some(Io {
                staging,
                open: HashMap::new(),
                fences: [None, None],
                next: 0,
            });
        }
        Ok(parking_lot::MutexGuard::map(io, |io| {
            io.as_mut().expect("made above")
        }))
    }

    /// File `i`, opened once per transition.
    fn file<'a>(&self, io: &'a mut Io, i: usize) -> Result<&'a File> {
        let f = &self.files[i];
        match io.open.entry(i) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&f.path)
                    .map_err(|err| file_error(&self.target, &f.path, "opening", &err, f.len))?;
                // Read front to back: the kernel reads ahead while the chunk before is copied.
                let len = std::num::NonZeroU64::new(f.len as u64);
                let _ = rustix::fs::fadvise(&file, 0, len, rustix::fs::Advice::Sequential);
                Ok(e.insert(file))
            }
        }
    }

    /// Streams the copy's bytes `off .. off + len` between the files and the device addresses
    /// `dev ..` through the staging ranges, `toward` the files ([`Toward::Copy`]: the copy of
    /// a chunk runs while the chunk before it is written; done when this returns) or the device
    /// ([`Toward::Device`]: a chunk is read while the copy of the one before runs; the last
    /// copies may still run until [`finish`](Self::finish) or the virtual memory's
    /// `wait_copies`).
    ///
    /// # Safety
    /// 1. As [`VirtualMemory::copy_out`]'s (toward the files) or [`VirtualMemory::copy_in`]'s
    ///    (toward the device) first precondition for `dev .. dev + len`.
    ///
    /// # Errors
    /// Out of memory when the disk is full; a file shorter than written or unreadable, other
    /// file errors (logic errors naming the file); the virtual memory's copy errors.
    pub unsafe fn stream(
        &self,
        vm: &dyn VirtualMemory,
        toward: Toward,
        dev: usize,
        off: usize,
        len: usize,
    ) -> Result<()> {
        let mut io = self.io()?;
        let chunks: Vec<Chunk> = self
            .pieces(off, len)
            .into_iter()
            .map(|(file, file_off, at, n)| Chunk {
                file,
                file_off,
                dev: dev + (at - off),
                n,
            })
            .collect();
        match toward {
            // SAFETY: the caller's precondition 1, passed on.
            Toward::Copy => unsafe { self.write_chunks(&mut io, vm, &chunks) },
            // SAFETY: the caller's precondition 1, passed on.
            Toward::Device => unsafe { self.read_chunks(&mut io, vm, &chunks) },
        }
    }

    /// Writes `chunks` from the device to the files (see [`stream`](Self::stream)).
    ///
    /// # Safety
    /// 1. As [`VirtualMemory::copy_out`]'s first precondition for every chunk's device bytes.
    unsafe fn write_chunks(
        &self,
        io: &mut Io,
        vm: &dyn VirtualMemory,
        chunks: &[Chunk],
    ) -> Result<()> {
        // The chunk copied last, written once the next one's copy is queued.
        let mut pending: Option<(CopyFence, usize, Chunk)> = None;
        for &chunk in chunks {
            let b = io.next;
            io.next ^= 1;
            // SAFETY: the caller's precondition 1 for the device bytes; the staging range `b`
            // holds a chunk (at least `n` bytes), nothing else uses it, and its last chunk was
            // written before this copy is queued (written below, before the loop comes back to
            // it).
            unsafe { vm.copy_out(chunk.dev, io.staging[b].addr(), chunk.n) }?;
            let fence = vm.copy_fence()?;
            if let Some(p) = pending.replace((fence, b, chunk)) {
                self.write_staged(io, p)?;
            }
        }
        match pending {
            Some(p) => self.write_staged(io, p),
            None => Ok(()),
        }
    }

    /// Writes the chunk of staging range `b` (once its copy is done) to file `i` at `file_off`.
    fn write_staged(
        &self,
        io: &mut Io,
        (
            fence,
            b,
            Chunk {
                file: i,
                file_off,
                n,
                ..
            },
        ): (CopyFence, usize, Chunk),
    ) -> Result<()> {
        fence.wait()?;
        let addr = io.staging[b].addr();
        let f = &self.files[i];
        #[cfg(test)]
        self.count_write(f, n)?;
        let file = self.file(io, i)?;
        // SAFETY: the staging range holds at least `n` bytes at `addr`, all written by the copy
        // waited for above, and nothing writes them until this returns (the next copy into this
        // range is queued after).
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, n) };
        file.write_all_at(bytes, file_off as u64)
            .map_err(|e| file_error(&self.target, &f.path, "writing", &e, n))
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

    /// Reads `chunks` from the files into the device (see [`stream`](Self::stream)).
    ///
    /// # Safety
    /// 1. As [`VirtualMemory::copy_in`]'s first precondition for every chunk's device bytes.
    unsafe fn read_chunks(
        &self,
        io: &mut Io,
        vm: &dyn VirtualMemory,
        chunks: &[Chunk],
    ) -> Result<()> {
        for &Chunk {
            file: i,
            file_off,
            dev,
            n,
        } in chunks
        {
            let b = io.next;
            io.next ^= 1;
            if let Some(fence) = io.fences[b].take() {
                fence.wait()?;
            }
            let addr = io.staging[b].addr();
            let f = &self.files[i];
            let file = self.file(io, i)?;
            // SAFETY: the staging range holds at least `n` bytes at `addr`, and no copy reads
            // it now (its last one was waited for above).
            let bytes = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, n) };
            file.read_exact_at(bytes, file_off as u64).map_err(|e| {
                Error::Logic(format!(
                    "disk backup: reading {n} bytes at {file_off} of {}: {e} (the file changed \
                     since the sleep)",
                    f.path.display()
                ))
            })?;
            // SAFETY: the caller's precondition 1 for the device bytes; the staging bytes are
            // not written again until the copy's fence is waited for.
            unsafe { vm.copy_in(dev, addr, n) }?;
            io.fences[b] = Some(vm.copy_fence()?);
        }
        Ok(())
    }

    /// Ends a transition's streaming: after writes, the files are synced and their pages
    /// dropped from the page cache; the staging ranges go back to the supply (once no copy
    /// reads them) and the files are closed.
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
/// (default the temp dir), `RRMM_DISK_BENCH_GIB` (4), `RRMM_DISK_BENCH_CHUNK_MB` (256) and
/// `RRMM_DISK_BENCH_REPEATS` (3). The disk's own: the benches' probe (64 MiB buffered writes
/// and `fsync`; its pages dropped, 64 MiB buffered reads) and `O_DIRECT` writes and reads of a
/// chunk at a time (queue depth of one call). The backup streams as a sleep and a wake do: in
/// calls of 1 GiB (a device's map chunk), over files of 1 GiB.
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
        (write, read)
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
        let vm = HostVirtualMemory::new(bytes, Some(GIB), false, None).unwrap();
        let base = vm.base();
        vm.map(base, bytes).unwrap();
        // SAFETY: mapped pages of the reservation, used only here.
        let dev = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, bytes) };
        for (i, w) in dev.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&(i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
        }
        let want = dev.to_vec();
        let target = DiskTarget::new(&dir, Some(chunk)).unwrap();
        let supply: &'static HostPageSupply = Box::leak(Box::default());
        let files = vec![GIB; bytes / GIB];
        println!(
            "disk backup bench: {} GiB to {} in {} MiB chunks",
            bytes / GIB,
            dir.display(),
            chunk >> 20
        );
        for r in 0..repeats {
            let probe_buffered = probe(&dir, &mut dev[..GIB], bytes, 64 << 20, false);
            dev[..GIB].copy_from_slice(&want[..GIB]);
            let probe_direct = probe(&dir, &mut dev[..GIB], bytes, chunk, true);
            dev[..GIB].copy_from_slice(&want[..GIB]);
            let t = Instant::now();
            let copy =
                DiskCopy::create(&target, supply, PageSpec::plain(), "bench", &files).unwrap();
            for off in (0..bytes).step_by(GIB) {
                let n = GIB.min(bytes - off);
                // SAFETY: mapped pages nothing else uses.
                unsafe { copy.stream(&vm, Toward::Copy, base + off, off, n) }.unwrap();
            }
            copy.finish(true).unwrap();
            let pause = gbps(bytes, t);
            dev.fill(0);
            let t = Instant::now();
            copy.check().unwrap();
            for off in (0..bytes).step_by(GIB) {
                let n = GIB.min(bytes - off);
                // SAFETY: as above.
                unsafe { copy.stream(&vm, Toward::Device, base + off, off, n) }.unwrap();
            }
            copy.finish(false).unwrap();
            vm.wait_copies().unwrap();
            let wake = gbps(bytes, t);
            assert!(dev == want.as_slice(), "every byte back");
            drop(copy);
            println!(
                "repeat {r}: probe buffered write {:.2} read {:.2} | probe direct write {:.2} \
                 read {:.2} | backup pause {pause:.2} ({:.0}% / {:.0}%) wake {wake:.2} \
                 ({:.0}% / {:.0}%) GB/s",
                probe_buffered.0,
                probe_buffered.1,
                probe_direct.0,
                probe_direct.1,
                100.0 * pause / probe_buffered.0,
                100.0 * pause / probe_direct.0,
                100.0 * wake / probe_buffered.1,
                100.0 * wake / probe_direct.1,
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
