//! Host page ranges made ready fast: an anonymous reservation (no memory behind it), committed
//! in parts (read-write, transparent huge pages asked for, placed on a NUMA node, and faulted in
//! by several threads at once), and decommitted (the pages given back to the kernel).
//!
//! Why: pinning a range faults in each of its pages first. `cuMemHostAlloc` and
//! `cuMemHostRegister` of untouched memory do that on one thread in the kernel (16 GiB: 7-10 s
//! on the H100 machine); touching the pages from 16 threads with huge pages first and then
//! registering them takes about 1 s (benches/results/2026-11-23-h100-explore/).

use crate::error::{Error, Result};
use std::path::Path;

/// Bytes of one small page (the touch stride; huge pages are multiples of it).
pub const SMALL_PAGE: usize = 4096;

/// A transparent huge page on x86-64 and most arm64 kernels.
pub const HUGE_PAGE: usize = 2 << 20;

/// The least bytes one touching thread takes: fewer threads for small ranges.
const BYTES_PER_TOUCH_THREAD: usize = 64 << 20;

/// The most threads that fault pages in at once.
const MAX_TOUCH_THREADS: usize = 16;

/// How to commit a part of a reservation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Commit {
    /// The NUMA node to place the pages on (a preference: the kernel falls back to other
    /// nodes when this one is full); `None` leaves the process's policy.
    pub numa_node: Option<u32>,
    /// Fault every page in now, from several threads.
    pub populate: bool,
}

/// How long each step of a [`Reservation::commit_timed`] took, and what it did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommitTimes {
    /// `mprotect` to read-write.
    pub protect: std::time::Duration,
    /// `madvise(MADV_HUGEPAGE)` (ranges of a huge page or more).
    pub advise: std::time::Duration,
    /// `mbind` to the NUMA node (when one was given).
    pub place: std::time::Duration,
    /// Faulting every page in (when populating).
    pub touch: std::time::Duration,
    /// Threads that faulted pages in (0 when not populating).
    pub touch_threads: usize,
    /// Whether the kernel took the huge-page advice.
    pub huge_pages_advised: bool,
    /// Whether the kernel took the NUMA placement.
    pub node_placed: bool,
}

/// An anonymous address range, reserved without memory behind it, unmapped on drop.
#[derive(Debug)]
pub struct Reservation {
    base: usize,
    len: usize,
}

fn os_error(call: &str, bytes: usize) -> Error {
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENOMEM) {
        Error::out_of_memory(bytes, format!("{call}: {err}"))
    } else {
        Error::Logic(format!("{call}: {err}"))
    }
}

