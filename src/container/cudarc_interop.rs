//! cudarc interop: rrmm containers as cudarc device slices (copy endpoints of
//! `cudarc::driver::CudaStream`) and as kernel arguments (`LaunchArgs::arg`), and cudarc
//! streams as rrmm streams.
//!
//! # Views
//! cudarc's `DeviceSlice` names the cudarc stream a slice belongs to, which an rrmm container
//! (made on an rrmm [`Stream`]) does not have; [`DeviceUVector::on_cudarc`] makes a view that
//! carries one. Ordering, when the view's cudarc stream is not the container's stream (nothing
//! is done when it is):
//! 1. when the view is made, the host waits for the container's stream (one
//!    `cuStreamSynchronize`), so any cudarc stream sees the container's earlier work done;
//! 2. a cudarc copy on another stream than the container's synchronizes that stream when it
//!    ends (cudarc's `SyncOnDrop::Sync`);
//! 3. when the view drops, the container's stream waits (on the device, an event) for the work
//!    enqueued on the view's stream, kernels launched with the view included, so the container's
//!    later work, its reallocation and its free come after them; should the event fail, the
//!    host waits for the view's stream instead.
//!
//! Simulated memory is refused: it has nothing behind it.
//!
//! # Kernel arguments
//! `LaunchArgs::arg` (cudarc's `PushKernelArg`) takes `&CudarcView`, `&CudarcViewMut` and
//! `&mut CudarcViewMut`, ordered as above when the kernel runs on the view's stream; and
//! `&DeviceUVector`, `&mut DeviceUVector`, `&DeviceScalar` and `&mut DeviceScalar` directly,
//! which pass the device address and order nothing (`PushKernelArg` does not see the launch
//! stream). With a container passed directly, the kernel must run on the container's stream
//! (make the container on [`stream_of`] the cudarc stream) or the caller orders the two streams
//! both ways (the launch stream after the container's stream before the launch, the container's
//! stream after the kernel before the container is used, resized or dropped): a part of
//! `LaunchArgs::launch`'s own `unsafe` contract. Each argument is a pointer to the container's
//! address (a `CUdeviceptr`, 8 bytes), which lives in the container (or the view) borrowed for
//! as long as the launch arguments, so the borrow also keeps the container from being resized
//! or freed until the launch is enqueued. The kernel may write through any of them (as with
//! cudarc's own slices, mutability is the launch's contract); pass `&mut` where it does.
//!
//! # Contexts
//! cudarc's `CudaContext::new(ordinal)` and rrmm both use the device's primary context, so the
//! two share it rather than making a second one.

use super::scalar::DeviceScalar;
use super::uvector::DeviceUVector;
use crate::cuda::{ContextGuard, Stream};
use crate::error::{Error, Result};
use crate::resource::MemoryKind;
use bytemuck::Pod;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{
    CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, LaunchArgs, PushKernelArg, SyncOnDrop,
};
use std::sync::Arc;

// A container's `usize` address is passed where a kernel takes a pointer (`CUdeviceptr`).
const _: () = assert!(std::mem::size_of::<usize>() == std::mem::size_of::<CUdeviceptr>());

/// The rrmm [`Stream`] of a cudarc stream (its handle).
///
/// # Safety
/// 1. The returned [`Stream`] is used only while `stream` (cudarc's) is alive.
pub unsafe fn stream_of(stream: &CudaStream) -> Stream {
    // SAFETY: the caller keeps the cudarc stream alive while the handle is used (1).
    unsafe { Stream::from_raw(stream.cu_stream() as usize) }
}

/// A view of a [`DeviceUVector`] as a cudarc device slice on a cudarc stream (a copy source and
/// a kernel argument; see the module docs for its ordering).
#[derive(Debug)]
pub struct CudarcView<'a, T: Pod> {
    vector: &'a DeviceUVector<T>,
    link: Link,
}

/// A writable view of a [`DeviceUVector`] as a cudarc device slice on a cudarc stream (a copy
/// source and destination and a kernel argument; see the module docs for its ordering).
#[derive(Debug)]
pub struct CudarcViewMut<'a, T: Pod> {
    vector: &'a mut DeviceUVector<T>,
    link: Link,
}

/// The cudarc stream of a view, joined to the container's stream when made and when dropped.
#[derive(Debug)]
struct Link {
    stream: Arc<CudaStream>,
    /// The container's stream.
    own: Stream,
    /// The container's address, where a kernel argument points.
    ptr: CUdeviceptr,
}

fn cudarc_stream(stream: &CudaStream) -> Stream {
    // SAFETY: the handle is used only while the cudarc stream is (the link holds an `Arc` to
    // it, and the callers hold a reference).
    unsafe { stream_of(stream) }
}

impl Link {
    /// Orders `stream` after the work queued on the container's stream `own` (module docs, 1).
    fn new<T: Pod>(vector: &DeviceUVector<T>, stream: &Arc<CudaStream>) -> Result<Self> {
        if vector.buffer().resource().kind() == MemoryKind::Simulated {
            return Err(Error::Logic(
                "simulated memory has nothing behind it and cannot be used by cudarc".into(),
            ));
        }
        let own = vector.stream();
        if !own.same_as(cudarc_stream(stream)) {
            own.synchronize()?;
        }
        Ok(Link {
            stream: stream.clone(),
            own,
            ptr: vector.as_ptr() as CUdeviceptr,
        })
    }

