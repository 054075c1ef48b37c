//! `cuMemAlloc`/`cuMemFree` on one device.

use super::direct::{sealed, DirectAllocator, DirectMemoryResource};
use super::MemoryKind;
use crate::cuda;
use crate::error::Result;

/// `cuMemAlloc`, the driver call of [`CudaMemoryResource`].
#[derive(Debug, Clone, Copy)]
pub struct DeviceAlloc;

impl sealed::Sealed for DeviceAlloc {}

impl DirectAllocator for DeviceAlloc {
    const NAME: &'static str = "cuda";
    const KIND: MemoryKind = MemoryKind::Device;

    fn alloc(bytes: usize) -> Result<usize> {
        cuda::mem_alloc(bytes)
    }
}

/// Device memory straight from `cuMemAlloc`; every call synchronises the device. The baseline
/// that suballocators are measured against.
pub type CudaMemoryResource = DirectMemoryResource<DeviceAlloc>;
