//! An owned, untyped allocation that frees itself.

use crate::cuda::{self, Stream};
use crate::error::{Error, Result};
use crate::resource::{MemoryKind, SharedResource};

/// `size` bytes allocated from a resource on a stream, returned to it (on its stream) on drop.
/// The memory is not initialised.
pub struct DeviceBuffer {
    ptr: usize,
    size: usize,
    capacity: usize,
    stream: Stream,
    mr: SharedResource,
}

impl DeviceBuffer {
    /// Allocates `size` bytes from `mr`, ready for use on `stream`. The allocation's door: on
    /// a shared GPU, the processes beside this one are asked for room here, outside every lock
    /// ([`crate::pressure::allocate_asking`]).
    ///
    /// # Errors
    /// The resource's errors ([`Error::OutOfMemory`] first among them).
    pub fn new(size: usize, stream: Stream, mr: SharedResource) -> Result<Self> {
        let ptr = crate::pressure::allocate_with_neighbours(|| mr.allocate(size, stream))?;
        Ok(DeviceBuffer {
            ptr,
            size,
            capacity: size,
            stream,
            mr,
        })
    }

    /// The buffer of `ptr`, `size` bytes allocated from `mr` on `stream` (a door that
    /// allocated it itself: [`crate::pressure::allocate_asking`]).
    ///
    /// # Safety
    /// 1. `ptr` was allocated from `mr` with `size` bytes on `stream`, is live, and nothing
    ///    else frees it (the buffer frees it on drop).
    pub unsafe fn adopt(ptr: usize, size: usize, stream: Stream, mr: SharedResource) -> Self {
        DeviceBuffer {
            ptr,
            size,
            capacity: size,
            stream,
            mr,
        }
    }

    /// Allocates a buffer holding a copy of `data`, and waits for the copy.
    pub fn from_host(data: &[u8], stream: Stream, mr: SharedResource) -> Result<Self> {
        let buf = Self::new(data.len(), stream, mr)?;
        buf.copy_from_host(data)?;
        Ok(buf)
    }

    /// The address of the memory (0 for an empty buffer).
    pub fn ptr(&self) -> usize {
        self.ptr
    }

    /// The address, borrowed for as long as the buffer is (a kernel argument is a pointer to
    /// it: see the cudarc interop of the containers).
    pub(crate) fn ptr_ref(&self) -> &usize {
        &self.ptr
    }

    /// Bytes in the buffer.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes allocated (at least `size`).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The stream the buffer is ordered on.
    pub fn stream(&self) -> Stream {
        self.stream
    }

    /// Changes the stream used from now on (for copies and the final deallocation).
    pub fn set_stream(&mut self, stream: Stream) {
        self.stream = stream;
    }

    /// The resource the memory came from.
    pub fn resource(&self) -> &SharedResource {
        &self.mr
    }

    /// An error naming `argument` unless `len` bytes fit in the buffer.
    fn check_fits(&self, argument: &'static str, len: usize) -> Result<()> {
        if len > self.size {
            return Err(Error::invalid(
                argument,
                format!("{len} bytes do not fit in a buffer of {} bytes", self.size),
            ));
        }
        Ok(())
    }

    /// Copies `data` (at most `size` bytes) to the start of the buffer, and waits.
    pub fn copy_from_host(&self, data: &[u8]) -> Result<()> {
        self.check_fits("data", data.len())?;
        // SAFETY: the buffer holds at least `data.len()` bytes and `data` is a live slice.
        unsafe {
            copy_bytes(
                self.ptr,
                data.as_ptr() as usize,
                data.len(),
                self.stream,
                self.mr.kind(),
            )
        }
    }

    /// Copies the first `out.len()` bytes of the buffer to `out`, and waits.
    pub fn copy_to_host(&self, out: &mut [u8]) -> Result<()> {
        self.check_fits("out", out.len())?;
        // SAFETY: the buffer holds at least `out.len()` bytes and `out` is a live slice.
        unsafe {
            copy_bytes(
                out.as_mut_ptr() as usize,
                self.ptr,
                out.len(),
                self.stream,
                self.mr.kind(),
            )
        }
    }

