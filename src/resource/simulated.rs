//! A pretend device that behaves like the driver: capacity counted in pages, addresses from a
//! space much larger than the capacity, no memory behind them.
//!
//! The CUDA driver maps physical pages wherever they are free into a large virtual address
//! space, so `cuMemAlloc` fails only when pages run out, never because of where earlier
//! allocations sit. The simulated device does the same: it charges each allocation against its
//! capacity (whole 2 MiB pages for requests of a page or more, 256-byte units for smaller ones,
//! which the driver packs into shared pages) and places it in an address space 64 times the
//! capacity (at most 64 PiB of addresses, and at least twice the capacity), so placement never
//! decides whether an allocation succeeds. That space is a window of the simulated address
//! space ([`Window`]) that no other live simulated device or simulated virtual memory holds;
//! when none is left a device is refused ([`SimulatedMemoryResource::try_new`]) or gets no
//! addresses, never another's.

use super::address_ranges::AddressRanges;
use super::{align_up, Footprint, MemoryKind, MemoryResource, PoolReport, ALLOCATION_ALIGNMENT};
use crate::cuda::Stream;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;

/// Every simulated address (of simulated devices and simulated virtual memory) is at least this:
/// 2^56, above every user-space address a process can have (x86-64 gives user space 47 bits,
/// or 56 with five-level paging; arm64 at most 52), so simulated ranges never overlap host or
/// CUDA memory, whatever their size, and an address is simulated exactly when it is this or
/// above.
pub const SIMULATED_ADDRESS_BASE: usize = 1 << 56;

/// The end of the simulated address space: 2^64 - 2^56, so the space holds 255 windows of
/// 2^56 bytes (the largest device's) and no window's end wraps.
const ADDRESS_END: usize = usize::MAX - (SIMULATED_ADDRESS_BASE - 1);

/// The simulated address space's windows: free ranges, and how many windows are live and the
/// bytes they hold (for the error when none is left).
#[derive(Debug)]
struct Windows {
    free: AddressRanges,
    live: usize,
    held: usize,
}

impl Windows {
    /// `[start, start + len)`, all free.
    fn new(start: usize, len: usize) -> Self {
        Windows {
            free: AddressRanges::new(start, len),
            live: 0,
            held: 0,
        }
    }

    /// The base of a free window of `len` bytes (> 0), or why there is none.
    fn place(&mut self, len: usize) -> std::result::Result<usize, String> {
        let Some(base) = self.free.place(len) else {
            return Err(format!(
                "no window of {len} bytes is free in the simulated address space \
                 ({SIMULATED_ADDRESS_SPACE} bytes): {} live simulated devices and virtual \
                 memories hold {} bytes of it; drop some (no two live simulated devices may \
                 share addresses)",
                self.live, self.held
            ));
        };
        self.live += 1;
        self.held += len;
        Ok(base)
    }

    /// Gives back the window [`Self::place`] handed out at `base`.
    fn unplace(&mut self, base: usize, len: usize) {
        self.free.unplace(base, len);
        self.live -= 1;
        self.held -= len;
    }
}

/// The windows of the simulated address space that live simulated devices and simulated
/// virtual memory hold: each takes its own (its whole address space), so no two live ones hand
/// out the same address (a fallback's upstream and alternate, or a cache and the device
/// beneath, stay told apart by address).
// Why process-wide: no two live simulated devices may hand out the same address.
static WINDOWS: parking_lot::Mutex<Option<Windows>> = parking_lot::Mutex::new(None);

/// Bytes of the simulated address space all windows come from.
pub const SIMULATED_ADDRESS_SPACE: usize = ADDRESS_END - SIMULATED_ADDRESS_BASE;

/// A window of the simulated address space, held until it drops: the addresses of one simulated
/// device or simulated virtual memory, overlapping no other live window.
#[derive(Debug)]
pub(crate) struct Window {
    base: usize,
    len: usize,
}

impl Window {
    /// A window of `len` bytes for `what` (named in the error).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when no free range of the simulated address space holds `len`
    /// bytes (the live windows hold it): an error rather than a window shared with a live
    /// device, whose addresses would then be handed out twice.
    pub(crate) fn take(len: usize, what: &str) -> Result<Window> {
        Self::place(len).map_err(|why| Error::out_of_memory(len, format!("{what}: {why}")))
    }

    /// A window of `len` bytes (rounded up to 2 MiB, at least that: every window starts at a
    /// multiple of 2 MiB), or why there is none.
    fn place(len: usize) -> std::result::Result<Window, String> {
        let len = len
            .max(1)
            .checked_next_multiple_of(SIMULATED_PAGE_SIZE)
            .ok_or_else(|| format!("{len} bytes is more than the simulated address space"))?;
        let base = WINDOWS
            .lock()
            .get_or_insert_with(|| Windows::new(SIMULATED_ADDRESS_BASE, SIMULATED_ADDRESS_SPACE))
            .place(len)?;
        Ok(Window { base, len })
    }

    /// The window's first address.
    pub(crate) fn base(&self) -> usize {
        self.base
    }

    /// The window's bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        if let Some(windows) = WINDOWS.lock().as_mut() {
            windows.unplace(self.base, self.len);
        }
    }
}

/// The largest address space of a device.
const MAX_ADDRESS_SPACE: usize = 1 << 61;

/// The largest simulated device (32 PiB): byte counters over it never overflow, and its window
/// (64 PiB, twice its size) leaves room for 254 more of it.
pub const MAX_SIMULATED_SIZE: usize = MAX_ADDRESS_SPACE / ADDRESS_SPACE_FACTOR;

/// The driver's page: allocations of at least this size are charged in whole pages.
pub const SIMULATED_PAGE_SIZE: usize = 2 << 20;

/// The address space is this many times the capacity, up to [`MAX_WINDOW`].
const ADDRESS_SPACE_FACTOR: usize = 64;