impl Reservation {
    /// Reserves `len` bytes (rounded up to huge pages) of addresses, aligned to a huge page.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the address space runs out (or the length passes its end);
    /// [`Error::InvalidArgument`] for 0.
    pub fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::invalid(
                "size",
                "a reservation needs at least one byte",
            ));
        }
        // More than the address space: out of memory, as any allocation of that size.
        let too_large = || Error::out_of_memory(len, "larger than the address space");
        let len = len
            .checked_next_multiple_of(HUGE_PAGE)
            .ok_or_else(too_large)?;
        let padded = len.checked_add(HUGE_PAGE).ok_or_else(too_large)?;
        // SAFETY: an anonymous private mapping at an address the kernel picks; no memory is
        // touched. PROT_NONE and MAP_NORESERVE: addresses only.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                padded,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(os_error("mmap", len));
        }
        let raw = raw as usize;
        let base = raw.next_multiple_of(HUGE_PAGE);
        let head = base - raw;
        let tail = padded - head - len;
        // SAFETY: the head and tail are parts of the mapping just made, outside [base, base+len).
        unsafe {
            if head > 0 {
                libc::munmap(raw as *mut libc::c_void, head);
            }
            if tail > 0 {
                libc::munmap((base + len) as *mut libc::c_void, tail);
            }
        }
        Ok(Reservation { base, len })
    }

    /// The first address.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Reserved bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (a reservation holds at least one huge page); for clippy's `len` rule.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: usize, bytes: usize) -> Result<usize> {
        match offset.checked_add(bytes) {
            Some(end) if end <= self.len && offset % SMALL_PAGE == 0 && bytes % SMALL_PAGE == 0 => {
                Ok(self.base + offset)
            }
            _ => Err(Error::invalid(
                "range",
                format!(
                    "{bytes} bytes at offset {offset} are not whole pages of a reservation of {}",
                    self.len
                ),
            )),
        }
    }

    /// Makes `offset .. offset + bytes` (whole small pages) readable and writable, asks for huge
    /// pages, places it on a node and faults it in as `how` says.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the kernel refuses the memory, or before anything is touched
    /// when the host has less memory available than the range ([`check_host_room`]: a range
    /// faulted in past it would have the process killed); [`Error::InvalidArgument`] for a range
    /// outside the reservation.
    pub fn commit(&self, offset: usize, bytes: usize, how: Commit) -> Result<()> {
        self.commit_timed(offset, bytes, how).map(|_| ())
    }

    /// As [`commit`](Self::commit), with the time of each step.
    ///
    /// # Errors
    /// As [`commit`](Self::commit).
    pub fn commit_timed(&self, offset: usize, bytes: usize, how: Commit) -> Result<CommitTimes> {
        let addr = self.check(offset, bytes)?;
        let mut times = CommitTimes::default();
        if bytes == 0 {
            return Ok(times);
        }
        check_host_room(bytes, how.populate)?;
        let ptr = addr as *mut libc::c_void;
        let step = std::time::Instant::now();
        // SAFETY: `addr .. addr + bytes` lies inside this reservation (checked above).
        if unsafe { libc::mprotect(ptr, bytes, libc::PROT_READ | libc::PROT_WRITE) } != 0 {
            return Err(os_error("mprotect", bytes));
        }
        times.protect = step.elapsed();
        let step = std::time::Instant::now();
        if bytes >= HUGE_PAGE {
            // SAFETY: as above. Advice only: a kernel without transparent huge pages refuses
            // it, and the range works with small pages.
            times.huge_pages_advised =
                unsafe { libc::madvise(ptr, bytes, libc::MADV_HUGEPAGE) } == 0;
        }
        times.advise = step.elapsed();
        let step = std::time::Instant::now();
        if let Some(node) = how.numa_node {
            // Advice too: a kernel without NUMA or a sandbox refusing mbind leaves the default.
            times.node_placed = prefer_node(addr, bytes, node);
        }
        times.place = step.elapsed();
        if how.populate {
            let step = std::time::Instant::now();
            // SAFETY: the range was made readable and writable above and belongs to this
            // reservation, which nothing else writes until the commit returns.
            times.touch_threads = unsafe { touch(addr, bytes) };
            times.touch = step.elapsed();
        }
        Ok(times)
    }

    /// Makes `offset .. offset + bytes` (whole small pages) readable and writable and nothing
    /// more: no room check (the caller checked the room for all it will ever commit at once),
    /// no huge-page advice (the pages stay small, so a [`decommit`](Self::decommit) gives back
    /// exactly the pages it names), no faulting in. Making committed pages writable again
    /// changes nothing.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the kernel refuses (its commit limit, or its count of
    /// mappings); [`Error::InvalidArgument`] for a range outside the reservation.
    pub fn protect_writable(&self, offset: usize, bytes: usize) -> Result<()> {
        let addr = self.check(offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `addr .. addr + bytes` lies inside this reservation (checked above); making
        // pages accessible changes no byte.
        if unsafe {
            libc::mprotect(
                addr as *mut libc::c_void,
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        } != 0
        {
            return Err(os_error("mprotect", bytes));
        }
        Ok(())
    }

    /// Gives the pages of `offset .. offset + bytes` back to the kernel and keeps the range
    /// accessible: the next touch of a page makes a fresh one (zeros). Never fails for lack of
    /// memory (nothing is committed anew).
    ///
    /// # Safety
    /// 1. Nothing reads or writes the range meanwhile (host code, or the device through a
    ///    registration); its bytes are gone after the call.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the reservation.
    pub unsafe fn renew(&self, offset: usize, bytes: usize) -> Result<()> {
        let addr = self.check(offset, bytes)?;
        if bytes > 0 {
            // SAFETY: inside this reservation; nothing uses it (the caller's precondition 1).
            unsafe { libc::madvise(addr as *mut libc::c_void, bytes, libc::MADV_DONTNEED) };
        }
        Ok(())
    }

    /// Gives the pages of `offset .. offset + bytes` back to the kernel and makes the range
    /// inaccessible again.
    ///
    /// # Safety
    /// 1. Nothing reads or writes the range (host code, or the device through a registration)
    ///    until it is committed again; a registration of it was undone first.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the reservation.
    pub unsafe fn decommit(&self, offset: usize, bytes: usize) -> Result<()> {
        let addr = self.check(offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        let ptr = addr as *mut libc::c_void;
        // SAFETY: inside this reservation; nothing uses it (the caller's precondition 1).
        unsafe {
            libc::madvise(ptr, bytes, libc::MADV_DONTNEED);
            if libc::mprotect(ptr, bytes, libc::PROT_NONE) != 0 {
                return Err(os_error("mprotect", bytes));
            }
        }
        Ok(())
    }
    /// Maps the first `bytes` of the file `fd` (whole small pages), shared, at `offset ..
    /// offset + bytes` of the reservation, readable and, when `writable`, writable, in place of
    /// what lay there (`MAP_FIXED`): a shared memory file's pages at chosen addresses (the
    /// expandable pool's shareable pages, an importer's map of a peer's pages).
    ///
    /// # Safety
    /// 1. Nothing reads or writes the range's old contents (they are replaced), and no other
    ///    file is mapped there that someone still uses.
    /// 2. The file holds at least `bytes` and cannot shrink (sealed): a read past its end would
    ///    be a `SIGBUS`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the reservation; [`Error::OutOfMemory`]
    /// or [`Error::Logic`] for the kernel's refusal (nothing changed then).
    pub unsafe fn map_file(
        &self,
        offset: usize,
        bytes: usize,
        fd: std::os::fd::BorrowedFd<'_>,
        writable: bool,
    ) -> Result<()> {
        use std::os::fd::AsRawFd;
        let addr = self.check(offset, bytes)?;
        let prot = match writable {
            true => libc::PROT_READ | libc::PROT_WRITE,
            false => libc::PROT_READ,
        };
        // SAFETY: `addr .. addr + bytes` lies inside this reservation (checked above), so the
        // fixed map replaces only its own addresses; the caller's preconditions 1 and 2.
        let raw = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                bytes,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(os_error("mmap of a memory file", bytes));
        }
        Ok(())
    }

    /// Puts reserved addresses (no memory, no access) back at `offset .. offset + bytes` (whole
    /// small pages), in place of a file mapped there by [`map_file`](Self::map_file); the file
    /// stays as long as another map or descriptor holds it.
    ///
    /// # Safety
    /// 1. Nothing reads or writes the range until it is mapped again.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the reservation; the kernel's refusal.
    pub unsafe fn unmap_file(&self, offset: usize, bytes: usize) -> Result<()> {
        let addr = self.check(offset, bytes)?;
        // SAFETY: inside this reservation (checked above), replaced by addresses only; nothing
        // uses it (the caller's precondition 1).
        let raw = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                bytes,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(os_error("mmap (reserve again)", bytes));
        }
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: the whole reservation, made by `new`; its owner dropped it, so nothing uses it.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Writes a zero into every small page of `addr .. addr + bytes` from several threads, so each
/// page is faulted in (fresh anonymous memory is zero already: the bytes do not change); the
/// number of threads.
///
/// # Safety
/// The range is mapped readable and writable, and nothing else uses it during the call.
unsafe fn touch(addr: usize, bytes: usize) -> usize {
    // SAFETY: the caller's contract (writable, unused).
    unsafe { touch_pages(addr, bytes, true) }
}

/// Reads a byte of every small page of `addr .. addr + bytes` from several threads, so each
/// page is faulted in where the memory's owner (the kernel, or the CUDA driver for managed
/// memory advised to live on the host) makes it; changes no data.
///
/// # Safety
/// The range is mapped and readable for the whole call.
pub unsafe fn fault_in_readonly(addr: usize, bytes: usize) {
    // SAFETY: the caller's contract (readable); reads change nothing.
    unsafe { touch_pages(addr, bytes, false) };
}

/// Touches every small page of the range from several threads, a write of zero or a read; the
/// number of threads.
///
/// # Safety
/// The range is mapped readable (and writable, when `write`) and, when `write`, nothing else
/// uses it during the call.
unsafe fn touch_pages(addr: usize, bytes: usize, write: bool) -> usize {
    let threads = (bytes / BYTES_PER_TOUCH_THREAD)
        .clamp(1, MAX_TOUCH_THREADS)
        .min(std::thread::available_parallelism().map_or(1, |n| n.get().max(1)));
    let per_thread = bytes.div_ceil(threads).next_multiple_of(SMALL_PAGE);
    let touch_part = |start: usize, end: usize| {
        let mut page = start;
        while page < end {
            if write {
                // SAFETY: `page` lies in the caller's writable range (the function's contract).
                unsafe { std::ptr::write_volatile(page as *mut u8, 0) };
            } else {
                // SAFETY: `page` lies in the caller's readable range (the function's contract).
                let _ = unsafe { std::ptr::read_volatile(page as *const u8) };
            }
            page += SMALL_PAGE;
        }
    };
    if threads == 1 {
        touch_part(addr, addr + bytes);
        return 1;
    }
    std::thread::scope(|scope| {
        for i in 0..threads {
            let start = addr + i * per_thread;
            let end = (start + per_thread).min(addr + bytes);
            if start < end {
                scope.spawn(move || touch_part(start, end));
            }
        }
    });
    threads
}

/// `MPOL_PREFERRED` (linux/mempolicy.h).
const MPOL_PREFERRED: libc::c_int = 1;

/// Asks the kernel to place the pages of the range on `node` (a preference). False when it
/// refused (no NUMA support, a sandbox, a node that does not exist).
fn prefer_node(addr: usize, bytes: usize, node: u32) -> bool {
    const WORDS: usize = 16;
    let node = node as usize;
    if node >= WORDS * 64 {
        return false;
    }
    let mut mask = [0u64; WORDS];
    mask[node / 64] |= 1 << (node % 64);
    // SAFETY: mbind reads `WORDS * 64` bits of `mask` (maxnode is the bit count plus one, as
    // the kernel counts it) and changes only the policy of the caller's range.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            bytes,
            MPOL_PREFERRED,
            mask.as_ptr(),
            WORDS * 64 + 1,
            0u32,
        )
    };
    rc == 0
}

