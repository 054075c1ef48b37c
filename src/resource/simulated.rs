//! A pretend device that behaves like the driver: capacity counted in pages, addresses from a
//! space much larger than the capacity, no memory behind them.
//!
//! The CUDA driver maps physical pages wherever they are free into a large virtual address
//! space, so `cuMemAlloc` fails only when pages run out, never because of where earlier
//! allocations sit. The simulated device does the same: it charges each allocation against its
//! capacity (whole 2 MiB pages for requests of a page or more, 256-byte units for smaller ones,
//! which the driver packs into shared pages) and places it in an address space 64 times the
//! capacity (at most 64 PiB of addresses, and at least twice the capacity), so placement never
//! decides whether an allocation succeeds.

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

/// The end of the simulated devices' addresses (simulated virtual memory lies above).
const ADDRESS_END: usize = 1 << 62;

/// The windows of the simulated address space the live devices hold: each device takes its own
/// (its whole address space), so no two live devices hand out the same address (a fallback's
/// upstream and alternate, or a cache and the device beneath, stay told apart by address).
// Why process-wide: no two live simulated devices may hand out the same address.
static WINDOWS: parking_lot::Mutex<Option<AddressRanges>> = parking_lot::Mutex::new(None);

/// A window of `len` bytes of simulated addresses; `None` when the space is used up (then the
/// device shares the first window, as every device did before windows).
fn take_window(len: usize) -> Option<usize> {
    let mut windows = WINDOWS.lock();
    windows
        .get_or_insert_with(|| {
            AddressRanges::new(SIMULATED_ADDRESS_BASE, ADDRESS_END - SIMULATED_ADDRESS_BASE)
        })
        .place(len)
}

/// The largest address space, so it stays below simulated virtual memory's (2^62).
const MAX_ADDRESS_SPACE: usize = 1 << 61;

/// The largest simulated device (32 PiB): byte counters over it never overflow, and its window
/// (64 PiB, twice its size) leaves room for 62 more of it.
pub const MAX_SIMULATED_SIZE: usize = MAX_ADDRESS_SPACE / ADDRESS_SPACE_FACTOR;

/// The driver's page: allocations of at least this size are charged in whole pages.
pub const SIMULATED_PAGE_SIZE: usize = 2 << 20;

/// The address space is this many times the capacity, up to [`MAX_WINDOW`].
const ADDRESS_SPACE_FACTOR: usize = 64;

/// The largest window a device takes when 64 times its capacity is more (64 PiB; the device
/// still gets twice its capacity): the simulated space then holds 63 devices of the largest
/// size at once, where windows of 64 times (2^61) let two such devices use it up, so that
/// later devices shared the first window and handed out each other's addresses (a tiered
/// resource over simulated tiers saw a pointer "already live", under parallel tests).
const MAX_WINDOW: usize = 1 << 56;

/// The smallest address space (1 TiB), so small devices also place freely.
const MIN_ADDRESS_SPACE: usize = 1 << 40;