/// The largest window a device takes when 64 times its capacity is more (64 PiB; the device
/// still gets twice its capacity): the simulated space then holds 255 devices of the largest
/// size at once. Past that a device is refused ([`Window::take`]): devices that shared a window
/// handed out each other's addresses (a tiered resource over simulated tiers saw a pointer
/// "already live"; issue 39: 70 of the largest devices gave 7 pairs of overlapping live
/// addresses, and a fallback over two of them freed to the wrong one).
const MAX_WINDOW: usize = 1 << 56;

/// The smallest address space (1 TiB), so small devices also place freely.
const MIN_ADDRESS_SPACE: usize = 1 << 40;

/// Address space of a device with host memory behind it, per byte of capacity (reserved for
/// real as addresses only, so smaller than [`ADDRESS_SPACE_FACTOR`]; room for the 2 MiB page
/// rounding). Only the pages of live allocations have memory behind them.
const BACKED_SPACE_FACTOR: usize = 4;

/// Hands out 256-byte-aligned address ranges of a pretend device of `size` bytes, so replays
/// and suballocator tests run at any GPU size on a machine without one. The pointers must never
/// be dereferenced.
///
/// An allocation fails (out of memory) only when the capacity is used up: requests of 2 MiB or
/// more are charged in whole 2 MiB pages, smaller ones in 256-byte units. Frees are checked: a
/// pointer that is not live, or a size that rounds differently from the allocation's, is a
/// [`Error::Logic`] and changes nothing.
///
/// # Time Complexity
/// O(log n) per call in the number of live allocations and free address ranges; a failed
/// allocation is O(1) (a counter check).
///
/// # Managed memory
/// [`SimulatedMemoryResource::managed`] adds a host tier: like `cuMemAllocManaged`, allocations
/// succeed beyond the device's size (up to the device plus the host tier), and the bytes beyond
/// the device (in use minus the device's size: what would live in host memory) are counted, now
/// and at their peak ([`beyond_device_bytes`](Self::beyond_device_bytes)).
#[derive(Debug)]
pub struct SimulatedMemoryResource {
    size: usize,
    /// The first address the device hands out.
    base: usize,
    /// The device's window of the simulated address space (none with host memory behind it,
    /// or when none was left: then `refused` says why).
    window: Option<Window>,
    /// Why the device has no addresses: every allocation fails saying so ([`Self::new`] when
    /// the simulated address space had no window left; [`Self::try_new`] refuses instead).
    refused: Option<String>,
    /// Bytes of host memory managed allocations may use beyond the device (0: a plain device).
    host_tier: usize,
    /// With [`with_backing`](Self::with_backing): the host memory behind the window, so the
    /// bytes are kept (tests and examples of code that copies); `None`: addresses only.
    backing: Option<Backing>,
    /// With [`shared`](Self::shared): the device's capacity is shared by name with other
    /// processes (and this process's other devices of the name), each charge checked against
    /// what they all hold.
    shared: Option<crate::shared_gpu::simulated_device::SharedDevice>,
    state: Mutex<SimulatedState>,
}

/// The host memory of a device made by [`SimulatedMemoryResource::with_backing`]: addresses
/// reserved with nothing behind them; the pages a live allocation touches are committed
/// (readable and writable) when it is made and given back when no live allocation touches them
/// any more, so the device holds about its bytes in use of host memory, never its whole
/// reservation (issue 39: the reservation, four times the size, was committed at once, and a
/// 16 GiB device failed on a 23 GiB machine).
#[derive(Debug)]
struct Backing {
    reservation: crate::os::host_pages::Reservation,
    /// The host's page (the commit granularity).
    page: usize,
}

impl Backing {
    /// The pages (offsets in the reservation) `[start, start + len)` touches: the first, and one
    /// past the last.
    fn span(&self, start: usize, len: usize) -> (usize, usize) {
        let offset = start - self.reservation.base();
        (
            offset / self.page * self.page,
            (offset + len).next_multiple_of(self.page),
        )
    }

    /// The first and last page of `span` (one page: both the same).
    fn edges(&self, (lo, hi): (usize, usize)) -> impl Iterator<Item = usize> {
        let last = hi - self.page;
        std::iter::once(lo).chain((last != lo).then_some(last))
    }

    /// Commits the pages of a new allocation at `start` of `len` bytes, counting the users of
    /// its first and last page (pages between are its own).
    fn commit(&self, s: &mut SimulatedState, start: usize, len: usize) -> Result<()> {
        let span = self.span(start, len);
        self.reservation.protect_writable(span.0, span.1 - span.0)?;
        let mut edges = 0;
        for edge in self.edges(span) {
            edges += 1;
            let users = s.page_users.entry(edge).or_insert(0);
            if *users == 0 {
                s.committed += self.page;
            }
            *users += 1;
        }
        s.committed += span.1 - span.0 - edges * self.page;
        Ok(())
    }

    /// Gives back the pages of the freed allocation at `start` of `len` bytes that no live
    /// allocation touches: those between its first and last page, and each of those two whose
    /// last user it was.
    ///
    /// # Safety
    /// Nothing reads or writes the freed allocation any more (`deallocate`'s precondition 3).
    unsafe fn decommit(&self, s: &mut SimulatedState, start: usize, len: usize) {
        let span = self.span(start, len);
        let mut gone = Vec::with_capacity(3);
        let (first, last) = (span.0, span.1 - self.page);
        if last > first + self.page {
            gone.push((first + self.page, last - first - self.page));
        }
        for edge in self.edges(span) {
            if let Some(users) = s.page_users.get_mut(&edge) {
                *users -= 1;
                if *users == 0 {
                    s.page_users.remove(&edge);
                    gone.push((edge, self.page));
                }
            }
        }
        for (offset, bytes) in gone {
            // SAFETY: no live allocation touches these pages (the ones between the first and
            // last page were the freed allocation's alone; a first or last page is given back
            // only when no live allocation counts as its user), and nothing uses the freed
            // allocation (the caller's contract). The pages go back to the kernel before the
            // protection changes, so where the kernel refuses the change (its count of
            // mappings) the memory is given back all the same and the free still succeeds.
            let _ = unsafe { self.reservation.decommit(offset, bytes) };
            s.committed -= bytes;
        }
    }
}

