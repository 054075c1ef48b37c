//! `cuMemAllocManaged`: unified memory that can exceed the device.

use super::direct::{sealed, DirectAllocator, DirectMemoryResource};
use super::MemoryKind;
use crate::cuda;
use crate::error::Result;

/// `cuMemAllocManaged` (attached globally), the driver call of [`ManagedMemoryResource`].
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

/// Managed (unified) memory from `cuMemAllocManaged`, attached globally.
pub type ManagedMemoryResource = DirectMemoryResource<ManagedAlloc>;
