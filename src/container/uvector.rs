//! [`DeviceUVector`]: a typed, uninitialised, growable device vector.

use super::device_buffer::DeviceBuffer;
use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::resource::SharedResource;
use bytemuck::Pod;
use std::marker::PhantomData;

/// A vector of `T` in device memory, uninitialised when made (RMM's `device_uvector`):
/// `len` elements, room for `capacity`, stream-ordered on its stream.
pub struct DeviceUVector<T: Pod> {
    buf: DeviceBuffer,
    _element: PhantomData<T>,
}

impl<T: Pod> std::fmt::Debug for DeviceUVector<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceUVector")
            .field("len", &self.len())
            .field("capacity", &self.capacity())
            .field("ptr", &format_args!("{:#x}", self.buf.ptr()))
            .finish()
    }
}

/// Bytes of `n` elements of `T`.
fn bytes_of<T>(n: usize) -> Result<usize> {
    n.checked_mul(std::mem::size_of::<T>().max(1))
        .ok_or_else(|| Error::invalid("len", format!("{n} elements overflow the address space")))
}

impl<T: Pod> DeviceUVector<T> {
    /// `len` uninitialised elements from `mr`, on `stream`.
    ///
    /// # Errors
    /// The resource's errors (out of memory); [`Error::InvalidArgument`] for a size that
    /// overflows.
    pub fn new(len: usize, stream: Stream, mr: SharedResource) -> Result<Self> {
        Ok(DeviceUVector {
            buf: DeviceBuffer::new(bytes_of::<T>(len)?, stream, mr)?,
            _element: PhantomData,
        })
    }

    /// A vector holding a copy of `data`; waits for the copy.
    ///
    /// # Errors
    /// As [`new`](Self::new), and copy errors.
    pub fn from_host(data: &[T], stream: Stream, mr: SharedResource) -> Result<Self> {
        let v = Self::new(data.len(), stream, mr)?;
        v.buf.copy_from_host(bytemuck::cast_slice(data))?;
        Ok(v)
    }

    /// A vector holding a copy of `data`, on `stream`, without waiting for the copy (RMM's
    /// `device_uvector` constructor from host data): the copy is enqueued on `stream`, the
    /// vector's stream, as [`copy_from_host_async`](Self::copy_from_host_async) does.
    ///
    /// # Safety
    /// As [`copy_from_host_async`](Self::copy_from_host_async) with `stream` as the copy's
    /// stream: `data` stays alive and unwritten until the copy has completed on `stream`.
    ///
    /// # Errors
    /// As [`new`](Self::new), and copy errors.
    pub unsafe fn from_host_async(data: &[T], stream: Stream, mr: SharedResource) -> Result<Self> {
        let mut v = Self::new(data.len(), stream, mr)?;
        // SAFETY: the caller's contract, with the vector's own stream as the copy's.
        unsafe { v.copy_from_host_async(data, stream) }?;
        Ok(v)
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.buf.size() / std::mem::size_of::<T>().max(1)
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements it holds room for without reallocating.
    pub fn capacity(&self) -> usize {
        self.buf.capacity() / std::mem::size_of::<T>().max(1)
    }

    /// The device address of element 0 (for kernels and copies the caller orders).
    pub fn as_ptr(&self) -> usize {
        self.buf.ptr()
    }

    /// Its stream.
    pub fn stream(&self) -> Stream {
        self.buf.stream()
    }

    /// The bytes behind it.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buf
    }

    /// Changes the length to `len`, keeping the first `min(len, old len)` elements (new ones
    /// uninitialised); reallocates only past the capacity.
    ///
    /// # Errors
    /// The resource's errors; the vector is unchanged on error.
    pub fn resize(&mut self, len: usize) -> Result<()> {
        self.buf.resize(bytes_of::<T>(len)?)
    }

    /// Makes room for at least `additional` more elements.
    ///
    /// # Errors
    /// As [`resize`](Self::resize).
    pub fn reserve(&mut self, additional: usize) -> Result<()> {
        let want = self
            .len()
            .checked_add(additional)
            .ok_or_else(|| Error::invalid("additional", "the capacity overflows"))?;
        self.buf.reserve(bytes_of::<T>(want)?)
    }

    /// Gives back the room past the length (reallocates when there is any).
    ///
    /// # Errors
    /// As [`resize`](Self::resize).
    pub fn shrink_to_fit(&mut self) -> Result<()> {
        self.buf.shrink_to_fit()
    }