#[derive(Debug)]
struct SimulatedState {
    /// Free addresses of the device's window.
    ranges: AddressRanges,
    /// Live allocations: start -> (256-rounded request, bytes charged).
    live: HashMap<usize, (usize, usize)>,
    /// Bytes charged to live allocations.
    in_use: usize,
    peak: usize,
    /// With host memory behind the device: the live allocations whose first or last page is
    /// the page at each offset, and the bytes of the committed pages.
    page_users: HashMap<usize, u32>,
    committed: usize,
    /// `in_use`, as the process's figures of this device read it ([`crate::pressure`]):
    /// registered at the first allocation, when the device has its final address.
    held: Option<std::sync::Arc<std::sync::atomic::AtomicUsize>>,
}

impl SimulatedState {
    /// No allocation yet over the free addresses `ranges`.
    fn new(ranges: AddressRanges) -> Self {
        SimulatedState {
            ranges,
            live: HashMap::new(),
            held: None,
            in_use: 0,
            peak: 0,
            page_users: HashMap::new(),
            committed: 0,
        }
    }
}

/// Bytes the device charges for `bytes` (pages for large requests); `None` on overflow.
fn charge(bytes: usize) -> Option<usize> {
    if bytes >= SIMULATED_PAGE_SIZE {
        align_up(bytes, SIMULATED_PAGE_SIZE)
    } else {
        align_up(bytes, ALLOCATION_ALIGNMENT)
    }
}

/// The address space of a device of `size` bytes: at least 64 times the capacity.
fn address_space(size: usize) -> usize {
    size.saturating_mul(ADDRESS_SPACE_FACTOR)
        .clamp(MIN_ADDRESS_SPACE, MAX_WINDOW)
        .max(size.saturating_mul(2))
        .min(MAX_ADDRESS_SPACE)
        & !(SIMULATED_PAGE_SIZE - 1)
}

impl SimulatedMemoryResource {
    /// The pretend addresses this device may hand out (pointers to check copies against).
    /// Empty for a device that got no addresses (see [`new`](Self::new)).
    pub fn address_range(&self) -> std::ops::Range<usize> {
        match (&self.backing, &self.window) {
            (Some(b), _) => self.base..self.base + b.reservation.len(),
            (None, Some(w)) => w.base()..w.base() + w.len(),
            (None, None) => 0..0,
        }
    }

    /// A pretend device of `size` bytes (rounded down to 256, and to at most
    /// [`MAX_SIMULATED_SIZE`]). Where the simulated address space has no window left for it
    /// (hundreds of the largest devices live) the device gets no addresses: every allocation is
    /// out of memory saying so ([`try_new`](Self::try_new) refuses at once instead); it never
    /// shares another live device's addresses.
    pub fn new(size: usize) -> Self {
        Self::managed(size, 0)
    }

    /// As [`new`](Self::new), refusing a device the simulated address space has no window for.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] naming the live windows when none is left.
    pub fn try_new(size: usize) -> Result<Self> {
        Self::try_managed(size, 0)
    }

    /// A pretend device of `size` bytes whose memory is managed memory with `host_tier` bytes of
    /// host memory beyond it (see the type's doc; [`MAX_SIMULATED_SIZE`] in all at most); with
    /// no addresses where none are left, as [`new`](Self::new).
    pub fn managed(size: usize, host_tier: usize) -> Self {
        let (size, host_tier, space) = Self::sizes(size, host_tier);
        Self::over(size, host_tier, Window::place(space))
    }

    /// As [`managed`](Self::managed), refusing a device the simulated address space has no
    /// window for.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] naming the live windows when none is left.
    pub fn try_managed(size: usize, host_tier: usize) -> Result<Self> {
        let (size, host_tier, space) = Self::sizes(size, host_tier);
        let window = Window::take(space, "simulated device")?;
        Ok(Self::over(size, host_tier, Ok(window)))
    }

    /// The device's size and host tier (rounded down to 256, [`MAX_SIMULATED_SIZE`] in all at
    /// most) and its address space.
    fn sizes(size: usize, host_tier: usize) -> (usize, usize, usize) {
        let size = size.min(MAX_SIMULATED_SIZE) & !(ALLOCATION_ALIGNMENT - 1);
        let host_tier = host_tier.min(MAX_SIMULATED_SIZE - size) & !(ALLOCATION_ALIGNMENT - 1);
        (size, host_tier, address_space(size + host_tier))
    }

    /// A device over `window`, or with no addresses and why.
    fn over(size: usize, host_tier: usize, window: std::result::Result<Window, String>) -> Self {
        let (window, refused) = match window {
            Ok(w) => (Some(w), None),
            Err(e) => (None, Some(e)),
        };
        let (base, space) = window.as_ref().map_or((0, 0), |w| (w.base(), w.len()));
        SimulatedMemoryResource {
            size,
            base,
            window,
            refused,
            host_tier,
            backing: None,
            shared: None,
            state: Mutex::new(SimulatedState::new(AddressRanges::new(base, space))),
        }
    }

    /// A pretend device of `size` bytes (as [`try_new`](Self::try_new)) whose capacity is
    /// shared with every other process that makes the device called `name` (and this process's
    /// other devices of the name): they compete for its bytes, as processes on one GPU do, each
    /// with its own addresses. Its link names the ledger the processes over it join
    /// ([`Link::device_key`](super::Link::device_key): `shared-<name>`), so the ledger's asks
    /// (trims of the others' pools, sleeps of idle processes) can be watched on any machine
    /// ([`crate::shared_gpu::simulated_device`]: a locked table under the ledger's directory,
    /// `RRMM_LEDGER_DIR`). Each allocation and free reads and writes that table (microseconds):
    /// for tests and demonstrations of sharing, not for replays.
    ///
    /// # Errors
    /// As [`try_new`](Self::try_new) and
    /// [`SharedDevice::open`](crate::shared_gpu::simulated_device::SharedDevice::open): a name
    /// that cannot name a directory, a size other than the one the processes on it made it
    /// with, a ledger directory or table refused.
    pub fn shared(size: usize, name: &str) -> Result<Self> {
        let mut device = Self::try_new(size)?;
        device.shared = Some(crate::shared_gpu::simulated_device::SharedDevice::open(
            name,
            device.size,
        )?);
        Ok(device)
    }

