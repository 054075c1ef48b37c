//! [`DeviceRagged`]: vectors of different lengths in one device allocation, with offsets.

use super::uvector::DeviceUVector;
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

    /// Its stream (that of the values and the device offsets).
    pub fn stream(&self) -> Stream {
        self.values.stream()
    }

    /// The values of every row, back to back (a kernel argument: `&T` on the device).
    pub fn values(&self) -> &DeviceUVector<T> {
        &self.values
    }

    /// The `rows + 1` row offsets on the device (a kernel argument: `&u64` on the device).
    pub fn device_offsets(&self) -> &DeviceUVector<u64> {
        &self.offsets_device
    }

    /// The `rows + 1` row offsets on the host: row `i` is values `offsets[i] .. offsets[i + 1]`.
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// The range of values of row `i`.
    fn row_range(&self, i: usize) -> Result<(usize, usize)> {
        if i >= self.rows() {
            return Err(Error::invalid(
                "row",
                format!("{i} is past the last of {} rows", self.rows()),
            ));
        }
        Ok((self.offsets[i], self.offsets[i + 1]))
    }

    /// Row `i`, copied to the host (waits).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] past the last row; copy errors.
    pub fn row(&self, i: usize) -> Result<Vec<T>> {
        let (start, end) = self.row_range(i)?;
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

    /// Enqueues a copy of the first `out.len()` values (the rows back to back, see
    /// [`offsets`](Self::offsets)) into `out` on `stream` and returns without waiting, ordered
    /// as [`DeviceUVector::copy_to_host_async`]: after the container's stream, which then waits
    /// for the copy.
    ///
    /// # Safety
    /// 1. `out` stays allocated (not freed or reallocated) and is neither read nor written until
    ///    the copy has completed on `stream` (or on the container's stream, which waits for it).
    /// 2. `stream` is a stream of the current device's context, as the container's stream is.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `out` is longer than the values; as
    /// [`DeviceUVector::copy_to_host_async`].
    pub unsafe fn copy_to_host_async(&self, out: &mut [T], stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract (1, 2).
        unsafe { self.values.copy_to_host_async(out, stream) }
    }

    /// Enqueues a copy of the first `out.len()` values of row `i` into `out` on `stream` and
    /// returns without waiting, ordered as [`copy_to_host_async`](Self::copy_to_host_async).
    ///
    /// # Safety
    /// As [`copy_to_host_async`](Self::copy_to_host_async).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] past the last row or when `out` is longer than the row; as
    /// [`DeviceUVector::copy_to_host_async`].
    pub unsafe fn copy_row_to_host_async(
        &self,
        i: usize,
        out: &mut [T],
        stream: Stream,
    ) -> Result<()> {
        let (start, end) = self.row_range(i)?;
        if out.len() > end - start {
            return Err(Error::invalid(
                "out",
                format!(
                    "{} values asked of row {i}, which has {}",
                    out.len(),
                    end - start
                ),
            ));
        }
        let size = std::mem::size_of::<T>();
        // SAFETY: the caller's contract (1, 2); the range lies inside row `i` (checked).
        unsafe {
            self.values.buffer().copy_to_host_async_at(
                start * size,
                bytemuck::cast_slice_mut(out),
                stream,
            )
        }
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

    #[test]
    fn async_copies_of_values_and_rows() {
        let mr: SharedResource = Arc::new(SystemMemoryResource::new());
        let rows = vec![vec![1i16, 2, 3], vec![], vec![4, 5]];
        let r = DeviceRagged::from_host(&rows, Stream::DEFAULT, mr).unwrap();
        assert_eq!(r.offsets(), [0, 3, 3, 5]);
        assert_eq!((r.values().len(), r.device_offsets().len()), (5, 4));
        assert_eq!(r.device_offsets().to_vec().unwrap(), [0, 3, 3, 5]);
        assert_eq!(r.stream(), Stream::DEFAULT);
        let stream = Stream::PER_THREAD;
        let (mut flat, mut row, mut part) = ([0i16; 5], [0i16; 2], [0i16; 2]);
        // SAFETY: the slices are read only after the wait on `stream`.
        unsafe {
            r.copy_to_host_async(&mut flat, stream).unwrap();
            r.copy_row_to_host_async(2, &mut row, stream).unwrap();
            r.copy_row_to_host_async(0, &mut part, stream).unwrap();
        }
        super::super::wait_for_copies(stream);
        assert_eq!((flat, row, part), ([1, 2, 3, 4, 5], [4, 5], [1, 2]));
        let mut three = [0i16; 3];
        // SAFETY: refused before anything is enqueued (the errors are the point).
        unsafe {
            assert!(
                r.copy_row_to_host_async(2, &mut three, stream).is_err(),
                "longer than the row"
            );
            assert!(
                r.copy_row_to_host_async(3, &mut [], stream).is_err(),
                "past the last row"
            );
            assert!(
                r.copy_to_host_async(&mut [0; 6], stream).is_err(),
                "longer than the values"
            );
        }
    }
}