    /// Element `i`, copied to the host (waits).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] past the length; copy errors.
    pub fn element(&self, i: usize) -> Result<T> {
        self.check_index(i)?;
        let mut value = T::zeroed();
        self.buf
            .copy_to_host_at(bytes_of::<T>(i)?, bytemuck::bytes_of_mut(&mut value))?;
        Ok(value)
    }

    /// Sets element `i` to `value` (waits).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] past the length; copy errors.
    pub fn set_element(&mut self, i: usize, value: T) -> Result<()> {
        self.check_index(i)?;
        self.buf
            .copy_from_host_at(bytes_of::<T>(i)?, bytemuck::bytes_of(&value))
    }

    fn check_index(&self, i: usize) -> Result<()> {
        if i >= self.len() {
            return Err(Error::invalid(
                "index",
                format!("{i} is past the end of a vector of {}", self.len()),
            ));
        }
        Ok(())
    }

    /// Copies the first `out.len()` elements into `out` (waits).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `out` is longer than the vector; copy errors.
    pub fn copy_to_host(&self, out: &mut [T]) -> Result<()> {
        self.buf.copy_to_host(bytemuck::cast_slice_mut(out))
    }

    /// Copies `data` into the first `data.len()` elements (waits).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `data` is longer than the vector; copy errors.
    pub fn copy_from_host(&mut self, data: &[T]) -> Result<()> {
        self.buf.copy_from_host(bytemuck::cast_slice(data))
    }

    /// Enqueues a copy of `data` into the first `data.len()` elements on `stream` and returns
    /// without waiting (RMM's `_async` copies on a stream).
    ///
    /// Ordering: the copy runs on `stream` after the work enqueued so far on the vector's
    /// stream, and the vector's stream waits for the copy (device-side event waits; none when
    /// `stream` is the vector's stream), so the vector's later work, reallocation and free
    /// come after it. Only pinned (or registered) host memory makes the copy truly
    /// asynchronous; from pageable memory the driver stages the data or copies synchronously
    /// before returning (CUDA's rules for `cuMemcpyAsync`). Host memory of a host resource
    /// where there is no driver is copied by the CPU before this returns.
    ///
    /// # Safety
    /// 1. `data` stays allocated (not freed or reallocated) and is not written until the copy
    ///    has completed: [`Stream::synchronize`] of `stream` or of the vector's stream (which
    ///    waits for the copy), or a later wait on either.
    /// 2. `stream` is a stream of the current device's context, as the vector's stream is.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `data` is longer than the vector (nothing is enqueued);
    /// [`Error::Logic`] for simulated memory; CUDA errors from the waits or the copy.
    pub unsafe fn copy_from_host_async(&mut self, data: &[T], stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract (1, 2); the range is checked by the buffer.
        unsafe {
            self.buf
                .copy_from_host_async_at(0, bytemuck::cast_slice(data), stream)
        }
    }

    /// Enqueues a copy of the first `out.len()` elements into `out` on `stream` and returns
    /// without waiting. Ordered as [`copy_from_host_async`](Self::copy_from_host_async); into
    /// pageable memory the driver returns only once the copy is done.
    ///
    /// # Safety
    /// 1. `out` stays allocated (not freed or reallocated) and is neither read nor written until
    ///    the copy has completed: [`Stream::synchronize`] of `stream` or of the vector's stream
    ///    (which waits for the copy), or a later wait on either.
    /// 2. `stream` is a stream of the current device's context, as the vector's stream is.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `out` is longer than the vector (nothing is enqueued);
    /// [`Error::Logic`] for simulated memory; CUDA errors from the waits or the copy.
    pub unsafe fn copy_to_host_async(&self, out: &mut [T], stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract (1, 2); the range is checked by the buffer.
        unsafe {
            self.buf
                .copy_to_host_async_at(0, bytemuck::cast_slice_mut(out), stream)
        }
    }

