//! Memory calls: device, managed, stream-ordered (memory pools), pinned host, copies, prefetch.
//!
//! Every function that touches device memory expects the right context to be current
//! ([`ContextGuard`](super::ContextGuard)); pointers are plain integers (`usize`).

use super::check::{check, check_alloc};
use super::driver::{device_handle, ensure_driver};
use super::stream::Stream;
use crate::error::Result;
use cudarc::driver::sys;

/// `cuMemAlloc`: `bytes` of device memory in the current context.
pub fn mem_alloc(bytes: usize) -> Result<usize> {
    ensure_driver()?;
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: `ptr` is a valid out-pointer.
    let result = unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) };
    check_alloc("cuMemAlloc", result, bytes)?;
    Ok(ptr as usize)
}

/// `cuMemFree`.
///
/// # Safety
/// `ptr` came from [`mem_alloc`] or [`mem_alloc_managed`] and is freed once, after all work
/// using it.
pub unsafe fn mem_free(ptr: usize) -> Result<()> {
    // SAFETY: the caller's contract.
    check("cuMemFree", unsafe {
        sys::cuMemFree_v2(ptr as sys::CUdeviceptr)
    })
}

/// `cuMemAllocManaged` with global attachment.
pub fn mem_alloc_managed(bytes: usize) -> Result<usize> {
    ensure_driver()?;
    let mut ptr: sys::CUdeviceptr = 0;
    let flags = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32;
    // SAFETY: `ptr` is a valid out-pointer; CU_MEM_ATTACH_GLOBAL is a valid flag.
    let result = unsafe { sys::cuMemAllocManaged(&mut ptr, bytes, flags) };
    check_alloc("cuMemAllocManaged", result, bytes)?;
    Ok(ptr as usize)
}

