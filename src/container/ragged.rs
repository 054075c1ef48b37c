//! [`DeviceRagged`]: vectors of different lengths in one device allocation, with offsets.

use super::DeviceUVector;
use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::resource::SharedResource;
use bytemuck::Pod;

/// A vector of vectors of `T` (rows of any length) in one device allocation: the values of
/// every row back to back, and on the host the offset where each row starts (CSR's layout).
/// Kernels get [`values_ptr`](Self::values_ptr) and the row offsets
/// ([`offsets_ptr`](Self::offsets_ptr), `rows + 1` `u64`s on the device too).
#[derive(Debug)]
pub struct DeviceRagged<T: Pod> {
    values: DeviceUVector<T>,
    offsets_device: DeviceUVector<u64>,
    offsets: Vec<usize>,
}

impl<T: Pod> DeviceRagged<T> {
    /// The rows of `rows`, copied to the device (waits).
    ///
    /// # Errors
    /// The resource's errors; copy errors.
    pub fn from_host(rows: &[Vec<T>], stream: Stream, mr: SharedResource) -> Result<Self> {
        let mut offsets = Vec::with_capacity(rows.len() + 1);
        offsets.push(0usize);
        let mut flat: Vec<T> = Vec::new();
        for row in rows {
            flat.extend_from_slice(row);
            offsets.push(flat.len());
        }
        let as_u64: Vec<u64> = offsets.iter().map(|&o| o as u64).collect();
        Ok(DeviceRagged {
            values: DeviceUVector::from_host(&flat, stream, mr.clone())?,
            offsets_device: DeviceUVector::from_host(&as_u64, stream, mr)?,
            offsets,
        })
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Values in every row together.
    pub fn total_len(&self) -> usize {
        self.values.len()
    }

    /// Row `i`, copied to the host (waits).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] past the last row; copy errors.
    pub fn row(&self, i: usize) -> Result<Vec<T>> {
        if i >= self.rows() {
            return Err(Error::invalid(
                "row",
                format!("{i} is past the last of {} rows", self.rows()),
            ));
        }
        let (start, end) = (self.offsets[i], self.offsets[i + 1]);
        let mut out = vec![T::zeroed(); end - start];
        let size = std::mem::size_of::<T>();
        self.values
            .buffer()
            .copy_to_host_at(start * size, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }

    /// Every row, copied to the host (waits).
    ///
    /// # Errors
    /// Copy errors.
    pub fn to_host(&self) -> Result<Vec<Vec<T>>> {
        let flat = self.values.to_vec()?;
        Ok(self
            .offsets
            .windows(2)
            .map(|w| flat[w[0]..w[1]].to_vec())
            .collect())
    }

    /// The device address of the values.
    pub fn values_ptr(&self) -> usize {
        self.values.as_ptr()
    }

    /// The device address of the `rows + 1` row offsets (`u64`).
    pub fn offsets_ptr(&self) -> usize {
        self.offsets_device.as_ptr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::SystemMemoryResource;
    use proptest::prelude::*;
    use std::sync::Arc;

    proptest! {
        #[test]
        fn rows_round_trip(rows in prop::collection::vec(prop::collection::vec(any::<u16>(), 0..20), 0..12)) {
            let mr: SharedResource = Arc::new(SystemMemoryResource::new());
            let r = DeviceRagged::from_host(&rows, Stream::DEFAULT, mr).unwrap();
            prop_assert_eq!(r.rows(), rows.len());
            prop_assert_eq!(r.to_host().unwrap(), rows.clone());
            for (i, row) in rows.iter().enumerate() {
                prop_assert_eq!(&r.row(i).unwrap(), row);
            }
            prop_assert!(r.row(rows.len()).is_err());
        }
    }
}
