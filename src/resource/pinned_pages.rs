//! A pinned host range made the fast way: reserved, committed on the GPU's NUMA node with huge
//! pages, faulted in by several threads, then registered with CUDA (`cuMemHostRegister`).
//! Unregistered and unmapped on drop.

use crate::cuda;
use crate::error::Result;
use crate::os::host_pages::{Commit, Reservation, HUGE_PAGE, SMALL_PAGE};

/// A registered (pinned) host range of its own reservation.
#[derive(Debug)]
pub struct PinnedPages {
    reservation: Reservation,
    bytes: usize,
}

impl PinnedPages {
    /// Makes `bytes` of pinned host memory, its pages on `numa_node` where given.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the host or the driver cannot give
    /// that much; no driver; CUDA errors of the registration.
    pub fn new(bytes: usize, numa_node: Option<u32>) -> Result<Self> {
        cuda::ensure_driver()?;
        let reservation = Reservation::new(bytes)?;
        // Whole huge pages from 2 MiB (the kernel backs them with huge pages where it can);
        // below, only the small pages the request needs.
        let committed = if bytes >= HUGE_PAGE {
            reservation.len()
        } else {
            bytes.next_multiple_of(SMALL_PAGE)
        };
        reservation.commit(
            0,
            committed,
            Commit {
                numa_node,
                populate: true,
            },
        )?;
        // SAFETY: the committed range stays mapped until drop, which unregisters it first.
        unsafe { cuda::mem_host_register(reservation.base(), committed) }?;
        Ok(PinnedPages { reservation, bytes })
    }

    /// The first address.
    pub fn addr(&self) -> usize {
        self.reservation.base()
    }

    /// The bytes asked for.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for PinnedPages {
    fn drop(&mut self) {
        // SAFETY: registered in `new`, once; the owner dropped the range after the work that
        // used it finished (the resource synchronizes the stream before dropping). An error
        // cannot be reported from drop; the reservation is unmapped after either way.
        let _ = unsafe { cuda::mem_host_unregister(self.reservation.base()) };
    }
}
