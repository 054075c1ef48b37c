//! `cuMemAllocManaged`: unified memory that can exceed the device, and where a fresh range of it
//! is placed. The cached resource users get is
//! [`ManagedMemoryResource`](crate::ManagedMemoryResource) (a reuse cache over this one).

use super::direct::{sealed, DirectAllocator, DirectMemoryResource};
use super::MemoryKind;
use crate::cuda::{self, Stream};
use crate::error::Result;

/// `cuMemAllocManaged` (attached globally), the driver call of
/// [`UncachedManagedMemoryResource`].
#[derive(Debug, Clone, Copy)]
pub struct ManagedAlloc;

impl sealed::Sealed for ManagedAlloc {}

impl DirectAllocator for ManagedAlloc {
    const NAME: &'static str = "managed";
    const KIND: MemoryKind = MemoryKind::Managed;

    fn alloc(bytes: usize) -> Result<usize> {
        cuda::mem_alloc_managed(bytes)
    }
}

/// Managed (unified) memory straight from `cuMemAllocManaged`, attached globally, each free a
/// `cuMemFree` (RMM's `managed_memory_resource`); the source of
/// [`ManagedMemoryResource`](crate::ManagedMemoryResource).
pub type UncachedManagedMemoryResource = DirectMemoryResource<ManagedAlloc>;

/// Where a fresh managed range goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Prefetched to the device at once (its pages are made there, with no page faults).
    Device,
    /// Kept in host memory and mapped for the device, which reads and writes it over the link
    /// (no migrations back and forth).
    Host,
}

/// The device memory a prefetch leaves free: 1/32 of the device (2.5 GiB of 80), for
/// allocations that are not managed and for the driver.
pub const PLACEMENT_HEADROOM_DIVISOR: usize = 32;

/// Where a fresh range of `bytes` goes on a device with `free` of `total` bytes free: the
/// device while the range fits with the headroom left, else host memory.
pub fn placement_for(bytes: usize, free: usize, total: usize) -> Placement {
    let headroom = total / PLACEMENT_HEADROOM_DIVISOR;
    match bytes.checked_add(headroom) {
        Some(needed) if needed <= free => Placement::Device,
        _ => Placement::Host,
    }
}

impl UncachedManagedMemoryResource {
    /// Allocates `bytes` and places the first `used` of them (the request's own bytes, at most
    /// `bytes`) for work ordered on `stream`: prefetched to the device while it has room, else
    /// kept in host memory and mapped for the device ([`placement_for`]); the address and where
    /// the range went (`None` where the driver refused: a device that cannot place managed
    /// memory, see [`cuda::concurrent_managed_access`]; placement is advice, and the memory
    /// works wherever it is).
    ///
    /// # Errors
    /// As [`allocate`](super::MemoryResource::allocate).
    pub fn allocate_placed(
        &self,
        bytes: usize,
        used: usize,
        stream: Stream,
    ) -> Result<(usize, Option<Placement>)> {
        let ptr = super::MemoryResource::allocate(self, bytes, stream)?;
        let ordinal = super::MemoryResource::device(self).unwrap_or(0);
        if ptr == 0 {
            return Ok((ptr, None));
        }
        // SAFETY: `ptr` is managed memory of `bytes` >= `used` bytes just allocated, not handed
        // out yet.
        let placed = unsafe { place_fresh_range(ptr, used.min(bytes), ordinal, stream) };
        Ok((ptr, placed))
    }
}

/// Places the fresh managed range `[ptr, ptr + bytes)` of device `ordinal`, ordered on
/// `stream` ([`placement_for`] on the device's free memory now); where it went. Placement is
/// advice: a driver error leaves the memory where the driver puts it (on first touch) and is
/// not reported.
///
/// # Safety
/// `ptr` is managed memory valid for `bytes` bytes, with no data in it yet (a prefetch moves
/// pages, which is only a cost; the caller has not handed the range out).
unsafe fn place_fresh_range(
    ptr: usize,
    bytes: usize,
    ordinal: usize,
    stream: Stream,
) -> Option<Placement> {
    let (free, total) = cuda::device_memory_info(ordinal).ok()?;
    let placement = placement_for(bytes, free, total);
    let placed = match placement {
        // SAFETY: the caller's contract.
        Placement::Device => unsafe { cuda::mem_prefetch_async(ptr, bytes, ordinal, stream) },
        // SAFETY: the caller's contract.
        Placement::Host => unsafe { cuda::mem_advise_host_resident(ptr, bytes, ordinal) },
    };
    placed.ok().map(|()| placement)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_ranges_go_to_the_device_while_they_fit_with_headroom() {
        const GIB: usize = 1 << 30;
        let total = 32 * GIB; // 1 GiB headroom
        assert_eq!(placement_for(GIB, 3 * GIB, total), Placement::Device);
        assert_eq!(placement_for(2 * GIB, 3 * GIB, total), Placement::Device);
        assert_eq!(placement_for(2 * GIB + 1, 3 * GIB, total), Placement::Host);
        assert_eq!(placement_for(1, 0, total), Placement::Host);
        assert_eq!(
            placement_for(usize::MAX, usize::MAX, total),
            Placement::Host
        );
    }
}