/// Address space of a device with host memory behind it, per byte of capacity (reserved for
/// real, so smaller than [`ADDRESS_SPACE_FACTOR`]; room for the 2 MiB page rounding).
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
    /// The first address of the device's window, and whether it holds the window (to give it
    /// back when it drops).
    base: usize,
    owns_window: bool,
    /// Bytes of host memory managed allocations may use beyond the device (0: a plain device).
    host_tier: usize,
    /// With [`with_backing`](Self::with_backing): the host memory behind the window, so the
    /// bytes are kept (tests and examples of code that copies); `None`: addresses only.
    backing: Option<crate::os::host_pages::Reservation>,
    state: Mutex<SimulatedState>,
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
    pub fn address_range(&self) -> std::ops::Range<usize> {
        match &self.backing {
            Some(r) => self.base..self.base + r.len(),
            None => self.base..self.base + address_space(self.size + self.host_tier),
        }
    }

    /// A pretend device of `size` bytes (rounded down to 256, and to at most
    /// [`MAX_SIMULATED_SIZE`]).
    pub fn new(size: usize) -> Self {
        Self::managed(size, 0)
    }

    /// A pretend device of `size` bytes whose memory is managed memory with `host_tier` bytes of
    /// host memory beyond it (see the type's doc; [`MAX_SIMULATED_SIZE`] in all at most).
    pub fn managed(size: usize, host_tier: usize) -> Self {
        let size = size.min(MAX_SIMULATED_SIZE) & !(ALLOCATION_ALIGNMENT - 1);
        let host_tier = host_tier.min(MAX_SIMULATED_SIZE - size) & !(ALLOCATION_ALIGNMENT - 1);
        let space = address_space(size.saturating_add(host_tier));
        let window = take_window(space);
        let base = window.unwrap_or(SIMULATED_ADDRESS_BASE);
        SimulatedMemoryResource {
            size,
            base,
            owns_window: window.is_some(),
            host_tier,
            backing: None,
            state: Mutex::new(SimulatedState {
                ranges: AddressRanges::new(base, space),
                live: HashMap::new(),
                in_use: 0,
                peak: 0,
            }),
        }
    }

    /// A device of `size` bytes as [`new`](Self::new) makes it (the same capacity, 2 MiB page
    /// charges, checked frees and out-of-memory errors) whose addresses have host memory behind
    /// them, so the bytes are kept: containers and [`DeviceBuffer`](crate::DeviceBuffer) copies
    /// work on it without a GPU (by the CPU without a driver). For tests and examples only: its
    /// memory is the host's, its [`kind`](MemoryResource::kind) is [`MemoryKind::Host`], pages
    /// are faulted in when first written and kept until the resource drops, and its address
    /// space is 4 times its size (not 64: it is reserved for real).
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the host cannot reserve the addresses.
    pub fn with_backing(size: usize) -> Result<Self> {
        use crate::os::host_pages::{Commit, Reservation, HUGE_PAGE};
        let size = size.min(MAX_SIMULATED_SIZE) & !(ALLOCATION_ALIGNMENT - 1);
        let space = size
            .checked_mul(BACKED_SPACE_FACTOR)
            .and_then(|s| s.checked_next_multiple_of(HUGE_PAGE))
            .ok_or_else(|| Error::invalid("size", format!("{size} bytes overflow")))?
            .max(HUGE_PAGE);
        let reservation = Reservation::new(space)?;
        reservation.commit(0, reservation.len(), Commit::default())?;
        let base = reservation.base();
        Ok(SimulatedMemoryResource {
            size,
            base,
            owns_window: false,
            host_tier: 0,
            state: Mutex::new(SimulatedState {
                ranges: AddressRanges::new(base, reservation.len()),
                live: HashMap::new(),
                in_use: 0,
                peak: 0,
            }),
            backing: Some(reservation),
        })
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
        let Some(start) = s.ranges.place(rounded) else {
            // Unreachable while the address space is 64x the capacity; reported honestly.
            return Err(Error::out_of_memory(
                bytes,
                "simulated device: address space exhausted",
            ));
        };
        s.live.insert(start, (rounded, charged));
        s.in_use += charged;
        s.peak = s.peak.max(s.in_use);
        Ok(start)
    }
}

impl Drop for SimulatedMemoryResource {
    fn drop(&mut self) {
        if self.owns_window {
            let space = address_space(self.size + self.host_tier);
            if let Some(windows) = WINDOWS.lock().as_mut() {
                windows.unplace(self.base, space);
            }
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
        s.ranges.unplace(ptr, rounded);
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
        let free = self.size.saturating_sub(self.state.lock().in_use);
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

    fn call_profile(&self) -> super::CallProfile {
        // Host bookkeeping that returns at once.
        super::CallProfile::QUICK
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
        let s = self.state.lock();
        let free = self.size.saturating_sub(s.in_use);
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

    #[test]
    fn live_devices_never_share_an_address_and_windows_come_back() {
        let a = SimulatedMemoryResource::new(GIB);
        let b = SimulatedMemoryResource::managed(GIB, GIB);
        let (ra, rb) = (a.address_range(), b.address_range());
        assert!(ra.end <= rb.start || rb.end <= ra.start, "{ra:?} {rb:?}");
        assert!(ra.start >= SIMULATED_ADDRESS_BASE && rb.end <= ADDRESS_END);
        let p = a.allocate(4096, Stream::DEFAULT).unwrap();
        let q = b.allocate(4096, Stream::DEFAULT).unwrap();
        assert!(ra.contains(&p) && rb.contains(&q));
        free(&a, p, 4096).unwrap();
        free(&b, q, 4096).unwrap();
        // Devices of the largest size, all live at once, still get windows of their own.
        let huge: Vec<_> = (0..8)
            .map(|_| {
                SimulatedMemoryResource::managed(MAX_SIMULATED_SIZE / 2, MAX_SIMULATED_SIZE / 2)
            })
            .collect();
        assert!(huge.iter().all(|d| d.owns_window));
        let small = SimulatedMemoryResource::new(GIB);
        assert!(small.owns_window);
        drop(huge);
        // Many devices made and dropped do not use the space up.
        for _ in 0..10_000 {
            let d = SimulatedMemoryResource::new(1 << 40);
            assert!(d.owns_window);
        }
    }
}