    /// Copies `data` into the buffer from byte `offset` on, and waits.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `offset + data.len()` passes the buffer's size; copy
    /// errors.
    pub fn copy_from_host_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        let (dst, src, len) = self.host_copy_at(offset, HostSide::Source(data))?;
        // SAFETY: `offset .. offset + data.len()` lies inside the buffer (checked by
        // `host_copy_at`) and `data` is a live slice.
        unsafe { copy_bytes(dst, src, len, self.stream, self.mr.kind()) }
    }

    /// Copies `out.len()` bytes of the buffer from byte `offset` on into `out`, and waits.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `offset + out.len()` passes the buffer's size; copy
    /// errors.
    pub fn copy_to_host_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let (dst, src, len) = self.host_copy_at(offset, HostSide::Destination(out))?;
        // SAFETY: `offset .. offset + out.len()` lies inside the buffer (checked by
        // `host_copy_at`) and `out` is a live slice.
        unsafe { copy_bytes(dst, src, len, self.stream, self.mr.kind()) }
    }

    /// Enqueues a copy of `data` into the buffer from byte `offset` on, on `stream`, and returns
    /// without waiting for it.
    ///
    /// Ordering: `stream` first waits for the work enqueued so far on the buffer's stream, and
    /// the buffer's stream then waits for the copy (device-side event waits; nothing extra when
    /// `stream` is the buffer's stream), so the buffer's later work, its reallocation and its
    /// free come after the copy. The host memory is the caller's to order (the contract below).
    ///
    /// The driver returns at once only for pinned or registered host memory; with pageable
    /// memory it stages the bytes before returning, or copies synchronously (CUDA's rules for
    /// `cuMemcpyAsync`). Host memory of a host resource where there is no driver is copied by
    /// the CPU before this returns.
    ///
    /// # Safety
    /// 1. `data` stays allocated (not freed or reallocated) and is not written until the copy has
    ///    completed on `stream` (for example [`Stream::synchronize`] of `stream`, or of the
    ///    buffer's stream, which waits for the copy).
    /// 2. `stream` is a stream of the current device's context (as the buffer's stream is).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `offset + data.len()` passes the buffer's size;
    /// [`Error::Logic`] for simulated memory; CUDA errors from the waits or the copy.
    pub unsafe fn copy_from_host_async_at(
        &self,
        offset: usize,
        data: &[u8],
        stream: Stream,
    ) -> Result<()> {
        let (dst, src, len) = self.host_copy_at(offset, HostSide::Source(data))?;
        // SAFETY: `offset .. offset + data.len()` lies inside the buffer (checked by
        // `host_copy_at`), whose free on its stream is ordered after the copy; the caller keeps
        // `data` alive and unwritten until the copy completes (1) and names a stream of the
        // current context (2).
        unsafe { copy_bytes_async(dst, src, len, self.stream, stream, self.mr.kind()) }
    }

    /// Enqueues a copy of `out.len()` bytes of the buffer from byte `offset` on into `out`, on
    /// `stream`, and returns without waiting for it. Ordered as
    /// [`copy_from_host_async_at`](Self::copy_from_host_async_at) (with pageable memory the
    /// driver returns only once the copy is done).
    ///
    /// # Safety
    /// 1. `out` stays allocated (not freed or reallocated) and is neither read nor written
    ///    until the copy has completed on `stream` (or on the buffer's stream, which waits for
    ///    the copy).
    /// 2. `stream` is a stream of the current device's context (as the buffer's stream is).
    ///
    /// # Errors
    /// As [`copy_from_host_async_at`](Self::copy_from_host_async_at).
    pub unsafe fn copy_to_host_async_at(
        &self,
        offset: usize,
        out: &mut [u8],
        stream: Stream,
    ) -> Result<()> {
        let (dst, src, len) = self.host_copy_at(offset, HostSide::Destination(out))?;
        // SAFETY: `offset .. offset + out.len()` lies inside the buffer (checked by
        // `host_copy_at`), whose free on its stream is ordered after the copy; the caller leaves
        // `out` alone until the copy completes (1) and names a stream of the current context (2).
        unsafe { copy_bytes_async(dst, src, len, self.stream, stream, self.mr.kind()) }
    }

    /// The destination and source addresses and the length of a copy between the buffer, from
    /// byte `offset` on, and the host slice of `host`, once the range is found inside the
    /// buffer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the slice (`data` or `out`) when `offset` plus its
    /// length passes the buffer's size.
    fn host_copy_at(&self, offset: usize, host: HostSide<'_>) -> Result<(usize, usize, usize)> {
        match host {
            HostSide::Source(data) => {
                self.check_range("data", offset, data.len())?;
                Ok((self.ptr + offset, data.as_ptr() as usize, data.len()))
            }
            HostSide::Destination(out) => {
                self.check_range("out", offset, out.len())?;
                Ok((out.as_mut_ptr() as usize, self.ptr + offset, out.len()))
            }
        }
    }

    fn check_range(&self, argument: &'static str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::invalid(
                argument,
                format!(
                    "{len} bytes at offset {offset} pass the end of a buffer of {} bytes",
                    self.size
                ),
            )),
        }
    }

    /// The whole buffer as a `Vec`.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.size];
        self.copy_to_host(&mut out)?;
        Ok(out)
    }

    /// Copies `bytes` bytes from device (or any CUDA-visible) memory at `src` into the buffer.
    ///
    /// # Safety
    /// `src` is valid for `bytes` bytes until the copy completes.
    pub unsafe fn copy_from_device(&self, src: usize, bytes: usize) -> Result<()> {
        if bytes > self.size {
            return Err(Error::invalid("bytes", "source larger than the buffer"));
        }
        // SAFETY: the caller's contract for `src`; the buffer holds `bytes` bytes.
        unsafe { copy_bytes(self.ptr, src, bytes, self.stream, self.mr.kind()) }
    }

    /// Makes room for `capacity` bytes without changing `size`; reallocates and copies when the
    /// capacity grows.
    pub fn reserve(&mut self, capacity: usize) -> Result<()> {
        if capacity > self.capacity {
            self.reallocate(capacity)?;
        }
        Ok(())
    }

    /// Changes `size`; shrinking keeps the memory, growing past the capacity reallocates and
    /// copies the old contents.
    pub fn resize(&mut self, size: usize) -> Result<()> {
        if size > self.capacity {
            self.reallocate(size)?;
        }
        self.size = size;
        Ok(())
    }

    /// Sets `size` to at most the capacity, without reallocating.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `size` is above the capacity.
    pub fn resize_within_capacity(&mut self, size: usize) -> Result<()> {
        if size > self.capacity {
            return Err(Error::invalid(
                "size",
                format!("{size} bytes is more than the capacity, {}", self.capacity),
            ));
        }
        self.size = size;
        Ok(())
    }

    /// Frees unused capacity: reallocates to exactly `size` bytes when they differ.
    pub fn shrink_to_fit(&mut self) -> Result<()> {
        if self.capacity > self.size {
            self.reallocate(self.size)?;
        }
        Ok(())
    }

    /// A new buffer of `capacity` bytes from the same resource on `stream`, holding `size`
    /// bytes (at most `capacity`) of which the first `min(size, self.size())` are copied from
    /// this one; this buffer is unchanged. (Reallocation in two steps, for callers that must not
    /// hold `&mut self` while the copy runs.)
    ///
    /// # Errors
    /// The resource's errors; the copy's errors (the new memory is freed again).
    pub fn reallocated(&self, capacity: usize, size: usize, stream: Stream) -> Result<Self> {
        let size = size.min(capacity);
        let mut next = DeviceBuffer::new(capacity, stream, self.mr.clone())?;
        next.size = size;
        let keep = self.size.min(size);
        // The copy is ordered after this buffer's work on its stream and before the new one's:
        // both run on `stream` when they are the same; otherwise the copy waits.
        // SAFETY: both ranges hold at least `keep` bytes and stay alive through the copy (it
        // waits); a failed copy drops `next`, which frees the new memory.
        unsafe { copy_bytes(next.ptr, self.ptr, keep, stream, self.mr.kind()) }?;
        Ok(next)
    }

    fn reallocate(&mut self, capacity: usize) -> Result<()> {
        let new_ptr =
            crate::pressure::allocate_with_neighbours(|| self.mr.allocate(capacity, self.stream))?;
        let keep = self.size.min(capacity);
        // SAFETY: both ranges hold at least `keep` bytes; the old one is freed only after the
        // copy is enqueued on the same stream.
        if let Err(e) = unsafe { copy_bytes(new_ptr, self.ptr, keep, self.stream, self.mr.kind()) }
        {
            // SAFETY: `new_ptr` was just allocated from `self.mr` with `capacity` on
            // `self.stream`, is not handed out, and the failed copy enqueued no work on it.
            let _ = unsafe { self.mr.deallocate(new_ptr, capacity, self.stream) };
            return Err(e);
        }
        let old = std::mem::replace(&mut self.ptr, new_ptr);
        let old_capacity = std::mem::replace(&mut self.capacity, capacity);
        // SAFETY: the buffer owned `old`, allocated from `self.mr` with `old_capacity`, and
        // forgets it here; the copy out of it is ordered before the free on `self.stream`.
        unsafe { self.mr.deallocate(old, old_capacity, self.stream) }
    }

    /// Frees the memory now and reports what the resource said (dropping frees too, but cannot
    /// report an error).
    ///
    /// # Errors
    /// The resource's error; the memory is then the resource's to keep or lose, as it decided.
    pub fn free(self) -> Result<()> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again, so moving the resource out is sound
        // (no clone: the round trip of a buffer pays no reference-count traffic here).
        let mr = unsafe { std::ptr::read(&this.mr) };
        // SAFETY: the buffer owned `ptr`, allocated from `mr` with `capacity`, and gave up
        // ownership just above (it is never dropped), so it is freed once, after the work
        // enqueued on `stream`.
        unsafe { mr.deallocate(this.ptr, this.capacity, this.stream) }
    }

    /// Gives up ownership: returns (ptr, capacity, stream) without freeing the memory.
    pub fn into_raw(self) -> (usize, usize, Stream) {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again, so moving the resource out is sound.
        let _mr = unsafe { std::ptr::read(&this.mr) };
        (this.ptr, this.capacity, this.stream)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; the resource stays consistent either way.
        // SAFETY: the buffer owns `ptr`, allocated from `mr` with `capacity`, and frees it
        // once; work on it was enqueued on `stream` (the buffer's stream), so the free is
        // ordered after it.
        let _ = unsafe { self.mr.deallocate(self.ptr, self.capacity, self.stream) };
    }
}

