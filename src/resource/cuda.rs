//! `cuMemAlloc`/`cuMemFree` on one device.

use super::direct::DirectMemoryResource;
use crate::cuda;

super::direct::direct_allocator! {
    /// `cuMemAlloc`, the driver call of [`CudaMemoryResource`].
    DeviceAlloc: "cuda", Device, cuda::mem_alloc
}

/// Device memory straight from `cuMemAlloc`; every call synchronises the device. The baseline
/// that suballocators are measured against.
pub type CudaMemoryResource = DirectMemoryResource<DeviceAlloc>;