/// The NUMA node the page at `addr` lives on, asked of the kernel (`move_pages` without moving
/// anything); `None` for a page that is not present or where the kernel will not say.
pub fn numa_node_of(addr: usize) -> Option<u32> {
    let page = (addr & !(SMALL_PAGE - 1)) as *mut libc::c_void;
    let mut status: libc::c_int = -1;
    // SAFETY: one page address in, one status out; with `nodes` null nothing moves. Queries of
    // this process (pid 0).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            0,
            1usize,
            &page as *const *mut libc::c_void,
            std::ptr::null::<libc::c_int>(),
            &mut status as *mut libc::c_int,
            0,
        )
    };
    (rc == 0 && status >= 0).then_some(status as u32)
}

/// The NUMA nodes the kernel lists (`/sys/devices/system/node/node*`); 1 where it lists none.
pub fn numa_node_count() -> usize {
    std::fs::read_dir("/sys/devices/system/node")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .filter(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    name.strip_prefix("node")
                        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                })
                .count()
        })
        .unwrap_or(0)
        .max(1)
}

/// Bytes of host memory this process can still get without the kernel reclaiming what others
/// use: `/proc/meminfo`'s MemAvailable, capped by the room left under every memory limit of
/// the process's control groups (v1 and v2, its own group and every ancestor:
/// [`super::cgroup`]); and the free swap (`SwapFree`), capped by the groups' swap limits.
pub fn available_host_memory() -> Option<HostRoom> {
    let cap = ROOM_CAP.load(std::sync::atomic::Ordering::Relaxed);
    let room = available_host_memory_under(Path::new("/"));
    if cap == usize::MAX {
        return room;
    }
    // A cap set by a test: the host's room runs out at it (swap too).
    Some(match room {
        Some(r) => HostRoom {
            available: r.available.min(cap),
            swap_free: 0,
            ..r
        },
        None => HostRoom {
            available: cap,
            swap_free: 0,
            cgroup_room: None,
            cgroup_limit_file: None,
        },
    })
}

