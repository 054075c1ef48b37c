//! Pinned (page-locked) host memory: small allocations from `cuMemHostAlloc`, large ones ranges
//! of the process's host page supply ([`HostPages`]: made the fast way, committed on the GPU's
//! NUMA node with huge pages, faulted in by several threads, then registered; kept registered
//! when freed, for the next user: a sleep's copy, another pool).

use super::host_pages::registered::{supply, HostPages, PageKind, PageSpec};
use super::pinned_pages::PinnedStartup;
use super::{MemoryKind, MemoryResource};
use crate::cuda::{self, ContextGuard, Stream};
use crate::error::Result;
use parking_lot::Mutex;
use std::collections::HashMap;

/// Allocations of at least this many bytes are registered ranges of their own pages
/// ([`HostPages`]); smaller ones come from `cuMemHostAlloc`. Measured on an H100 machine
/// (benches/results/2026-11-24-h100-pinned): a round trip of 1 MiB costs 0.33 ms registered
/// against 1.28 ms from `cuMemHostAlloc`, 64 MiB 11.1 ms against 30.7 ms.
pub const DEFAULT_REGISTERED_FROM: usize = 1 << 20;

/// Options of a [`PinnedHostMemoryResource`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinnedOptions {
    /// The NUMA node for the pages of registered ranges; `None`: the node the driver reports
    /// closest to the device ([`cuda::host_numa_node`]), if any.
    pub numa_node: Option<u32>,
    /// Allocations of at least this many bytes are registered ranges
    /// ([`DEFAULT_REGISTERED_FROM`]); `usize::MAX` makes every allocation `cuMemHostAlloc`.
    pub registered_from: usize,
}

impl Default for PinnedOptions {
    fn default() -> Self {
        PinnedOptions {
            numa_node: None,
            registered_from: DEFAULT_REGISTERED_FROM,
        }
    }
}

/// Pinned host memory, portable across contexts and mapped for the device; fast for
/// host-device copies.
#[derive(Debug)]
pub struct PinnedHostMemoryResource {
    device: usize,
    numa_node: Option<u32>,
    registered_from: usize,
    /// The live registered ranges by address (`cuMemHostAlloc` allocations are not recorded).
    registered: Mutex<HashMap<usize, HostPages>>,
    /// How its latest registered range was made.
    last_startup: Mutex<Option<PinnedStartup>>,
}

impl PinnedHostMemoryResource {
    /// A pinned-host resource for the current device, with the default options.
    ///
    /// # Errors
    /// No driver.
    pub fn new() -> Result<Self> {
        Self::with_options(PinnedOptions::default())
    }

    /// A pinned-host resource for the current device.
    ///
    /// # Errors
    /// No driver.
    pub fn with_options(options: PinnedOptions) -> Result<Self> {
        let device = cuda::current_device()?;
        Ok(PinnedHostMemoryResource {
            device,
            numa_node: options.numa_node.or_else(|| cuda::host_numa_node(device)),
            registered_from: options.registered_from.max(1),
            registered: Mutex::new(HashMap::new()),
            last_startup: Mutex::new(None),
        })
    }

    /// The NUMA node its registered ranges are placed on (`None`: the process's policy).
    pub fn numa_node(&self) -> Option<u32> {
        self.numa_node
    }

    /// The device whose context makes the allocations.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Allocations of at least this many bytes are registered ranges.
    pub fn registered_from(&self) -> usize {
        self.registered_from
    }

    /// How its latest registered range (a pool's chunk, say) was made; `None` before the first.
    pub fn last_startup(&self) -> Option<PinnedStartup> {
        self.last_startup.lock().clone()
    }
}

impl MemoryResource for PinnedHostMemoryResource {
    fn allocate(&self, bytes: usize, _stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        let _ctx = ContextGuard::new(self.device)?;
        if bytes < self.registered_from {
            return cuda::mem_alloc_host(bytes);
        }
        let started = std::time::Instant::now();
        let spec = PageSpec {
            kind: PageKind::Pinned,
            numa_node: self.numa_node,
            device: Some(self.device),
        };
        let pages = supply().take(spec, bytes)?;
        let addr = pages.addr();
        let startup = match pages.pinned_startup() {
            Some(made) if !pages.was_ready() => made.clone(),
            made => PinnedStartup {
                bytes,
                committed_bytes: pages.len(),
                total_s: started.elapsed().as_secs_f64(),
                from_supply: true,
                numa_node_requested: made.and_then(|m| m.numa_node_requested),
                numa_node_placed: made.is_some_and(|m| m.numa_node_placed),
                numa_node_found: made.and_then(|m| m.numa_node_found),
                huge_page_bytes: made.and_then(|m| m.huge_page_bytes),
                ..PinnedStartup::default()
            },
        };
        *self.last_startup.lock() = Some(startup);
        self.registered.lock().insert(addr, pages);
        Ok(addr)
    }

    unsafe fn deallocate(&self, ptr: usize, _bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let _ctx = ContextGuard::new(self.device)?;
        stream.synchronize()?;
        let pages = self.registered.lock().remove(&ptr);
        match pages {
            // Back to the process's host page supply (kept registered for the next user, within
            // its keep limit; else unregistered and unmapped), outside the lock.
            Some(pages) => {
                drop(pages);
                Ok(())
            }
            // SAFETY: `ptr` came from `allocate` of this resource (the trait's contract) and is
            // not a registered range, so it came from `cuMemHostAlloc`.
            None => unsafe { cuda::mem_free_host(ptr) },
        }
    }

    // Blocking: cuMemHostAlloc/cuMemFreeHost, registration and the stream wait.
    super::direct::blocking_source_info!(kind: MemoryKind::PinnedHost, name: "pinned_host");
}
