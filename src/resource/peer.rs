//! Memory of another GPU of the machine (a peer GPU), for use by one device: the peer tier of
//! [`TieredMemoryResource`](crate::adaptor::TieredMemoryResource) for data beyond one GPU.

use super::{CudaMemoryResource, MemoryKind, MemoryResource};
use crate::cuda::{self, ContextGuard, Stream};
use crate::error::{Error, Result};

/// Device memory of GPU `peer`, allocated for use by GPU `device`: `cuMemAlloc` in the peer's
/// primary context, each free a `cuMemFree` there, with peer access enabled both ways
/// (`cuCtxEnablePeerAccess`), so kernels and copies on `device` read and write the memory over
/// NVLink or PCIe peer-to-peer, and the peer's own work reaches `device`'s memory too.
///
/// Why `cuMemAlloc` and not a virtual-memory allocation with access granted to both devices:
/// legacy peer access, once enabled, maps every `cuMemAlloc` allocation of the peer (made
/// before or after) into the device's context, at no cost per allocation, and the memory is
/// ordinary device memory for every library (CuPy, PyTorch, IPC). Each call synchronises, as
/// [`CudaMemoryResource`](super::CudaMemoryResource)'s do: put a pool over it for many small
/// allocations.
///
/// [`device`](MemoryResource::device) is `device` (the GPU whose streams use the memory);
/// [`memory_info`](MemoryResource::memory_info) is the peer's free and total memory (where
/// the bytes are).
#[derive(Clone, Debug)]
pub struct PeerMemoryResource {
    device: usize,
    peer: usize,
    /// `cuMemAlloc` / `cuMemFree` in the peer's context, with the pressure retry.
    memory: CudaMemoryResource,
}

impl PeerMemoryResource {
    /// Memory of GPU `peer` for use by GPU `device`; checks `cuDeviceCanAccessPeer` both ways
    /// and enables peer access both ways (access already enabled is fine).
    ///
    /// # Errors
    /// [`Error::NoDriver`] without a CUDA driver; [`Error::InvalidArgument`] when `peer` is
    /// `device` or `device` does not exist; [`Error::NoPeerAccess`] when the machine has no GPU
    /// `peer` (one GPU) or the two GPUs have no peer link; the driver's error from enabling
    /// access (a device that already maps the most peers it can).
    pub fn new(device: usize, peer: usize) -> Result<Self> {
        cuda::ensure_driver()?;
        if device == peer {
            return Err(Error::invalid(
                "peer",
                format!("the peer GPU must be another device than device {device}"),
            ));
        }
        let count = cuda::device_count();
        if device >= count {
            return Err(Error::invalid(
                "device",
                format!("device {device} does not exist ({count} devices)"),
            ));
        }
        let no_link = |reason: String| Error::NoPeerAccess {
            device,
            peer,
            reason,
        };
        if peer >= count {
            return Err(no_link(format!(
                "the machine has {count} GPU{} (no peer device {peer})",
                if count == 1 { "" } else { "s" }
            )));
        }
        let there = cuda::can_access_peer(device, peer)?;
        let back = cuda::can_access_peer(peer, device)?;
        if !(there && back) {
            return Err(no_link(format!(
                "cuDeviceCanAccessPeer says {device} -> {peer}: {there}, {peer} -> {device}: \
                 {back} (no NVLink or PCIe peer-to-peer between them; use host memory as the \
                 next tier)"
            )));
        }
        cuda::enable_peer_access(device, peer)?;
        cuda::enable_peer_access(peer, device)?;
        Ok(PeerMemoryResource {
            device,
            peer,
            memory: CudaMemoryResource::on_device(peer)?,
        })
    }

    /// The first GPU (by ordinal) that has a peer link with `device` both ways.
    ///
    /// # Errors
    /// [`Error::NoDriver`] without a driver; [`Error::NoPeerAccess`] when no GPU of the machine
    /// has one (a machine with one GPU, or GPUs without NVLink or PCIe peer-to-peer).
    pub fn first_peer(device: usize) -> Result<usize> {
        cuda::ensure_driver()?;
        let count = cuda::device_count();
        for peer in (0..count).filter(|&p| p != device) {
            if cuda::can_access_peer(device, peer)? && cuda::can_access_peer(peer, device)? {
                return Ok(peer);
            }
        }
        Err(Error::NoPeerAccess {
            device,
            peer: device,
            reason: format!(
                "none of the machine's {count} GPU{} has a peer link with it",
                if count == 1 { "" } else { "s" }
            ),
        })
    }

    /// The GPU that holds the memory.
    pub fn peer(&self) -> usize {
        self.peer
    }

    /// The GPU that uses it.
    pub fn device_ordinal(&self) -> usize {
        self.device
    }
}