/// The host side of a copy between a buffer and host memory.
enum HostSide<'a> {
    /// The bytes copied into the buffer (the argument `data`).
    Source(&'a [u8]),
    /// Where the buffer's bytes are copied to (the argument `out`).
    Destination(&'a mut [u8]),
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("capacity", &self.capacity)
            .field("stream", &self.stream)
            .field("mr", &self.mr.name())
            .finish()
    }
}

/// Copies `bytes` from `src` to `dst` and waits. Host memory of host-only resources is copied
/// directly where there is no driver; simulated memory cannot be copied.
///
/// # Safety
/// Both ranges are valid for `bytes` bytes.
pub(crate) unsafe fn copy_bytes(
    dst: usize,
    src: usize,
    bytes: usize,
    stream: Stream,
    kind: MemoryKind,
) -> Result<()> {
    // SAFETY: the caller's contract; a blocking copy is done when this returns.
    unsafe { copy_bytes_as(dst, src, bytes, kind, CopyOrder::Blocking(stream)) }
}

/// Enqueues a copy of `bytes` from `src` to `dst` on `stream` after the work enqueued so far on
/// `own` (a buffer's stream), makes `own` wait for the copy, and returns without waiting on the
/// host. Copies done by the CPU (see [`copy_bytes`]) are done when this returns.
///
/// # Safety
/// 1. Both ranges are valid for `bytes` bytes until the copy completes on `stream`.
/// 2. `stream` belongs to the current device's context.
pub(crate) unsafe fn copy_bytes_async(
    dst: usize,
    src: usize,
    bytes: usize,
    own: Stream,
    stream: Stream,
    kind: MemoryKind,
) -> Result<()> {
    // SAFETY: the caller's contract (1, 2).
    unsafe { copy_bytes_as(dst, src, bytes, kind, CopyOrder::After { own, stream }) }
}

