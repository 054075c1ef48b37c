//! Device attributes and the default managed memory pool (CUDA 13's `cuMemGetDefaultMemPool`,
//! looked up through `cuGetProcAddress` so that rrmm still loads on older drivers).

use super::check::check;
use super::driver::device_handle;
use super::driver::ensure_driver;
use crate::error::{Error, Result};
use cudarc::driver::sys;

/// `cuDeviceGetAttribute`: the value of attribute `attribute` (a `CUdevice_attribute`, numerically
/// the same as the runtime's `cudaDeviceAttr`) of device `ordinal`.
///
/// # Errors
/// No driver, a bad ordinal, or an attribute the driver does not know (`CUDA_ERROR_INVALID_VALUE`).
pub fn device_attribute(attribute: i32, ordinal: usize) -> Result<i32> {
    let device = device_handle(ordinal)?;
    type GetAttribute = unsafe extern "C" fn(*mut i32, i32, sys::CUdevice) -> sys::CUresult;
    // The attribute goes through as a plain int, so that attributes newer than cudarc's enum work.
    let function: GetAttribute = lookup("cuDeviceGetAttribute", 12000)?;
    let mut value = 0;
    // SAFETY: `function` is the driver's cuDeviceGetAttribute (int*, int, CUdevice); `value` is a
    // valid out-pointer and `device` a valid handle.
    check("cuDeviceGetAttribute", unsafe {
        function(&mut value, attribute, device)
    })?;
    Ok(value)
}

/// The default managed-memory pool of device `ordinal` (`cuMemGetDefaultMemPool` with
/// `CU_MEM_ALLOCATION_TYPE_MANAGED`), owned by the driver.
///
/// # Errors
/// [`Error::Logic`] when the driver predates CUDA 13 (no managed pools), else the CUDA error.
pub fn default_managed_pool(ordinal: usize) -> Result<usize> {
    let device = device_handle(ordinal)?;
    type GetDefaultMemPool =
        unsafe extern "C" fn(*mut sys::CUmemoryPool, *mut sys::CUmemLocation, u32) -> sys::CUresult;
    const CU_MEM_ALLOCATION_TYPE_MANAGED: u32 = 2;
    let function: GetDefaultMemPool = lookup("cuMemGetDefaultMemPool", 13000).map_err(|_| {
        Error::Logic("cuda_async_managed_memory_resource requires CUDA 13.0 or higher".to_string())
    })?;
    let mut location = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    };
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `function` is the driver's cuMemGetDefaultMemPool (CUmemoryPool*, CUmemLocation*,
    // CUmemAllocationType as a 32-bit enum); both out-pointers are valid.
    check("cuMemGetDefaultMemPool", unsafe {
        function(&mut pool, &mut location, CU_MEM_ALLOCATION_TYPE_MANAGED)
    })?;
    Ok(pool as usize)
}

/// A driver function by name, as of CUDA version `version` (`cuGetProcAddress_v2`).
fn lookup<F: Copy>(symbol: &'static str, version: i32) -> Result<F> {
    ensure_driver()?;
    debug_assert_eq!(
        std::mem::size_of::<F>(),
        std::mem::size_of::<*mut std::ffi::c_void>()
    );
    let name = std::ffi::CString::new(symbol)
        .map_err(|_| Error::invalid("symbol", "contains a NUL byte"))?;
    let mut pointer: *mut std::ffi::c_void = std::ptr::null_mut();
    let mut status = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
    // SAFETY: `name` is NUL-terminated and both out-pointers are valid.
    check("cuGetProcAddress", unsafe {
        sys::cuGetProcAddress_v2(name.as_ptr(), &mut pointer, version, 0, &mut status)
    })?;
    if pointer.is_null()
        || status != sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS
    {
        return Err(Error::Logic(format!(
            "the CUDA driver has no {symbol} (CUDA {version} or newer needed)"
        )));
    }
    // SAFETY: `F` is a function-pointer type of the same size as a pointer (checked above) whose
    // signature the callers give as the driver documents it for `symbol`.
    Ok(unsafe { std::mem::transmute_copy::<*mut std::ffi::c_void, F>(&pointer) })
}

/// `CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS`.
const CONCURRENT_MANAGED_ACCESS: i32 = 89;

/// Whether device `ordinal` can use managed memory at the same time as the host, which
/// prefetching and placement advice need (Linux on Pascal and newer; not Windows); false
/// without a driver.
pub fn concurrent_managed_access(ordinal: usize) -> bool {
    device_attribute(CONCURRENT_MANAGED_ACCESS, ordinal).is_ok_and(|v| v != 0)
}

/// `CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID` (CUDA 12.2).
const HOST_NUMA_ID: i32 = 134;

/// The host NUMA node closest to device `ordinal`, as the driver reports it; `None` where the
/// driver does not say (older drivers, machines without NUMA: the attribute is -1).
pub fn host_numa_node(ordinal: usize) -> Option<u32> {
    device_attribute(HOST_NUMA_ID, ordinal)
        .ok()
        .and_then(|v| u32::try_from(v).ok())
}