/// `cuMemHostAlloc` (portable, pinned host memory).
pub fn mem_alloc_host(bytes: usize) -> Result<usize> {
    ensure_driver()?;
    let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `ptr` is a valid out-pointer; PORTABLE is a valid flag.
    let result = unsafe { sys::cuMemHostAlloc(&mut ptr, bytes, sys::CU_MEMHOSTALLOC_PORTABLE) };
    check_alloc("cuMemHostAlloc", result, bytes)?;
    Ok(ptr as usize)
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `ptr` came from [`mem_alloc_host`] and is freed once.
pub unsafe fn mem_free_host(ptr: usize) -> Result<()> {
    // SAFETY: the caller's contract.
    check("cuMemFreeHost", unsafe {
        sys::cuMemFreeHost(ptr as *mut std::ffi::c_void)
    })
}

/// `cuMemHostRegister` (portable, mapped for the device): pins `bytes` of host memory at `ptr`
/// so copies from and to it run at the link's speed and kernels can read it.
///
/// # Safety
/// 1. `ptr .. ptr + bytes` is mapped host memory that stays mapped until
///    [`mem_host_unregister`] of `ptr`.
///
/// # Errors
/// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the driver cannot pin that much; CUDA
/// errors.
pub unsafe fn mem_host_register(ptr: usize, bytes: usize) -> Result<()> {
    ensure_driver()?;
    let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
    // SAFETY: the caller's precondition 1.
    let result = unsafe { sys::cuMemHostRegister_v2(ptr as *mut std::ffi::c_void, bytes, flags) };
    check_alloc("cuMemHostRegister", result, bytes)
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// 1. `ptr` was registered by [`mem_host_register`] and not unregistered since.
/// 2. No queued or running work uses the range.
pub unsafe fn mem_host_unregister(ptr: usize) -> Result<()> {
    // SAFETY: the caller's preconditions.
    check("cuMemHostUnregister", unsafe {
        sys::cuMemHostUnregister(ptr as *mut std::ffi::c_void)
    })
}

/// A stream-ordered memory pool (`CUmemoryPool`) owned by its creator.
#[derive(Debug)]
pub struct MemPool {
    raw: usize,
    owned: bool,
}

/// Which shareable handle a pool exports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolExport {
    /// POSIX file descriptors (IPC between processes).
    pub ipc: bool,
    /// Fabric handles (multi-node NVLink).
    pub fabric: bool,
}

impl MemPool {
    /// Creates a pool of pinned device memory on device `ordinal` with the given release
    /// threshold (bytes kept when the pool is idle).
    pub fn new(ordinal: usize, release_threshold: u64, export: PoolExport) -> Result<Self> {
        let device = device_handle(ordinal)?;
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = device;
        let mut handles = 0u32;
        if export.ipc {
            handles |= 1; // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        }
        if export.fabric {
            handles |= 8; // CU_MEM_HANDLE_TYPE_FABRIC
        }
        props.handleTypes = sys::CUmemAllocationHandleType(handles);
        let mut raw: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer and `props` a fully initialised struct.
        check("cuMemPoolCreate", unsafe {
            sys::cuMemPoolCreate(&mut raw, &props)
        })?;
        let pool = MemPool {
            raw: raw as usize,
            owned: true,
        };
        pool.set_release_threshold(release_threshold)?;
        Ok(pool)
    }

    /// Wraps a pool created elsewhere (not destroyed on drop).
    ///
    /// # Safety
    /// 1. `raw` is a live `CUmemoryPool` handle.
    /// 2. The pool stays live (its owner does not destroy it) while the returned value, or any
    ///    allocation made from it, is in use.
    pub unsafe fn from_raw(raw: usize) -> Self {
        MemPool { raw, owned: false }
    }

    /// The raw `CUmemoryPool` handle.
    pub fn raw(&self) -> usize {
        self.raw
    }

    /// Sets `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        let mut value = bytes;
        // SAFETY: the attribute takes a pointer to a u64.
        check("cuMemPoolSetAttribute", unsafe {
            sys::cuMemPoolSetAttribute(
                self.raw as sys::CUmemoryPool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut value as *mut u64).cast(),
            )
        })
    }

    /// `cuMemAllocFromPoolAsync`.
    pub fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let mut ptr: sys::CUdeviceptr = 0;
        let pool = self.raw as sys::CUmemoryPool;
        // SAFETY: `ptr` is a valid out-pointer; pool and stream are live handles.
        let result = unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, pool, stream.as_cu()) };
        check_alloc("cuMemAllocFromPoolAsync", result, bytes)?;
        Ok(ptr as usize)
    }

    /// `(reserved, used)` bytes: what the pool holds from the device
    /// (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`) and what of it is allocated
    /// (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    pub fn reserved_and_used(&self) -> Result<(usize, usize)> {
        let read = |attribute| {
            let mut value = 0u64;
            // SAFETY: the pool is live and these attributes take a pointer to a u64.
            check("cuMemPoolGetAttribute", unsafe {
                sys::cuMemPoolGetAttribute(
                    self.raw as sys::CUmemoryPool,
                    attribute,
                    (&mut value as *mut u64).cast(),
                )
            })
            .map(|()| usize::try_from(value).unwrap_or(usize::MAX))
        };
        Ok((
            read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            read(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
        ))
    }

    /// Releases idle memory down to `keep` bytes.
    pub fn trim_to(&self, keep: usize) -> Result<()> {
        // SAFETY: the pool is live.
        check("cuMemPoolTrimTo", unsafe {
            sys::cuMemPoolTrimTo(self.raw as sys::CUmemoryPool, keep)
        })
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: this pool was created by `new` and is destroyed once; the driver frees
            // what is still allocated from it.
            unsafe {
                sys::cuMemPoolDestroy(self.raw as sys::CUmemoryPool);
            }
        }
    }
}

/// `cuMemFreeAsync`.
///
/// # Safety
/// `ptr` came from a stream-ordered allocation and is freed once.
pub unsafe fn mem_free_async(ptr: usize, stream: Stream) -> Result<()> {
    // SAFETY: the caller's contract.
    check("cuMemFreeAsync", unsafe {
        sys::cuMemFreeAsync(ptr as sys::CUdeviceptr, stream.as_cu())
    })
}

/// `cuMemcpyAsync` between any two addresses (unified addressing), ordered on `stream`.
///
/// # Safety
/// Both ranges are valid for `bytes` bytes until the copy completes.
pub unsafe fn memcpy_async(dst: usize, src: usize, bytes: usize, stream: Stream) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    ensure_driver()?;
    // SAFETY: the caller's contract.
    check("cuMemcpyAsync", unsafe {
        sys::cuMemcpyAsync(
            dst as sys::CUdeviceptr,
            src as sys::CUdeviceptr,
            bytes,
            stream.as_cu(),
        )
    })
}