/// How a copy by the driver is ordered.
#[derive(Clone, Copy, Debug)]
enum CopyOrder {
    /// On this stream, waited for on the host.
    Blocking(Stream),
    /// On `stream` after the work enqueued on `own`, which then waits for the copy; the host
    /// does not wait.
    After { own: Stream, stream: Stream },
}

/// The copy of [`copy_bytes`] and [`copy_bytes_async`]: by the CPU for host memory where there
/// is no driver, refused for simulated memory, else by the driver, ordered as `order` says.
///
/// # Safety
/// 1. Both ranges are valid for `bytes` bytes until the copy completes.
/// 2. The copy's stream belongs to the current device's context.
unsafe fn copy_bytes_as(
    dst: usize,
    src: usize,
    bytes: usize,
    kind: MemoryKind,
    order: CopyOrder,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // A range in a sleeping pool's memory has no pages behind it: refused (or woken, for the
    // ledger's sleep), never touched; the copy is counted while it is queued, so an offload
    // that begins meanwhile waits for it (its streams are synchronized after).
    let _copy = crate::resource::sleep::index::begin_copy(&[
        ("source", src, bytes),
        ("destination", dst, bytes),
    ])?;
    match kind {
        MemoryKind::Simulated => {
            return Err(Error::Logic(
                "simulated memory has nothing behind it and cannot be copied (without a GPU, \
                 SimulatedMemoryResource::with_backing or SystemMemoryResource keeps the \
                 bytes: containers and buffers work on it)"
                    .into(),
            ))
        }
        MemoryKind::Host if !cuda::driver_available() => {
            // SAFETY: the caller's contract (1); host ranges of distinct allocations do not
            // overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
            return Ok(());
        }
        _ => {}
    }
    let _ctx = cuda::ContextGuard::new(crate::current::current_device_ordinal())?;
    match order {
        // SAFETY: the caller's contract (1, 2).
        CopyOrder::Blocking(stream) => unsafe { cuda::memcpy_sync(dst, src, bytes, stream) },
        CopyOrder::After { own, stream } => {
            stream.wait_for(own)?;
            // SAFETY: the caller's contract (1, 2).
            unsafe { cuda::memcpy_async(dst, src, bytes, stream) }?;
            if own.wait_for(stream).is_err() {
                // The event failed: wait on the host instead, which orders `own`'s later work.
                stream.synchronize()?;
            }
            Ok(())
        }
    }
}