impl MemoryResource for PeerMemoryResource {
    /// `cuMemAlloc` in the peer's context ([`CudaMemoryResource`] on the peer: out of memory
    /// relieves the caches over the peer, [`crate::pressure`], and tries once more).
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        self.memory.allocate(bytes, stream)
    }

    /// Waits for `stream` (work of `device` that may still read the memory: `cuMemFree` in
    /// the peer's context waits only for the peer's own work), then `cuMemFree` there.
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        {
            let _ctx = ContextGuard::new(self.device)?;
            stream.synchronize()?;
        }
        // SAFETY: `ptr` came from `allocate`, that is from `self.memory` (the trait's
        // contract), and no work of `device` uses it any more (synchronized above).
        unsafe { self.memory.deallocate(ptr, bytes, stream) }
    }

    // Memory info: the peer's free and total memory. Blocking: `cuMemAlloc` and `cuMemFree` in
    // the peer's context, and the stream wait before a free.
    super::direct::blocking_source_info!(
        kind: MemoryKind::Device,
        name: "peer",
        memory_of_device: peer
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two GPUs of a test, where the machine has two with a peer link.
    fn two_linked() -> Option<(usize, usize)> {
        if cuda::device_count() < 2 {
            eprintln!("skipped: needs two GPUs");
            return None;
        }
        if !cuda::can_access_peer(0, 1).unwrap_or(false) {
            eprintln!("skipped: GPUs 0 and 1 have no peer link");
            return None;
        }
        Some((0, 1))
    }

    #[test]
    fn without_a_peer_construction_says_why() {
        match cuda::device_count() {
            0 => assert!(matches!(
                PeerMemoryResource::new(0, 1),
                Err(Error::NoDriver(_) | Error::InvalidArgument { .. })
            )),
            n => {
                let err = PeerMemoryResource::new(0, n).unwrap_err();
                assert!(matches!(err, Error::NoPeerAccess { .. }), "{err}");
                assert!(err.to_string().contains("no peer link"), "{err}");
            }
        }
        assert!(PeerMemoryResource::new(0, 0).is_err());
    }

    #[test]
    fn allocates_on_the_peer_and_the_device_reads_it() {
        let Some((device, peer)) = two_linked() else {
            return;
        };
        let mr = PeerMemoryResource::new(device, peer).unwrap();
        // Again: enabling access twice is fine.
        let mr2 = PeerMemoryResource::new(device, peer).unwrap();
        let (free_before, total) = mr.memory_info().unwrap();
        assert_eq!(total, cuda::device_memory_info(peer).unwrap().1);
        let bytes = 64 << 20;
        let ptr = mr.allocate(bytes, Stream::DEFAULT).unwrap();
        assert!(mr.memory_info().unwrap().0 <= free_before);
        // A copy on the device's context from the peer's memory to the device's own.
        let local = crate::CudaMemoryResource::on_device(device).unwrap();
        let dst = local.allocate(bytes, Stream::DEFAULT).unwrap();
        {
            let _ctx = ContextGuard::new(device).unwrap();
            // SAFETY: both ranges are live allocations of `bytes` bytes.
            unsafe {
                cuda::memset_async(ptr, 7, bytes, Stream::DEFAULT).unwrap();
                cuda::memcpy_sync(dst, ptr, bytes, Stream::DEFAULT).unwrap();
            }
            let mut host = vec![0u8; 4096];
            // SAFETY: `host` is 4096 bytes of host memory; `dst` holds `bytes` >= 4096.
            unsafe {
                cuda::memcpy_sync(host.as_mut_ptr() as usize, dst, 4096, Stream::DEFAULT).unwrap()
            };
            assert!(host.iter().all(|&b| b == 7));
        }
        // SAFETY: allocated above with these sizes, no work pending (synchronised copies).
        unsafe {
            local.deallocate(dst, bytes, Stream::DEFAULT).unwrap();
            mr2.deallocate(ptr, bytes, Stream::DEFAULT).unwrap();
        }
    }

    /// Device -> peer GPU -> pinned host on two GPUs, the device held to 64 MiB by a limit (so
    /// nothing near the GPUs' memory is asked for): each allocation lands on the first tier
    /// with room and frees back there.
    #[test]
    fn tiers_over_two_gpus_spill_to_the_peer_then_the_host() {
        use crate::adaptor::{LimitingResourceAdaptor, Tier, TieredMemoryResource};
        let Some((device, peer)) = two_linked() else {
            return;
        };
        let mib = 1 << 20;
        let local: crate::SharedResource = std::sync::Arc::new(LimitingResourceAdaptor::new(
            std::sync::Arc::new(crate::CudaMemoryResource::on_device(device).unwrap()),
            64 * mib,
        ));
        let on_peer: crate::SharedResource = std::sync::Arc::new(LimitingResourceAdaptor::new(
            std::sync::Arc::new(PeerMemoryResource::new(device, peer).unwrap()),
            64 * mib,
        ));
        let host: crate::SharedResource =
            std::sync::Arc::new(crate::PinnedHostMemoryResource::new().unwrap());
        let tiered = TieredMemoryResource::new(vec![
            Tier::new("device", local),
            Tier::new("peer", on_peer),
            Tier::new("host", host),
        ])
        .unwrap();
        let ptrs: Vec<usize> = (0..3)
            .map(|_| tiered.allocate(48 * mib, Stream::DEFAULT).unwrap())
            .collect();
        let tiers: Vec<_> = ptrs.iter().map(|&p| tiered.tier_of(p)).collect();
        assert_eq!(tiers, [Some(0), Some(1), Some(2)]);
        for p in ptrs {
            // SAFETY: allocated above with this size; no work uses the memory.
            unsafe { tiered.deallocate(p, 48 * mib, Stream::DEFAULT).unwrap() };
        }
        assert!(tiered.tier_counts().iter().all(|c| c.current_bytes == 0));
    }
}