    /// The name of the device's capacity shared with other processes
    /// ([`shared`](Self::shared)), if it is.
    pub fn shared_name(&self) -> Option<&str> {
        self.shared.as_ref().map(|d| d.name())
    }

    /// Bytes the other processes on a shared device charge now (0 for a device of its own, or
    /// when the table cannot be read: the error shows at the next allocation).
    fn others(&self) -> usize {
        self.shared
            .as_ref()
            .and_then(|d| d.others().ok())
            .map_or(0, |b| b as usize)
    }

    /// A device of `size` bytes as [`new`](Self::new) makes it (the same capacity, 2 MiB page
    /// charges, checked frees and out-of-memory errors) whose addresses have host memory behind
    /// them, so the bytes are kept: containers and [`DeviceBuffer`](crate::DeviceBuffer) copies
    /// work on it without a GPU (by the CPU without a driver). For tests and examples only: its
    /// memory is the host's, its [`kind`](MemoryResource::kind) is [`MemoryKind::Host`]. It
    /// needs about `size` bytes of host memory: its address space, 4 times its size (not 64),
    /// is reserved with nothing behind it; an allocation's pages are made usable when it is
    /// made (faulted in when first written) and given back to the host when it is freed (so
    /// its bytes are gone, as on a device), so the host memory it holds is about its bytes in
    /// use ([`committed_host_bytes`](Self::committed_host_bytes)).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the host cannot reserve the addresses, or has less memory
    /// (and swap) available than `size`, before anything is reserved.
    pub fn with_backing(size: usize) -> Result<Self> {
        use crate::os::host_pages::{check_host_room, Reservation, HUGE_PAGE};
        let size = size.min(MAX_SIMULATED_SIZE) & !(ALLOCATION_ALIGNMENT - 1);
        let space = size
            .checked_mul(BACKED_SPACE_FACTOR)
            .and_then(|s| s.checked_next_multiple_of(HUGE_PAGE))
            .ok_or_else(|| Error::invalid("size", format!("{size} bytes overflow")))?
            .max(HUGE_PAGE);
        // The room for what the device may hold at once: its size (pages are committed per
        // allocation, and given back on free).
        check_host_room(size, false)?;
        let reservation = Reservation::new(space)?;
        let base = reservation.base();
        Ok(SimulatedMemoryResource {
            size,
            base,
            window: None,
            refused: None,
            host_tier: 0,
            shared: None,
            state: Mutex::new(SimulatedState::new(AddressRanges::new(
                base,
                reservation.len(),
            ))),
            backing: Some(Backing {
                reservation,
                page: rustix::param::page_size(),
            }),
        })
    }

    /// Bytes of host memory committed behind a device made by
    /// [`with_backing`](Self::with_backing): the pages its live allocations touch (0 for other
    /// devices). At most the bytes in use plus two pages per live allocation, so at most about
    /// its size.
    pub fn committed_host_bytes(&self) -> usize {
        self.state.lock().committed
    }

    /// Whether the bytes are kept ([`with_backing`](Self::with_backing)).
    pub fn keeps_bytes(&self) -> bool {
        self.backing.is_some()
    }

    /// The pretend device's size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes the device charges for a request of `bytes`: whole 2 MiB pages for requests of a
    /// page or more, 256-byte units below (saturating at `usize::MAX`).
    pub fn charged_bytes(bytes: usize) -> usize {
        charge(bytes).unwrap_or(usize::MAX)
    }

    /// Bytes of host memory beyond the device (0 for a plain device).
    pub fn host_tier(&self) -> usize {
        self.host_tier
    }

    /// Bytes in use beyond the device's size now (what managed memory would hold in host
    /// memory), and the most ever.
    pub fn beyond_device_bytes(&self) -> (usize, usize) {
        let s = self.state.lock();
        (
            s.in_use.saturating_sub(self.size),
            s.peak.saturating_sub(self.size),
        )
    }

    /// Bytes currently charged to live allocations.
    pub fn bytes_in_use(&self) -> usize {
        self.state.lock().in_use
    }

    /// The most bytes ever charged at once.
    pub fn peak_bytes_in_use(&self) -> usize {
        self.state.lock().peak
    }

    /// Number of live allocations.
    pub fn live_allocations(&self) -> usize {
        self.state.lock().live.len()
    }

    /// Whether `ptr` is the start of a live allocation of this device.
    pub fn owns(&self, ptr: usize) -> bool {
        self.state.lock().live.contains_key(&ptr)
    }
}