impl cuda::SpinKernel {
    /// Enqueues one spin of `cycles` clocks (one block of one thread) on the buffer's stream;
    /// the kernel writes its start clock into the buffer's first 8 bytes. (Here rather than in
    /// the driver layer, which knows nothing of buffers.)
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the buffer is smaller than 8 bytes; CUDA errors from the
    /// launch.
    pub fn launch(&self, cycles: i64, out: &DeviceBuffer) -> Result<()> {
        if out.size() < 8 {
            return Err(Error::invalid("out", "the spin kernel writes 8 bytes"));
        }
        self.launch_raw(cycles, out.ptr(), out.stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::SystemMemoryResource;
    use std::sync::Arc;

    #[test]
    fn host_round_trip_and_resize_keep_bytes() {
        let mr: SharedResource = Arc::new(SystemMemoryResource::new());
        let mut buf = DeviceBuffer::from_host(b"hello rrmm", Stream::DEFAULT, mr).unwrap();
        assert_eq!(buf.to_vec().unwrap(), b"hello rrmm");
        buf.resize(4).unwrap();
        assert_eq!(buf.capacity(), 10);
        assert_eq!(buf.to_vec().unwrap(), b"hell");
        buf.resize(20).unwrap();
        assert_eq!(buf.capacity(), 20);
        assert_eq!(&buf.to_vec().unwrap()[..4], b"hell");
    }
}
