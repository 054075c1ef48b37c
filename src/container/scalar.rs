//! [`DeviceScalar`]: one typed value in device memory.

use super::DeviceUVector;
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

    /// The device address of the value (for kernels).
    pub fn as_ptr(&self) -> usize {
        self.one.as_ptr()
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
}