impl SimulatedMemoryResource {
    /// One try of an allocation of `bytes` (> 0).
    fn allocate_once(&self, bytes: usize) -> Result<usize> {
        let (Some(rounded), Some(charged)) = (align_up(bytes, ALLOCATION_ALIGNMENT), charge(bytes))
        else {
            return Err(Error::out_of_memory(
                bytes,
                "simulated device: size overflows",
            ));
        };
        if let Some(refused) = &self.refused {
            return Err(Error::out_of_memory(
                bytes,
                format!("simulated device without addresses: {refused}"),
            ));
        }
        let mut s = self.state.lock();
        let capacity = self.size + self.host_tier;
        if charged > capacity - s.in_use {
            let in_use = s.in_use;
            drop(s);
            let tier = if self.host_tier > 0 {
                format!(" and {} bytes of host memory", self.host_tier)
            } else {
                String::new()
            };
            return Err(Error::out_of_memory(
                bytes,
                format!(
                    "simulated device of {} bytes{tier}: {charged} bytes needed, {} free",
                    self.size,
                    capacity - in_use
                ),
            ));
        }
        if let Some(shared) = &self.shared {
            let (before, after) = (s.in_use as u64, (s.in_use + charged) as u64);
            if let Err(no_room) = shared.charge(before, after)? {
                let in_use = s.in_use;
                drop(s);
                return Err(Error::out_of_memory(
                    bytes,
                    format!(
                        "simulated device of {} bytes shared as {:?}: {charged} bytes needed, \
                         {} free (this device holds {in_use}, the other processes on it {})",
                        self.size,
                        shared.name(),
                        (self.size - in_use).saturating_sub(no_room.others as usize),
                        no_room.others
                    ),
                ));
            }
        }
        let Some(start) = s.ranges.place(rounded) else {
            self.uncharge_shared(s.in_use);
            // Unreachable while the address space is 64x the capacity; reported honestly.
            return Err(Error::out_of_memory(
                bytes,
                "simulated device: address space exhausted",
            ));
        };
        if let Some(backing) = &self.backing {
            if let Err(e) = backing.commit(&mut s, start, rounded) {
                s.ranges.unplace(start, rounded);
                self.uncharge_shared(s.in_use);
                return Err(e);
            }
        }
        s.live.insert(start, (rounded, charged));
        s.in_use += charged;
        let in_use = s.in_use;
        s.held
            .get_or_insert_with(|| {
                crate::pressure::held_counter(crate::pressure::Place::Simulated(self.identity()))
            })
            .store(in_use, std::sync::atomic::Ordering::Relaxed);
        s.peak = s.peak.max(s.in_use);
        Ok(start)
    }

    /// Sets a shared device's charge back to `in_use` bytes (an allocation that failed after
    /// its charge). A table that cannot be written keeps the higher charge until the next one.
    fn uncharge_shared(&self, in_use: usize) {
        if let Some(shared) = &self.shared {
            let _ = shared.charge(u64::MAX, in_use as u64);
        }
    }
}

impl MemoryResource for SimulatedMemoryResource {
    /// Out of memory relieves the caches over this device ([`crate::pressure`]) and tries once
    /// more, as the CUDA resources do.
    fn allocate(&self, bytes: usize, _stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        crate::pressure::retry_after_relief(
            crate::pressure::Place::Simulated(self.identity()),
            bytes,
            || self.allocate_once(bytes),
        )
    }

    /// Checked: a pointer that is not live, or a size that rounds differently from the
    /// allocation's, is [`Error::Logic`] (so only preconditions 3 and 4 apply).
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, _stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let mut s = self.state.lock();
        let Some(&(rounded, charged)) = s.live.get(&ptr) else {
            return Err(Error::Logic(format!(
                "simulated device: deallocate of {ptr:#x}, which is not allocated \
                 (never, already freed, or inside another allocation)"
            )));
        };
        if align_up(bytes, ALLOCATION_ALIGNMENT) != Some(rounded) {
            return Err(Error::Logic(format!(
                "simulated device: deallocate of {ptr:#x} with {bytes} bytes, but it was \
                 allocated with {rounded} bytes (rounded to 256)"
            )));
        }
        s.live.remove(&ptr);
        s.in_use -= charged;
        // A free always passes; a table that cannot be written keeps the higher charge until
        // the next one (the others see less room, never more).
        self.uncharge_shared(s.in_use);
        if let Some(held) = &s.held {
            held.store(s.in_use, std::sync::atomic::Ordering::Relaxed);
        }
        s.ranges.unplace(ptr, rounded);
        if let Some(backing) = &self.backing {
            // SAFETY: the allocation is no longer live, and nothing uses it (precondition 3).
            unsafe { backing.decommit(&mut s, ptr, rounded) };
        }
        Ok(())
    }

    /// [`MemoryKind::Simulated`]; [`MemoryKind::Host`] with [`with_backing`](Self::with_backing)
    /// (its bytes are host memory, copied as host memory is).
    fn kind(&self) -> MemoryKind {
        if self.backing.is_some() {
            MemoryKind::Host
        } else {
            MemoryKind::Simulated
        }
    }

    /// The device's free bytes (whole pages once a page or more is free, so a request of that
    /// size fits) and its size. With a host tier these are still the device's own figures, as
    /// `cudaMemGetInfo` reports them under managed memory: free is 0 once allocations spill
    /// past the device, though managed allocations still succeed.
    fn memory_info(&self) -> Option<(usize, usize)> {
        let free = self
            .size
            .saturating_sub(self.state.lock().in_use)
            .saturating_sub(self.others());
        let usable = if free >= SIMULATED_PAGE_SIZE {
            free & !(SIMULATED_PAGE_SIZE - 1)
        } else {
            free
        };
        Some((usable, self.size))
    }

    fn report(&self) -> Option<&dyn PoolReport> {
        Some(self)
    }

    /// A source whose calls are host bookkeeping that returns at once.
    fn link(&self) -> super::Link {
        let mut link = super::Link::source(
            self.kind(),
            self.device(),
            self.identity(),
            super::CallProfile::QUICK,
        );
        link.device_key = self
            .shared_name()
            .map(|name| crate::shared_gpu::simulated_device::ledger_key(name).into());
        link
    }

    fn name(&self) -> &'static str {
        if self.host_tier > 0 {
            "simulated_managed"
        } else {
            "simulated"
        }
    }
}

impl PoolReport for SimulatedMemoryResource {
    /// Held: the bytes charged to live allocations (device and host tier); free: the rest of
    /// the device, all of it usable by one request (the driver's placement never fragments).
    fn footprint(&self) -> Footprint {
        let others = self.others();
        let s = self.state.lock();
        let free = self.size.saturating_sub(s.in_use).saturating_sub(others);
        Footprint {
            held_bytes: s.in_use,
            free_bytes: free,
            largest_free_block: free,
            free_blocks: usize::from(free > 0),
        }
    }