    /// Every element, copied to the host (waits).
    ///
    /// # Errors
    /// Copy errors.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len()];
        self.copy_to_host(&mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptor::StatisticsResourceAdaptor;
    use crate::resource::SystemMemoryResource;
    use proptest::prelude::*;
    use std::sync::Arc;

    fn host() -> SharedResource {
        Arc::new(SystemMemoryResource::new())
    }

    /// Issue 31: on simulated memory the copying calls failed with a message that did not say
    /// what to use instead; it names the resource that keeps the bytes, and the same calls work
    /// on a pool over it without a GPU.
    #[test]
    fn simulated_memory_names_the_resource_that_keeps_bytes() {
        use crate::resource::SimulatedMemoryResource;
        use crate::suballocator::PoolMemoryResource;
        let simulated: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 30));
        let err = DeviceUVector::<u32>::from_host(&[1, 2, 3], Stream::DEFAULT, simulated.clone())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("SimulatedMemoryResource::with_backing"),
            "{err}"
        );
        let mut v = DeviceUVector::<u32>::new(3, Stream::DEFAULT, simulated).unwrap();
        assert!(v.set_element(0, 1).is_err());
        let pool: SharedResource =
            Arc::new(PoolMemoryResource::new(host(), Some(1 << 20), None).unwrap());
        let mut v = DeviceUVector::<u32>::from_host(&[1, 2, 3], Stream::DEFAULT, pool).unwrap();
        v.set_element(0, 7).unwrap();
        v.resize(5).unwrap();
        assert_eq!(&v.to_vec().unwrap()[..3], &[7, 2, 3]);
    }

    /// Issue 31: a simulated device that keeps the bytes (`with_backing`): every container call
    /// works on it, directly and through a pool, with the device's capacity and checked frees.
    #[test]
    fn containers_work_on_a_simulated_device_that_keeps_bytes() {
        use crate::resource::{MemoryKind, MemoryResource, SimulatedMemoryResource};
        use crate::suballocator::PoolMemoryResource;
        let device = Arc::new(SimulatedMemoryResource::with_backing(64 << 20).unwrap());
        assert!(device.keeps_bytes() && device.kind() == MemoryKind::Host);
        let shared: SharedResource = device.clone();
        let mut v = DeviceUVector::<u64>::from_host(&[5, 6, 7], Stream::DEFAULT, shared).unwrap();
        v.set_element(2, 70).unwrap();
        v.resize(1000).unwrap();
        assert_eq!(&v.to_vec().unwrap()[..3], &[5, 6, 70]);
        assert_eq!(v.element(1).unwrap(), 6);
        // The capacity is the device's: 64 MiB do not fit beside what is live.
        assert!(DeviceUVector::<u8>::new(64 << 20, Stream::DEFAULT, device.clone()).is_err());
        let pool: SharedResource = Arc::new(
            PoolMemoryResource::new(device.clone(), Some(8 << 20), Some(32 << 20)).unwrap(),
        );
        let rows: Vec<u32> = (0..100_000).collect();
        let w = DeviceUVector::<u32>::from_host(&rows, Stream::DEFAULT, pool.clone()).unwrap();
        assert_eq!(w.to_vec().unwrap(), rows);
        drop((v, w));
        assert!(DeviceUVector::<u8>::new(33 << 20, Stream::DEFAULT, pool).is_err());
    }

    #[test]
    fn elements_round_trip_and_bounds_are_checked() {
        let mut v = DeviceUVector::<u32>::from_host(&[1, 2, 3], Stream::DEFAULT, host()).unwrap();
        assert_eq!((v.len(), v.to_vec().unwrap()), (3, vec![1, 2, 3]));
        v.set_element(1, 20).unwrap();
        assert_eq!(v.element(1).unwrap(), 20);
        assert!(v.element(3).is_err() && v.set_element(3, 0).is_err());
        let mut out = [0u32; 4];
        assert!(v.copy_to_host(&mut out).is_err(), "longer than the vector");
        let empty = DeviceUVector::<f64>::new(0, Stream::DEFAULT, host()).unwrap();
        assert!(empty.is_empty() && empty.to_vec().unwrap().is_empty());
        assert!(DeviceUVector::<u64>::new(usize::MAX / 4, Stream::DEFAULT, host()).is_err());
    }

    #[test]
    fn async_copies_round_trip_on_the_vector_stream_and_another() {
        let data: Vec<u32> = (0..1000).collect();
        let twice: Vec<u32> = data.iter().map(|x| x * 2).collect();
        for stream in [Stream::DEFAULT, Stream::PER_THREAD] {
            // SAFETY: `data` outlives the copy (the vector's own copies below wait for it) and
            // is never written.
            let mut v =
                unsafe { DeviceUVector::from_host_async(&data, Stream::DEFAULT, host()) }.unwrap();
            let mut out = vec![0u32; 1000];
            // SAFETY: `out` is read only after the wait on `stream`.
            unsafe { v.copy_to_host_async(&mut out, stream) }.unwrap();
            super::super::wait_for_copies(stream);
            assert_eq!(out, data);
            // SAFETY: `twice` outlives the test; `to_vec` waits for the vector's stream, which
            // waits for the copy.
            unsafe { v.copy_from_host_async(&twice[..10], stream) }.unwrap();
            let back = v.to_vec().unwrap();
            assert_eq!((&back[..10], &back[10..]), (&twice[..10], &data[10..]));
            let mut short = [0u32; 3];
            // SAFETY: as above.
            unsafe { v.copy_to_host_async(&mut short, stream) }.unwrap();
            super::super::wait_for_copies(stream);
            assert_eq!(short, [0, 2, 4]);
        }
    }

    #[test]
    fn async_copies_check_lengths_and_refuse_simulated_memory() {
        let mut v = DeviceUVector::<u64>::from_host(&[1, 2], Stream::DEFAULT, host()).unwrap();
        let mut out = [0u64; 3];
        // SAFETY: refused before anything is enqueued (the error is the point).
        let longer = unsafe { v.copy_to_host_async(&mut out, Stream::DEFAULT) };
        assert!(
            matches!(longer, Err(Error::InvalidArgument { .. })),
            "{longer:?}"
        );
        // SAFETY: as above.
        let longer = unsafe { v.copy_from_host_async(&out, Stream::DEFAULT) };
        assert!(
            matches!(longer, Err(Error::InvalidArgument { .. })),
            "{longer:?}"
        );
        assert_eq!(v.to_vec().unwrap(), [1, 2], "nothing was copied");

        let simulated: SharedResource =
            Arc::new(crate::resource::SimulatedMemoryResource::new(1 << 20));
        let mut s = DeviceUVector::<u64>::new(2, Stream::DEFAULT, simulated).unwrap();
        // SAFETY: refused before anything is enqueued.
        let copy = unsafe { s.copy_from_host_async(&out[..2], Stream::DEFAULT) };
        assert!(matches!(copy, Err(Error::Logic(_))), "{copy:?}");
        // SAFETY: as above.
        let copy = unsafe { s.copy_to_host_async(&mut out[..2], Stream::DEFAULT) };
        assert!(matches!(copy, Err(Error::Logic(_))), "{copy:?}");
        // SAFETY: as above.
        let made = unsafe {
            DeviceUVector::from_host_async(&[1u8], Stream::DEFAULT, s.buffer().resource().clone())
        };
        assert!(matches!(made, Err(Error::Logic(_))), "{made:?}");
    }

    #[test]
    fn drop_frees_once() {
        let stats = Arc::new(StatisticsResourceAdaptor::new(host()));
        let mr: SharedResource = stats.clone();
        let mut v = DeviceUVector::<u16>::from_host(&[7; 100], Stream::DEFAULT, mr).unwrap();
        v.resize(1000).unwrap();
        v.shrink_to_fit().unwrap();
        assert_eq!(stats.allocation_counts().current_bytes, 2000);
        drop(v);
        assert_eq!(stats.allocation_counts().current_bytes, 0);
    }

    proptest! {
        /// Against a `Vec` model: resize keeps the common prefix, reserve and shrink keep
        /// everything, element writes land where they should.
        #[test]
        fn behaves_like_a_vec(ops in prop::collection::vec((0u8..4, 0usize..64, any::<i32>()), 1..40)) {
            let mut model: Vec<i32> = vec![];
            let mut v = DeviceUVector::<i32>::new(0, Stream::DEFAULT, host()).unwrap();
            for (op, n, value) in ops {
                match op {
                    0 => {
                        let old = model.len();
                        v.resize(n).unwrap();
                        model.resize(n, 0);
                        // New elements are uninitialised: give them the model's values.
                        for i in old..n {
                            v.set_element(i, 0).unwrap();
                        }
                    }
                    1 => { v.reserve(n).unwrap(); prop_assert!(v.capacity() >= model.len() + n); }
                    2 => { v.shrink_to_fit().unwrap(); prop_assert_eq!(v.capacity(), model.len()); }
                    _ => if !model.is_empty() {
                        let i = n % model.len();
                        v.set_element(i, value).unwrap();
                        model[i] = value;
                    },
                }
                prop_assert_eq!(v.to_vec().unwrap(), model.clone());
            }
        }
    }
}
