//! `cuMemAllocManaged`: unified memory that can exceed the device (where a fresh range of it is
//! placed: [`placement`](super::placement)). The cached resource users get is
//! [`ManagedMemoryResource`](crate::ManagedMemoryResource) (a reuse cache over this one).

use super::direct::{sealed, DirectAllocator, DirectMemoryResource};
use super::MemoryKind;
use crate::cuda;
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