/// Copies `bytes` from `src` to `dst` on `stream` and waits for the copy.
///
/// # Safety
/// Both ranges are valid for `bytes` bytes.
pub unsafe fn memcpy_sync(dst: usize, src: usize, bytes: usize, stream: Stream) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { memcpy_async(dst, src, bytes, stream)? };
    if bytes > 0 {
        stream.synchronize()?;
    }
    Ok(())
}

/// `cuMemsetD8Async`.
///
/// # Safety
/// `dst` is valid device memory for `bytes` bytes.
pub unsafe fn memset_async(dst: usize, value: u8, bytes: usize, stream: Stream) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract.
    check("cuMemsetD8Async", unsafe {
        sys::cuMemsetD8Async(dst as sys::CUdeviceptr, value, bytes, stream.as_cu())
    })
}

/// `cuMemsetD32Async`: sets `words` 32-bit words at `dst` to `value`, ordered on `stream`.
///
/// # Safety
/// `dst` is valid device memory for `words * 4` bytes, 4-byte aligned, until the set completes.
pub unsafe fn memset_d32_async(dst: usize, value: u32, words: usize, stream: Stream) -> Result<()> {
    if words == 0 {
        return Ok(());
    }
    ensure_driver()?;
    // SAFETY: the caller's contract.
    check("cuMemsetD32Async", unsafe {
        sys::cuMemsetD32Async(dst as sys::CUdeviceptr, value, words, stream.as_cu())
    })
}

/// `cuMemPrefetchAsync` of managed memory to device `ordinal`.
///
/// # Safety
/// `ptr` is managed memory valid for `bytes` bytes.
pub unsafe fn mem_prefetch_async(
    ptr: usize,
    bytes: usize,
    ordinal: usize,
    stream: Stream,
) -> Result<()> {
    let device = device_handle(ordinal)?;
    let _ctx = super::ContextGuard::new(ordinal)?;
    // SAFETY: the caller's contract.
    check("cuMemPrefetchAsync", unsafe {
        sys::cuMemPrefetchAsync(ptr as sys::CUdeviceptr, bytes, device, stream.as_cu())
    })
}

/// Advises the driver to keep managed memory at `ptr` (`bytes` long) in host memory
/// (`CU_MEM_ADVISE_SET_PREFERRED_LOCATION` to the CPU) and to map it for device `ordinal`
/// (`CU_MEM_ADVISE_SET_ACCESSED_BY`), so that the device reads and writes it over the link
/// instead of migrating its pages back and forth.
///
/// # Safety
/// `ptr` is managed memory valid for `bytes` bytes.
pub unsafe fn mem_advise_host_resident(ptr: usize, bytes: usize, ordinal: usize) -> Result<()> {
    let device = device_handle(ordinal)?;
    let _ctx = super::ContextGuard::new(ordinal)?;
    /// `CU_DEVICE_CPU`: the host, as a device of the advice calls.
    const CU_DEVICE_CPU: sys::CUdevice = -1;
    // SAFETY: the caller's contract; advice changes no data, only where pages live.
    check("cuMemAdvise", unsafe {
        sys::cuMemAdvise(
            ptr as sys::CUdeviceptr,
            bytes,
            sys::CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
            CU_DEVICE_CPU,
        )
    })?;
    // SAFETY: as above.
    check("cuMemAdvise", unsafe {
        sys::cuMemAdvise(
            ptr as sys::CUdeviceptr,
            bytes,
            sys::CUmem_advise::CU_MEM_ADVISE_SET_ACCESSED_BY,
            device,
        )
    })
}

/// The device that managed memory at `ptr` (`bytes` long) was last prefetched to
/// (`CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION`): a device ordinal, -1 for the host, -2 when
/// it was never prefetched or the range's parts differ.
///
/// # Errors
/// The driver's error for memory that is not managed.
///
/// # Safety
/// `ptr` is managed memory valid for `bytes` bytes.
pub unsafe fn mem_last_prefetch_location(ptr: usize, bytes: usize) -> Result<i32> {
    ensure_driver()?;
    // The range query needs a current context (a fresh thread has none).
    let _context = super::context::ContextGuard::new(super::context::current_device()?)?;
    let mut location: i32 = -2;
    // SAFETY: `location` is a valid 4-byte out-value for this attribute; the range is valid
    // managed memory (the caller's contract).
    check("cuMemRangeGetAttribute", unsafe {
        sys::cuMemRangeGetAttribute(
            (&mut location as *mut i32).cast(),
            std::mem::size_of::<i32>(),
            sys::CUmem_range_attribute::CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION,
            ptr as sys::CUdeviceptr,
            bytes,
        )
    })?;
    Ok(location)
}