/// A cap on the host memory the checks find available ([`available_host_memory`]);
/// `usize::MAX`: none.
// Why process-wide: the host's room is the process's, read by every check of it; tests cap it
// to make the host run out where they choose.
static ROOM_CAP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(usize::MAX);

/// Caps the host memory every check of the host's room finds available at `cap` bytes (`None`:
/// the host's own figure): for tests of what runs out of host memory (a sleep's copy, spill
/// pages, a promotion), on any machine.
pub fn set_room_cap(cap: Option<usize>) {
    ROOM_CAP.store(
        cap.unwrap_or(usize::MAX),
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// [`available_host_memory`] as the tree under `root` shows it (`root/proc/meminfo`, the
/// control groups under `root`): for tests with a fake tree.
pub fn available_host_memory_under(root: &Path) -> Option<HostRoom> {
    let text = std::fs::read_to_string(root.join("proc/meminfo")).ok()?;
    let mem_available = meminfo_field(&text, "MemAvailable:")?;
    let swap_total_free = meminfo_field(&text, "SwapFree:").unwrap_or(0);
    let cgroup = super::cgroup::room_under(root);
    let cgroup_room = cgroup.resident();
    let available = cgroup_room.map_or(mem_available, |room| room.min(mem_available));
    let mut swap_free = cgroup
        .swap
        .map_or(swap_total_free, |room| room.min(swap_total_free));
    if let Some(both) = cgroup.memory_and_swap {
        // v1's memory-and-swap limit caps the two together.
        swap_free = swap_free.min(both.saturating_sub(available));
    }
    Some(HostRoom {
        available,
        swap_free,
        cgroup_room,
        cgroup_limit_file: cgroup.memory_limit_file,
    })
}

/// What [`available_host_memory`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRoom {
    /// Bytes of memory available (MemAvailable, capped by the control groups' room).
    pub available: usize,
    /// Bytes of free swap the process may use (SwapFree, capped by the groups' swap limits).
    pub swap_free: usize,
    /// Bytes left under the control groups' memory limits, where there is one.
    pub cgroup_room: Option<usize>,
    /// The file of the tightest memory limit, where there is one (for messages).
    pub cgroup_limit_file: Option<std::path::PathBuf>,
}

fn meminfo_field(text: &str, name: &str) -> Option<usize> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses, before anything is touched, to commit `bytes` of host memory the host cannot give:
/// pages faulted in now (`populate`, as pinning does: pinned pages never swap) must fit in the
/// available memory ([`available_host_memory`]); pages left to fault in on use must fit in the
/// available memory plus the free swap. Past that the kernel's out-of-memory killer ends the
/// process instead of an error. Where the figures cannot be read, nothing is refused.
///
/// # Errors
/// [`Error::OutOfMemory`] naming the bytes asked for and available.
pub fn check_host_room(bytes: usize, populate: bool) -> Result<()> {
    check_room(available_host_memory(), bytes, populate)
}

/// [`check_host_room`] against the tree under `root` (see [`available_host_memory_under`]).
///
/// # Errors
/// As [`check_host_room`].
pub fn check_host_room_under(root: &Path, bytes: usize, populate: bool) -> Result<()> {
    check_room(available_host_memory_under(root), bytes, populate)
}

/// [`check_host_room`] against `room` (`None`: unknown, nothing refused).
fn check_room(room: Option<HostRoom>, bytes: usize, populate: bool) -> Result<()> {
    let Some(room) = room else {
        return Ok(());
    };
    let limit = if populate {
        room.available
    } else {
        room.available.saturating_add(room.swap_free)
    };
    if bytes <= limit {
        return Ok(());
    }
    let what = if populate {
        "pinned host memory (faulted in now; pinned pages never swap)"
    } else {
        "host memory"
    };
    let cgroup = match (room.cgroup_room, &room.cgroup_limit_file) {
        (Some(r), Some(file)) => {
            format!(
                ", {r} bytes under the control group's limit ({})",
                file.display()
            )
        }
        (Some(r), None) => format!(", {r} bytes under the control group's limit"),
        _ => String::new(),
    };
    let swap = if populate {
        String::new()
    } else {
        format!(" plus {} bytes of free swap", room.swap_free)
    };
    Err(Error::out_of_memory(
        bytes,
        format!(
            "{what}: {bytes} bytes asked for, but the host has only {} bytes available \
             (MemAvailable{cgroup}){swap}: refused before any page was touched",
            room.available
        ),
    ))
}

/// Total and available host memory in bytes (`/proc/meminfo`'s MemTotal and MemAvailable).
pub fn host_memory_info() -> Option<(usize, usize)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    Some((
        meminfo_field(&text, "MemAvailable:")?,
        meminfo_field(&text, "MemTotal:")?,
    ))
}

