//! [`DeviceUVector`]: a typed, uninitialised, growable device vector.

use crate::cuda::Stream;
use crate::device_buffer::DeviceBuffer;
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