/// Whether `ptr` is managed memory (false for any pointer CUDA does not know).
pub fn is_managed(ptr: usize) -> bool {
    if ensure_driver().is_err() || ptr == 0 {
        return false;
    }
    let mut value: u32 = 0;
    // SAFETY: IS_MANAGED writes an unsigned int into `value`.
    let result = unsafe {
        sys::cuPointerGetAttribute(
            (&mut value as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            ptr as sys::CUdeviceptr,
        )
    };
    result == sys::CUresult::CUDA_SUCCESS && value != 0
}

/// The ordinal of the device whose memory `ptr` is (device or mapped virtual memory); `None`
/// for any address CUDA does not know and without a driver. A pure query.
pub fn device_ordinal_of(ptr: usize) -> Option<usize> {
    if ensure_driver().is_err() || ptr == 0 {
        return None;
    }
    let mut ordinal: i32 = -1;
    // SAFETY: DEVICE_ORDINAL writes an int into `ordinal`; the driver only looks `ptr` up.
    let result = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr as sys::CUdeviceptr,
        )
    };
    (result == sys::CUresult::CUDA_SUCCESS)
        .then_some(ordinal)
        .and_then(|o| usize::try_from(o).ok())
}

/// The CUDA allocation that contains `ptr`, as `(start, bytes)`: device, managed, pinned or
/// registered host memory, a memory-pool block or a mapped virtual range; `None` for any
/// address CUDA does not know (pageable host memory, unmapped or bogus addresses) and without a
/// driver. A pure query: nothing is read through `ptr`.
pub fn allocation_range(ptr: usize) -> Option<(usize, usize)> {
    if ensure_driver().is_err() || ptr == 0 {
        return None;
    }
    let mut start: sys::CUdeviceptr = 0;
    let mut size: usize = 0;
    // SAFETY: RANGE_START_ADDR writes a CUdeviceptr and RANGE_SIZE a size_t into valid
    // out-values; the driver only looks `ptr` up in its tables.
    let ok = unsafe {
        sys::cuPointerGetAttribute(
            (&mut start as *mut sys::CUdeviceptr).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            ptr as sys::CUdeviceptr,
        ) == sys::CUresult::CUDA_SUCCESS
            && sys::cuPointerGetAttribute(
                (&mut size as *mut usize).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                ptr as sys::CUdeviceptr,
            ) == sys::CUresult::CUDA_SUCCESS
    };
    let start = start as usize;
    (ok && size > 0 && start <= ptr && ptr - start < size).then_some((start, size))
}

/// `cuMemGetInfo`: (free, total) bytes of the current context's device.
pub fn mem_get_info() -> Result<(usize, usize)> {
    ensure_driver()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both are valid out-pointers.
    check("cuMemGetInfo", unsafe {
        sys::cuMemGetInfo_v2(&mut free, &mut total)
    })?;
    Ok((free, total))
}

/// `(free, total)` bytes of device `ordinal`, with its primary context current for the call.
///
/// # Errors
/// No driver, a bad ordinal, or the CUDA error of the calls.
pub fn device_memory_info(ordinal: usize) -> Result<(usize, usize)> {
    let _ctx = super::ContextGuard::new(ordinal)?;
    mem_get_info()
}

/// `cuCtxSynchronize`: waits for all work of the current context.
pub fn context_synchronize() -> Result<()> {
    ensure_driver()?;
    // SAFETY: no preconditions beyond a current context, which the driver checks.
    check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
}

/// `cuIpcGetMemHandle` for the allocation that contains `ptr`; returns the 64-byte handle and
/// the offset of `ptr` from the allocation's base.
pub fn ipc_mem_handle(ptr: usize) -> Result<([u8; 64], usize)> {
    ensure_driver()?;
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: valid out-pointers.
    check("cuMemGetAddressRange", unsafe {
        sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr as sys::CUdeviceptr)
    })?;
    // SAFETY: all-zero is a valid handle value.
    let mut handle: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer; `base` is the start of a device allocation.
    check("cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(&mut handle, base)
    })?;
    let mut bytes = [0u8; 64];
    for (dst, src) in bytes.iter_mut().zip(handle.reserved.iter()) {
        *dst = *src as u8;
    }
    Ok((bytes, ptr - base as usize))
}