    fn is_source(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::free;

    const GIB: usize = 1 << 30;

    #[test]
    fn allocations_are_aligned_disjoint_and_counted() {
        let mr = SimulatedMemoryResource::new(1 << 20);
        let a = mr.allocate(1, Stream::DEFAULT).unwrap();
        let b = mr.allocate(300, Stream::DEFAULT).unwrap();
        assert_eq!(a % 256, 0);
        assert_eq!(b % 256, 0);
        assert!(b >= a + 256 || a >= b + 512);
        assert_eq!(mr.bytes_in_use(), 256 + 512);
        free(&mr, a, 1).unwrap();
        free(&mr, b, 300).unwrap();
        assert_eq!(mr.bytes_in_use(), 0);
        assert_eq!(mr.peak_bytes_in_use(), 768);
        assert!(mr.allocate(1 << 20, Stream::DEFAULT).is_ok());
    }

    #[test]
    fn out_of_memory_and_bad_free_are_errors() {
        let mr = SimulatedMemoryResource::new(1024);
        assert!(mr
            .allocate(2048, Stream::DEFAULT)
            .unwrap_err()
            .is_out_of_memory());
        assert!(matches!(free(&mr, 0x1234, 8), Err(Error::Logic(_))));
        assert_eq!(mr.allocate(0, Stream::DEFAULT).unwrap(), 0);
        assert!(mr
            .allocate(usize::MAX, Stream::DEFAULT)
            .unwrap_err()
            .is_out_of_memory());
    }

    #[test]
    fn large_requests_are_charged_in_pages() {
        let mr = SimulatedMemoryResource::new(8 << 20);
        let a = mr.allocate((2 << 20) + 1, Stream::DEFAULT).unwrap();
        assert_eq!(mr.bytes_in_use(), 4 << 20);
        let b = mr.allocate(4 << 20, Stream::DEFAULT).unwrap();
        assert!(mr
            .allocate(256, Stream::DEFAULT)
            .unwrap_err()
            .is_out_of_memory());
        free(&mr, a, (2 << 20) + 1).unwrap();
        free(&mr, b, 4 << 20).unwrap();
        assert_eq!(SimulatedMemoryResource::charged_bytes(3 << 20), 4 << 20);
        assert_eq!(SimulatedMemoryResource::charged_bytes(1000), 1024);
    }

    #[test]
    fn placement_never_fails_while_pages_remain() {
        // Issue 10: 12 GiB, 8 GiB, free the 12, then 20 GiB on a 32 GiB device succeeds, as
        // `cudaMalloc` does (the driver maps pages wherever they are).
        let mr = SimulatedMemoryResource::new(32 * GIB);
        let a = mr.allocate(12 * GIB, Stream::DEFAULT).unwrap();
        let b = mr.allocate(8 * GIB, Stream::DEFAULT).unwrap();
        free(&mr, a, 12 * GIB).unwrap();
        let c = mr.allocate(20 * GIB, Stream::DEFAULT).unwrap();
        assert!(c + 20 * GIB <= b || b + 8 * GIB <= c);
        assert!(mr
            .allocate(5 * GIB, Stream::DEFAULT)
            .unwrap_err()
            .is_out_of_memory());
        assert_eq!(mr.report().unwrap().footprint().fragmentation(), 0.0);
        free(&mr, b, 8 * GIB).unwrap();
        free(&mr, c, 20 * GIB).unwrap();
    }

    #[test]
    fn frees_are_checked_and_the_device_keeps_working() {
        // Issue 9: freeing a pool's pointer (inside its chunk, or the chunk's start with the
        // request's size) on the pool's upstream must not free the chunk.
        let mr = SimulatedMemoryResource::new(1 << 30);
        let chunk = mr.allocate(64 << 20, Stream::DEFAULT).unwrap();
        let wrong_size = free(&mr, chunk, 4096);
        assert!(matches!(wrong_size, Err(Error::Logic(ref m)) if m.contains("allocated with")));
        let inside = free(&mr, chunk + 4096, 4096);
        assert!(matches!(inside, Err(Error::Logic(_))));
        assert_eq!(mr.bytes_in_use(), 64 << 20);
        assert!(mr.owns(chunk));
        free(&mr, chunk, 64 << 20).unwrap();
        let double = free(&mr, chunk, 64 << 20);
        assert!(matches!(double, Err(Error::Logic(_))));
        assert_eq!(mr.bytes_in_use(), 0);
        let again = mr.allocate(1 << 20, Stream::DEFAULT).unwrap();
        assert!(mr.owns(again));
        free(&mr, again, 1 << 20).unwrap();
        assert_eq!(mr.live_allocations(), 0);
    }

    /// One step of a random sequence of simulated memories.
    #[derive(Clone, Debug)]
    enum Step {
        /// A device of `size` bytes and `host` bytes of host tier (checked or not).
        Device {
            size: usize,
            host: usize,
            checked: bool,
        },
        /// Simulated virtual memory reserving `reserve` bytes.
        Virtual { reserve: usize },
        /// Drops the live one at `index` (modulo their count).
        Drop { index: usize },
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        // Sizes up to the largest device (whose window is the largest, 2^56), and reservations
        // up to 2^58: a sequence holds at most a few dozen windows of the 255 the space has,
        // so tests running beside it (which take windows too) are never refused.
        let size = prop_oneof![
            1usize..(1 << 40),
            Just(MAX_SIMULATED_SIZE),
            1usize..MAX_SIMULATED_SIZE
        ];
        prop_oneof![
            3 => (size, prop_oneof![Just(0usize), 0usize..(1 << 50)], any::<bool>())
                .prop_map(|(size, host, checked)| Step::Device { size, host, checked }),
            1 => (SIMULATED_PAGE_SIZE..(1usize << 58)).prop_map(|reserve| Step::Virtual { reserve }),
            3 => any::<usize>().prop_map(|index| Step::Drop { index }),
        ]
    }

    /// A live simulated memory of the sequence, with the blocks it handed out.
    // A test's own list of what lives: its size does not matter.
    #[allow(clippy::large_enum_variant)]
    enum Live {
        Device(SimulatedMemoryResource, Vec<(usize, usize)>),
        Virtual(crate::resource::SimulatedVirtualMemory),
    }

    impl Live {
        fn range(&self) -> std::ops::Range<usize> {
            use crate::resource::VirtualMemory;
            match self {
                Live::Device(d, _) => d.address_range(),
                Live::Virtual(v) => v.base()..v.base() + v.reserved_bytes(),
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// Issue 39: live simulated devices and simulated virtual memories, made and dropped in
        /// random order at random sizes (the largest included), never share an address: their
        /// windows never overlap and lie in the simulated space, and the blocks they hand out
        /// never alias (a fallback over two of them frees to the one that allocated).
        #[test]
        fn live_simulated_memories_never_share_an_address(
            steps in proptest::collection::vec(step(), 1..40),
        ) {
            use crate::resource::VirtualMemory;
            let mut live: Vec<Live> = Vec::new();
            for step in steps {
                match step {
                    Step::Device { size, host, checked } => {
                        let d = if checked {
                            SimulatedMemoryResource::try_managed(size, host).unwrap()
                        } else {
                            SimulatedMemoryResource::managed(size, host)
                        };
                        let mut blocks = Vec::new();
                        for bytes in [256, SIMULATED_PAGE_SIZE] {
                            if let Ok(p) = d.allocate(bytes, Stream::DEFAULT) {
                                blocks.push((p, bytes));
                            }
                        }
                        live.push(Live::Device(d, blocks));
                    }
                    Step::Virtual { reserve } => {
                        let vm = crate::resource::SimulatedVirtualMemory::new(
                            1 << 30, reserve, SIMULATED_PAGE_SIZE,
                        ).unwrap();
                        vm.map(vm.base(), SIMULATED_PAGE_SIZE).unwrap();
                        live.push(Live::Virtual(vm));
                    }
                    Step::Drop { index } => {
                        if !live.is_empty() {
                            let gone = live.swap_remove(index % live.len());
                            if let Live::Device(d, blocks) = &gone {
                                for &(p, bytes) in blocks {
                                    free(d, p, bytes).unwrap();
                                }
                            }
                        }
                    }
                }
                let ranges: Vec<std::ops::Range<usize>> = live.iter().map(Live::range).collect();
                for (i, a) in ranges.iter().enumerate() {
                    proptest::prop_assert!(
                        a.start >= SIMULATED_ADDRESS_BASE && a.end <= ADDRESS_END && a.start < a.end,
                        "{:?}", a
                    );
                    for b in &ranges[i + 1..] {
                        proptest::prop_assert!(a.end <= b.start || b.end <= a.start, "{:?} {:?}", a, b);
                    }
                }
                let mut blocks: Vec<usize> = Vec::new();
                for (l, range) in live.iter().zip(&ranges) {
                    if let Live::Device(d, ps) = l {
                        for &(p, _) in ps {
                            proptest::prop_assert!(range.contains(&p) && d.owns(p));
                            blocks.push(p);
                        }
                    }
                }
                let count = blocks.len();
                blocks.sort_unstable();
                blocks.dedup();
                proptest::prop_assert_eq!(blocks.len(), count, "a block handed out twice");
            }
            for l in live {
                if let Live::Device(d, blocks) = l {
                    for (p, bytes) in blocks {
                        free(&d, p, bytes).unwrap();
                    }
                }
            }
        }

        /// The registry on a small space of its own, taken whole and given back in random
        /// order: a window is refused exactly when no free range of the model holds it, windows
        /// never overlap, and the space comes back whole.
        #[test]
        fn windows_are_refused_only_when_no_free_range_holds_them(
            ops in proptest::collection::vec((1usize..12, proptest::prelude::any::<bool>(), proptest::prelude::any::<usize>()), 1..80),
        ) {
            const UNIT: usize = SIMULATED_PAGE_SIZE;
            const SPACE: usize = 32 * UNIT;
            let mut windows = Windows::new(UNIT, SPACE);
            let mut held: Vec<(usize, usize)> = Vec::new();
            for (units, take, pick) in ops {
                if take || held.is_empty() {
                    let len = units * UNIT;
                    // The model: the free gaps between the held windows.
                    let mut sorted = held.clone();
                    sorted.sort_unstable();
                    let mut at = UNIT;
                    let mut fits = false;
                    for &(b, l) in &sorted {
                        fits |= b - at >= len;
                        at = b + l;
                    }
                    fits |= UNIT + SPACE - at >= len;
                    match windows.place(len) {
                        Ok(base) => {
                            proptest::prop_assert!(fits);
                            proptest::prop_assert!(base >= UNIT && base + len <= UNIT + SPACE);
                            proptest::prop_assert!(held.iter().all(|&(b, l)| base + len <= b || b + l <= base));
                            held.push((base, len));
                        }
                        Err(why) => {
                            proptest::prop_assert!(!fits, "refused with room: {}", why);
                            proptest::prop_assert!(why.contains(&format!("{} live", held.len())), "{}", why);
                        }
                    }
                } else {
                    let (b, l) = held.swap_remove(pick % held.len());
                    windows.unplace(b, l);
                }
                proptest::prop_assert_eq!(windows.live, held.len());
                proptest::prop_assert_eq!(windows.held, held.iter().map(|&(_, l)| l).sum::<usize>());
            }
            for (b, l) in held.drain(..) {
                windows.unplace(b, l);
            }
            proptest::prop_assert_eq!(windows.place(SPACE), Ok(UNIT));
        }
    }

    /// Bytes of the mappings of `range` that are readable and writable, as the kernel lists
    /// them in /proc/self/maps (independent of the device's own count).
    fn writable_bytes_in(range: std::ops::Range<usize>) -> usize {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let (lo, hi) = fields.next()?.split_once('-')?;
                let perms = fields.next()?;
                let lo = usize::from_str_radix(lo, 16).ok()?.max(range.start);
                let hi = usize::from_str_radix(hi, 16).ok()?.min(range.end);
                (perms.starts_with("rw") && lo < hi).then(|| hi - lo)
            })
            .sum()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

        /// Issue 39: a device with host memory behind it commits exactly the pages its live
        /// allocations touch (the model's, and the kernel's own list of writable mappings):
        /// at most its bytes in use plus two pages per live allocation, so about its size,
        /// never its reservation (4 times the size); and each live allocation keeps its bytes
        /// while neighbours sharing its pages come and go.
        #[test]
        fn a_backed_device_commits_only_the_pages_of_live_allocations(
            size_mib in 1usize..48,
            ops in proptest::collection::vec(
                (proptest::prelude::any::<bool>(), 1usize..(6 << 20), proptest::prelude::any::<usize>()),
                1..60,
            ),
        ) {
            let size = size_mib << 20;
            let d = SimulatedMemoryResource::with_backing(size).unwrap();
            let page = rustix::param::page_size();
            let range = d.address_range();
            proptest::prop_assert!(range.end - range.start >= 4 * size);
            let mut live: Vec<(usize, usize, u8)> = Vec::new();
            let mut mark = 0u8;
            for (alloc, bytes, pick) in ops {
                // Mostly small requests, which share pages.
                let bytes = if pick % 3 == 0 { bytes } else { bytes % 3000 + 1 };
                if alloc || live.is_empty() {
                    if let Ok(p) = d.allocate(bytes, Stream::DEFAULT) {
                        mark = mark.wrapping_add(1).max(1);
                        // SAFETY: a live allocation of `bytes` bytes of host memory.
                        unsafe {
                            std::ptr::write(p as *mut u8, mark);
                            std::ptr::write((p + bytes - 1) as *mut u8, mark);
                        }
                        live.push((p, bytes, mark));
                    }
                } else {
                    let (p, bytes, _) = live.swap_remove(pick % live.len());
                    free(&d, p, bytes).unwrap();
                }
                let mut pages = std::collections::BTreeSet::new();
                for &(p, bytes, m) in &live {
                    let rounded = bytes.next_multiple_of(256);
                    pages.extend(p / page..(p + rounded).div_ceil(page));
                    // SAFETY: live allocations, written above.
                    let (first, last) = unsafe {
                        (std::ptr::read(p as *const u8), std::ptr::read((p + bytes - 1) as *const u8))
                    };
                    proptest::prop_assert_eq!((first, last), (m, m), "bytes of {:#x} lost", p);
                }
                let committed = d.committed_host_bytes();
                proptest::prop_assert_eq!(committed, pages.len() * page);
                proptest::prop_assert_eq!(writable_bytes_in(range.clone()), committed);
                proptest::prop_assert!(committed <= d.bytes_in_use() + 2 * page * live.len());
                proptest::prop_assert!(committed <= size + 2 * page * live.len());
            }
            for (p, bytes, _) in live {
                free(&d, p, bytes).unwrap();
            }
            proptest::prop_assert_eq!(d.committed_host_bytes(), 0);
            proptest::prop_assert_eq!(writable_bytes_in(range), 0);
        }
    }

    /// Issue 39's case: a device with host memory behind it needs its size of host memory, not
    /// four times it (a 16 GiB one failed on a 23 GiB machine): one of 60% of the memory
    /// available, whose reservation is 2.4 times that, is made, and holds nothing until used.
    #[test]
    fn a_backed_device_of_most_of_the_host_is_made() {
        let room = crate::os::host_pages::available_host_memory().unwrap();
        let size = (room.available / 10 * 6) & !(SIMULATED_PAGE_SIZE - 1);
        // The old check asked for 4 * size: refused wherever swap is below 1.4 times the
        // memory available (this machine: no swap).
        let d = SimulatedMemoryResource::with_backing(size).unwrap();
        assert_eq!(d.committed_host_bytes(), 0);
        assert_eq!(writable_bytes_in(d.address_range()), 0);
        let p = d.allocate(SIMULATED_PAGE_SIZE, Stream::DEFAULT).unwrap();
        assert_eq!(d.committed_host_bytes(), SIMULATED_PAGE_SIZE);
        free(&d, p, SIMULATED_PAGE_SIZE).unwrap();
        let too_large = room.available + room.swap_free + GIB;
        let e = SimulatedMemoryResource::with_backing(too_large).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
    }

    /// Issue 39's case: 70 of the largest devices live at once (the space held 63) each get a
    /// window of their own.
    #[test]
    fn seventy_of_the_largest_devices_get_windows_of_their_own() {
        let devices: Vec<_> = (0..70)
            .map(|_| SimulatedMemoryResource::try_managed(MAX_SIMULATED_SIZE, 0).unwrap())
            .collect();
        let mut ranges: Vec<_> = devices.iter().map(|d| d.address_range()).collect();
        ranges.sort_unstable_by_key(|r| r.start);
        assert!(ranges.windows(2).all(|w| w[0].end <= w[1].start));
    }

    /// A device the space has no window for: refused by `try_managed`, and made by `managed`
    /// without addresses (every allocation out of memory, saying why), never over another's.
    #[test]
    fn a_device_without_a_window_has_no_addresses() {
        let d = SimulatedMemoryResource::over(GIB, 0, Err("no window (test)".into()));
        assert_eq!(d.address_range(), 0..0);
        let e = d.allocate(256, Stream::DEFAULT).unwrap_err();
        assert!(
            e.is_out_of_memory() && e.to_string().contains("no window (test)"),
            "{e}"
        );
        let e = Window::take(usize::MAX, "simulated device").unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
    }
}
