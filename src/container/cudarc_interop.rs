//! cudarc interop: rrmm containers as cudarc device slices (kernel arguments and copy
//! endpoints of `cudarc::driver::CudaStream`), and cudarc streams as rrmm streams.
//!
//! cudarc's `DeviceSlice` names the cudarc stream a slice belongs to, which an rrmm container
//! (made on an rrmm [`Stream`]) does not have; [`DeviceUVector::on_cudarc`] makes a view that
//! carries one. Ordering: the view's cudarc stream waits for the container's stream when the
//! view is made (one `cuStreamSynchronize` of the container's stream when the two differ; none
//! when they are the same stream), and a cudarc operation on another stream synchronizes that
//! stream when it ends (cudarc's `SyncOnDrop::Sync`), so rrmm never reuses memory that cudarc
//! work still reads. Contexts: cudarc's `CudaContext::new(ordinal)` and rrmm both use the
//! device's primary context, so the two share it rather than making a second one.

use super::DeviceUVector;
use crate::cuda::Stream;
use crate::error::Result;
use bytemuck::Pod;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};
use std::sync::Arc;

/// The rrmm [`Stream`] of a cudarc stream (its handle).
///
/// # Safety
/// 1. The returned [`Stream`] is used only while `stream` (cudarc's) is alive.
pub unsafe fn stream_of(stream: &CudaStream) -> Stream {
    // SAFETY: the caller keeps the cudarc stream alive while the handle is used (1).
    unsafe { Stream::from_raw(stream.cu_stream() as usize) }
}

/// A view of a [`DeviceUVector`] as a cudarc device slice on a cudarc stream.
#[derive(Debug)]
pub struct CudarcView<'a, T: Pod> {
    vector: &'a DeviceUVector<T>,
    stream: Arc<CudaStream>,
}

/// A writable view of a [`DeviceUVector`] as a cudarc device slice on a cudarc stream.
#[derive(Debug)]
pub struct CudarcViewMut<'a, T: Pod> {
    vector: &'a mut DeviceUVector<T>,
    stream: Arc<CudaStream>,
}

fn same_stream(vector_stream: Stream, stream: &CudaStream) -> bool {
    vector_stream.raw() == stream.cu_stream() as usize
}

/// Makes `stream` follow the work queued on `vector_stream` (see the module docs).
fn order_after(vector_stream: Stream, stream: &CudaStream) -> Result<()> {
    if !same_stream(vector_stream, stream) {
        vector_stream.synchronize()?;
    }
    Ok(())
}

fn sync_on_drop<'a>(vector_stream: Stream, stream: &'a CudaStream) -> SyncOnDrop<'a> {
    if same_stream(vector_stream, stream) {
        SyncOnDrop::Sync(None)
    } else {
        SyncOnDrop::Sync(Some(stream))
    }
}

impl<T: Pod> DeviceUVector<T> {
    /// This vector as a cudarc slice on `stream` (kernel argument, copy source).
    ///
    /// # Errors
    /// The synchronization of the vector's stream, when it is not `stream`.
    pub fn on_cudarc(&self, stream: &Arc<CudaStream>) -> Result<CudarcView<'_, T>> {
        order_after(self.stream(), stream)?;
        Ok(CudarcView {
            vector: self,
            stream: stream.clone(),
        })
    }

    /// This vector as a writable cudarc slice on `stream` (kernel output, copy destination).
    ///
    /// # Errors
    /// As [`on_cudarc`](Self::on_cudarc).
    pub fn on_cudarc_mut(&mut self, stream: &Arc<CudaStream>) -> Result<CudarcViewMut<'_, T>> {
        order_after(self.stream(), stream)?;
        Ok(CudarcViewMut {
            vector: self,
            stream: stream.clone(),
        })
    }
}

/// `DeviceSlice` and `DevicePtr` of a view type (both views read the same way).
macro_rules! readable_view {
    ($view:ident) => {
        impl<T: Pod> DeviceSlice<T> for $view<'_, T> {
            fn len(&self) -> usize {
                self.vector.len()
            }

            fn stream(&self) -> &Arc<CudaStream> {
                &self.stream
            }
        }

        impl<T: Pod> DevicePtr<T> for $view<'_, T> {
            fn device_ptr<'b>(
                &'b self,
                stream: &'b CudaStream,
            ) -> (cudarc::driver::sys::CUdeviceptr, SyncOnDrop<'b>) {
                (
                    self.vector.as_ptr() as cudarc::driver::sys::CUdeviceptr,
                    sync_on_drop(self.vector.stream(), stream),
                )
            }
        }
    };
}

readable_view!(CudarcView);
readable_view!(CudarcViewMut);

impl<T: Pod> DevicePtrMut<T> for CudarcViewMut<'_, T> {
    fn device_ptr_mut<'b>(
        &'b mut self,
        stream: &'b CudaStream,
    ) -> (cudarc::driver::sys::CUdeviceptr, SyncOnDrop<'b>) {
        (
            self.vector.as_ptr() as cudarc::driver::sys::CUdeviceptr,
            sync_on_drop(self.vector.stream(), stream),
        )
    }
}
