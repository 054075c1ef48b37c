//! [`DeviceScalar`]: one typed value in device memory.

use super::uvector::DeviceUVector;
use crate::cuda::Stream;
use crate::error::Result;
use crate::resource::SharedResource;
use bytemuck::Pod;

/// One `T` in device memory (RMM's `device_scalar`), read and written from the host.
#[derive(Debug)]
pub struct DeviceScalar<T: Pod> {
    one: DeviceUVector<T>,
}

impl<T: Pod> DeviceScalar<T> {
    /// A scalar holding `value`, from `mr` on `stream` (waits for the copy).
    ///
    /// # Errors
    /// The resource's errors; copy errors.
    pub fn new(value: T, stream: Stream, mr: SharedResource) -> Result<Self> {
        Ok(DeviceScalar {
            one: DeviceUVector::from_host(std::slice::from_ref(&value), stream, mr)?,
        })
    }

    /// The value, copied to the host (waits).
    ///
    /// # Errors
    /// Copy errors.
    pub fn value(&self) -> Result<T> {
        self.one.element(0)
    }

    /// Sets the value (waits).
    ///
    /// # Errors
    /// Copy errors.
    pub fn set_value(&mut self, value: T) -> Result<()> {
        self.one.set_element(0, value)
    }

    /// Enqueues a copy of `value` into the scalar on `stream` and returns without waiting
    /// (RMM's `set_value_async`), ordered as [`DeviceUVector::copy_from_host_async`]: after the
    /// scalar's stream, which then waits for the copy.
    ///
    /// # Safety
    /// 1. `value` stays allocated (not freed or reallocated) and is not written until the copy
    ///    has completed on `stream` (or on the scalar's stream, which waits for it).
    /// 2. `stream` is a stream of the current device's context, as the scalar's stream is.
    ///
    /// # Errors
    /// [`Error::Logic`](crate::Error::Logic) for simulated memory; CUDA errors from the waits
    /// or the copy.
    pub unsafe fn copy_from_host_async(&mut self, value: &T, stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract (1, 2).
        unsafe {
            self.one
                .copy_from_host_async(std::slice::from_ref(value), stream)
        }
    }

    /// Enqueues a copy of the value into `out` on `stream` and returns without waiting, ordered
    /// as [`DeviceUVector::copy_to_host_async`].
    ///
    /// # Safety
    /// 1. `out` stays allocated (not freed or reallocated) and is neither read nor written until
    ///    the copy has completed on `stream` (or on the scalar's stream, which waits for it).
    /// 2. `stream` is a stream of the current device's context, as the scalar's stream is.
    ///
    /// # Errors
    /// As [`copy_from_host_async`](Self::copy_from_host_async).
    pub unsafe fn copy_to_host_async(&self, out: &mut T, stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract (1, 2).
        unsafe {
            self.one
                .copy_to_host_async(std::slice::from_mut(out), stream)
        }
    }

    /// The device address of the value (for kernels).
    pub fn as_ptr(&self) -> usize {
        self.one.as_ptr()
    }

    /// Its stream.
    pub fn stream(&self) -> Stream {
        self.one.stream()
    }

    /// The one-element vector behind it (kernel arguments, cudarc views).
    pub fn as_vector(&self) -> &DeviceUVector<T> {
        &self.one
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::SystemMemoryResource;
    use std::sync::Arc;

    #[test]
    fn value_round_trips() {
        let mr: SharedResource = Arc::new(SystemMemoryResource::new());
        let mut s = DeviceScalar::new(41u64, Stream::DEFAULT, mr).unwrap();
        assert_eq!(s.value().unwrap(), 41);
        s.set_value(42).unwrap();
        assert_eq!(s.value().unwrap(), 42);
    }

    #[test]
    fn async_value_round_trips() {
        let mr: SharedResource = Arc::new(SystemMemoryResource::new());
        let mut s = DeviceScalar::new(1.5f64, Stream::DEFAULT, mr).unwrap();
        let (value, mut out) = (-2.25f64, 0.0f64);
        // SAFETY: `value` outlives the copy (`value()` below waits for the scalar's stream,
        // which waits for the copy) and is never written.
        unsafe { s.copy_from_host_async(&value, Stream::PER_THREAD) }.unwrap();
        assert_eq!(s.value().unwrap(), -2.25);
        // SAFETY: `out` is read only after the wait.
        unsafe { s.copy_to_host_async(&mut out, Stream::PER_THREAD) }.unwrap();
        super::super::wait_for_copies(Stream::PER_THREAD);
        assert_eq!(out, -2.25);
        assert_eq!(s.stream(), Stream::DEFAULT);
        assert_eq!(s.as_vector().len(), 1);
    }
}
