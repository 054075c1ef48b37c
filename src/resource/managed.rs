//! `cuMemAllocManaged`: unified memory that can exceed the device (where a fresh range of it is
//! placed: [`placement`](super::placement)). The cached resource users get is
//! [`ManagedMemoryResource`](crate::ManagedMemoryResource) (a reuse cache over this one).

use super::direct::DirectMemoryResource;
use crate::cuda;

super::direct::direct_allocator! {
    /// `cuMemAllocManaged` (attached globally), the driver call of
    /// [`UncachedManagedMemoryResource`].
    ManagedAlloc: "managed", Managed, cuda::mem_alloc_managed
}

/// Managed (unified) memory straight from `cuMemAllocManaged`, attached globally, each free a
/// `cuMemFree` (RMM's `managed_memory_resource`); the source of
/// [`ManagedMemoryResource`](crate::ManagedMemoryResource).
pub type UncachedManagedMemoryResource = DirectMemoryResource<ManagedAlloc>;