/// The seals every shared memory file carries: its size cannot change, nor its seals.
pub fn memory_file_seals() -> rustix::fs::SealFlags {
    use rustix::fs::SealFlags;
    SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL
}

/// A new shared memory file (`memfd_create`, closed on exec) of `size` bytes of zeros, sealed
/// at that size ([`memory_file_seals`]): what other processes may map without fearing that it
/// shrinks under them.
///
/// # Errors
/// [`Error::InvalidArgument`] for no bytes; [`Error::OutOfMemory`] or [`Error::Logic`] for the
/// kernel's refusal.
pub fn sealed_memory_file(size: u64) -> Result<std::os::fd::OwnedFd> {
    use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags};
    if size == 0 {
        return Err(Error::invalid("size", "a memory file of no bytes"));
    }
    let io = |call: &str, e: rustix::io::Errno| match e {
        rustix::io::Errno::NOMEM | rustix::io::Errno::NOSPC => {
            Error::out_of_memory(size as usize, format!("{call}: {e}"))
        }
        e => Error::Logic(format!("{call}: {e}")),
    };
    let fd = memfd_create(
        "rrmm-shared",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .map_err(|e| io("memfd_create", e))?;
    ftruncate(&fd, size).map_err(|e| io("ftruncate", e))?;
    fcntl_add_seals(&fd, memory_file_seals()).map_err(|e| io("sealing a memory file", e))?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_committed_range_is_zero_and_writable_and_decommits() {
        let r = Reservation::new(3 * HUGE_PAGE + 1).unwrap();
        assert_eq!(r.len(), 4 * HUGE_PAGE);
        assert_eq!(r.base() % HUGE_PAGE, 0);
        let how = Commit {
            numa_node: Some(0),
            populate: true,
        };
        r.commit(HUGE_PAGE, 2 * HUGE_PAGE, how).unwrap();
        let bytes = r.base() + HUGE_PAGE;
        // SAFETY: committed read-write above, owned by this test.
        let slice = unsafe { std::slice::from_raw_parts_mut(bytes as *mut u8, 2 * HUGE_PAGE) };
        assert!(slice.iter().all(|&b| b == 0));
        slice.fill(7);
        // Committed and touched: the kernel knows where the page is (node 0 on a one-node box).
        if numa_node_count() == 1 {
            assert_eq!(numa_node_of(bytes), Some(0));
        }
        // SAFETY: nothing uses the range after this.
        unsafe { r.decommit(HUGE_PAGE, 2 * HUGE_PAGE) }.unwrap();
        r.commit(HUGE_PAGE, HUGE_PAGE, Commit::default()).unwrap();
        // SAFETY: committed again; decommitted pages come back as zeros.
        let again = unsafe { std::slice::from_raw_parts(bytes as *const u8, HUGE_PAGE) };
        assert!(again.iter().all(|&b| b == 0));
    }

    #[test]
    fn ranges_outside_the_reservation_are_refused() {
        let r = Reservation::new(HUGE_PAGE).unwrap();
        assert!(r.commit(HUGE_PAGE, SMALL_PAGE, Commit::default()).is_err());
        assert!(r.commit(1, SMALL_PAGE, Commit::default()).is_err());
        assert!(r.commit(0, usize::MAX, Commit::default()).is_err());
        assert!(Reservation::new(0).is_err());
        assert!(Reservation::new(usize::MAX).unwrap_err().is_out_of_memory());
        assert!(Reservation::new(usize::MAX - 4095)
            .unwrap_err()
            .is_out_of_memory());
    }

    /// Issue 29: a pinned pool larger than the host (`pinned_pool_size=2**40` on a machine with
    /// about 125 GB free) faulted pages in until the kernel killed the process. A commit larger
    /// than the host can give is refused before any page is touched, and the reservation still
    /// works. (The pageable case is checked first: before the fix it succeeded, failing the test
    /// without faulting anything in.)
    #[test]
    fn a_commit_larger_than_the_host_is_refused_before_any_page_is_touched() {
        let room = available_host_memory().unwrap();
        assert!(room.available > 0);
        let too_much = (room.available + room.swap_free + (1 << 30)).next_multiple_of(HUGE_PAGE);
        let r = Reservation::new(too_much).unwrap();
        for populate in [false, true] {
            let how = Commit {
                numa_node: None,
                populate,
            };
            let e = r.commit(0, too_much, how).unwrap_err();
            assert!(e.is_out_of_memory(), "{e}");
            let text = e.to_string();
            assert!(
                text.contains(&format!("{too_much} bytes asked for")),
                "{text}"
            );
            assert!(text.contains("bytes available"), "{text}");
        }
        assert!(check_host_room(too_much, true).is_err());
        assert!(check_host_room(HUGE_PAGE, true).is_ok());
        // Nothing was made accessible: the reservation commits a page as before.
        let how = Commit {
            numa_node: None,
            populate: true,
        };
        let times = r.commit_timed(0, HUGE_PAGE, how).unwrap();
        assert_eq!(times.touch_threads, 1);
        // SAFETY: committed just above; nothing else uses it.
        unsafe { r.decommit(0, HUGE_PAGE) }.unwrap();
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Issue 39: the room check refuses exactly what a model of every limit refuses, on
        /// fake trees of control groups (v1, v2, both; limits on the own group or any
        /// ancestor) beside a fake `/proc/meminfo`: resident (pinned) memory under the least
        /// memory room, pageable memory under that plus the swap the groups allow.
        #[test]
        fn the_room_check_refuses_what_any_limit_refuses(
            tree in crate::os::cgroup::tests::tree(),
            mem_available in 0..1usize << 41,
            swap_total_free in 0..1usize << 39,
            bytes in 0..1usize << 41,
            populate: bool,
        ) {
            let root = crate::os::cgroup::tests::FakeRoot::new();
            tree.write(&root);
            root.write(
                "/proc/meminfo",
                &format!(
                    "MemTotal: 99999999999 kB\nMemAvailable: {} kB\nSwapFree: {} kB\n",
                    mem_available / 1024,
                    swap_total_free / 1024
                ),
            );
            let (mem_available, swap_total_free) =
                (mem_available / 1024 * 1024, swap_total_free / 1024 * 1024);
            let (memory, swap, both) = tree.room();
            let mut available = mem_available;
            for room in [memory, both].into_iter().flatten() {
                available = available.min(room);
            }
            let mut swap_free = swap.map_or(swap_total_free, |s| s.min(swap_total_free));
            if let Some(both) = both {
                swap_free = swap_free.min(both.saturating_sub(available));
            }
            let limit = if populate { available } else { available + swap_free };
            let got = check_host_room_under(&root.0, bytes, populate);
            proptest::prop_assert_eq!(got.is_ok(), bytes <= limit, "{:?}", got);
            if let Err(e) = got {
                proptest::prop_assert!(e.is_out_of_memory());
                let text = e.to_string();
                proptest::prop_assert!(text.contains(&format!("{bytes} bytes asked for")), "{}", text);
                if memory.is_some() {
                    proptest::prop_assert!(text.contains("control group's limit ("), "{}", text);
                }
            }
        }
    }

    /// Issue 39's offload of 128 MiB under a 32 MiB limit on the own v1 group, or on a parent
    /// v2 group: refused, where the machine has memory to spare.
    #[test]
    fn an_offload_past_a_group_limit_is_refused() {
        use crate::os::cgroup::tests::{issue_cases, FakeRoot};
        const MIB: usize = 1 << 20;
        for tree in issue_cases() {
            let root = FakeRoot::new();
            tree.write(&root);
            root.write(
                "/proc/meminfo",
                "MemAvailable: 16777216 kB\nSwapFree: 0 kB\n",
            );
            for populate in [true, false] {
                let e = check_host_room_under(&root.0, 128 * MIB, populate).unwrap_err();
                assert!(e.to_string().contains("32505856 bytes available"), "{e}");
            }
            assert!(check_host_room_under(&root.0, 16 * MIB, true).is_ok());
        }
    }

    #[test]
    fn the_machine_has_a_node_and_memory() {
        assert!(numa_node_count() >= 1);
        let (available, total) = host_memory_info().unwrap();
        assert!(available <= total && total > 0);
        assert_eq!(numa_node_of(0), None);
    }
}