    /// What a cudarc copy on `other` waits for when it ends (module docs, 2).
    fn sync_on_drop<'b>(&self, other: &'b CudaStream) -> SyncOnDrop<'b> {
        if self.own.same_as(cudarc_stream(other)) {
            SyncOnDrop::Sync(None)
        } else {
            SyncOnDrop::Sync(Some(other))
        }
    }
}

impl Drop for Link {
    /// Orders the container's stream after the view's stream (module docs, 3).
    fn drop(&mut self) {
        let stream = cudarc_stream(&self.stream);
        if self.own.same_as(stream) {
            return;
        }
        let joined = ContextGuard::new(self.stream.context().ordinal())
            .and_then(|_ctx| self.own.wait_for(stream));
        if joined.is_err() {
            // Drop cannot report; waiting on the host orders the container's later work too.
            let _ = self.stream.synchronize();
        }
    }
}

impl<T: Pod> DeviceUVector<T> {
    /// This vector as a cudarc slice on `stream` (kernel argument, copy source); see the module
    /// docs of `cudarc_interop` for the ordering.
    ///
    /// # Errors
    /// [`Error::Logic`] for simulated memory; the synchronization of the vector's stream, when
    /// it is not `stream`.
    pub fn on_cudarc(&self, stream: &Arc<CudaStream>) -> Result<CudarcView<'_, T>> {
        Ok(CudarcView {
            link: Link::new(self, stream)?,
            vector: self,
        })
    }

    /// This vector as a writable cudarc slice on `stream` (kernel output, copy destination).
    ///
    /// # Errors
    /// As [`on_cudarc`](Self::on_cudarc).
    pub fn on_cudarc_mut(&mut self, stream: &Arc<CudaStream>) -> Result<CudarcViewMut<'_, T>> {
        Ok(CudarcViewMut {
            link: Link::new(self, stream)?,
            vector: self,
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
                &self.link.stream
            }
        }

        impl<T: Pod> DevicePtr<T> for $view<'_, T> {
            fn device_ptr<'b>(&'b self, stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
                (self.link.ptr, self.link.sync_on_drop(stream))
            }
        }

        // SAFETY: pushes cudarc's own argument for `&'b u64`, a pointer to the view's copy of
        // the vector's address (a `CUdeviceptr`), which lives in the view borrowed for `'b`,
        // longer than the launch arguments (`'b: 'a`); the view borrows the vector, so the
        // address stays that of live memory until the view drops, and the view's drop orders
        // the vector's stream after the kernel when it runs on the view's stream.
        unsafe impl<'a, 'b: 'a, 'c: 'b, T: Pod> PushKernelArg<&'b $view<'c, T>> for LaunchArgs<'a> {
            #[inline(always)]
            fn arg(&mut self, arg: &'b $view<'c, T>) -> &mut Self {
                <Self as PushKernelArg<&'b CUdeviceptr>>::arg(self, &arg.link.ptr)
            }
        }
    };
}

readable_view!(CudarcView);
readable_view!(CudarcViewMut);

impl<T: Pod> DevicePtrMut<T> for CudarcViewMut<'_, T> {
    fn device_ptr_mut<'b>(&'b mut self, stream: &'b CudaStream) -> (CUdeviceptr, SyncOnDrop<'b>) {
        (self.link.ptr, self.link.sync_on_drop(stream))
    }
}

// SAFETY: as the readable views' impl: a pointer to the address in the view, borrowed for `'b`.
unsafe impl<'a, 'b: 'a, 'c: 'b, T: Pod> PushKernelArg<&'b mut CudarcViewMut<'c, T>>
    for LaunchArgs<'a>
{
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut CudarcViewMut<'c, T>) -> &mut Self {
        let arg: &'b CudarcViewMut<'c, T> = arg;
        <Self as PushKernelArg<&'b CUdeviceptr>>::arg(self, &arg.link.ptr)
    }
}

// SAFETY: pushes cudarc's own argument for `&'b usize`, a pointer to the vector's address
// (a `usize` the size of a `CUdeviceptr`, asserted above) held in the vector's buffer, which is
// borrowed for `'b`, longer than the launch arguments (`'b: 'a`), so it can be neither resized
// nor freed meanwhile. Stream ordering is the launch's contract (module docs).
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b DeviceUVector<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceUVector<T>) -> &mut Self {
        <Self as PushKernelArg<&'b usize>>::arg(self, arg.buffer().ptr_ref())
    }
}

// SAFETY: as for `&DeviceUVector`; the `&mut` borrow is held for `'b` as a shared one.
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b mut DeviceUVector<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut DeviceUVector<T>) -> &mut Self {
        let arg: &'b DeviceUVector<T> = arg;
        <Self as PushKernelArg<&'b DeviceUVector<T>>>::arg(self, arg)
    }
}

// SAFETY: as for `&DeviceUVector`, of the scalar's one-element vector.
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b DeviceScalar<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceScalar<T>) -> &mut Self {
        <Self as PushKernelArg<&'b DeviceUVector<T>>>::arg(self, arg.as_vector())
    }
}

// SAFETY: as for `&DeviceUVector`, of the scalar's one-element vector.
unsafe impl<'a, 'b: 'a, T: Pod> PushKernelArg<&'b mut DeviceScalar<T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut DeviceScalar<T>) -> &mut Self {
        let arg: &'b DeviceScalar<T> = arg;
        <Self as PushKernelArg<&'b DeviceUVector<T>>>::arg(self, arg.as_vector())
    }
}
