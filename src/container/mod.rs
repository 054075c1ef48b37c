//! Typed, stream-ordered containers over any [`MemoryResource`](crate::MemoryResource), as RMM's
//! `device_uvector` and `device_scalar`, with host copies both ways (which RMM's lack), a
//! ragged container (vectors of vectors in one allocation), and the untyped allocation they
//! are built on, [`DeviceBuffer`] (RMM's `device_buffer`).
//!
//! Element types are [`bytemuck::Pod`]: any bit pattern is a valid value, so an uninitialised
//! element read back is some value, never undefined behaviour, and elements cross to and from
//! the device as plain bytes.
//!
//! # Ownership and threads
//! A container owns its allocation (a [`DeviceBuffer`]) and frees it on
//! drop, on its stream. It is `Send` and `Sync` (it holds an address, not a reference into
//! host memory; the resource is thread-safe). Methods that change the contents or the size take
//! `&mut self`, so no two changes race through safe code; the copies wait for their stream.
//! Work the caller queues on the device through the raw address is ordered by the caller.
//!
//! # Asynchronous copies
//! `copy_to_host_async` and `copy_from_host_async` (and [`DeviceUVector::from_host_async`])
//! enqueue a host copy on a given stream and return without waiting. They are `unsafe`: the
//! host memory must stay alive and untouched until the copy is done, which the borrow checker
//! cannot see. The copy runs after the work queued on the container's stream, and the
//! container's stream waits for it (event waits on the device; none when the two are one
//! stream), so the container's later work and its free are ordered after the copy. With
//! pageable host memory the driver copies synchronously or stages the data before returning;
//! pinned or registered memory makes the copy overlap other work.
//!
//! # cudarc
//! [`DeviceUVector::on_cudarc`] makes a vector a cudarc device slice, and containers and
//! views are cudarc kernel arguments (`stream.launch_builder(&f).arg(&mut v)`); see
//! [`cudarc_interop`] for the stream ordering each one gives.

pub mod cudarc_interop;
mod device_buffer;
mod ragged;
mod scalar;
mod uvector;

pub use cudarc_interop::{stream_of, CudarcView, CudarcViewMut};
/// The raw copies behind `DeviceBuffer`'s, for the bindings' pointer copies.
#[cfg(any(feature = "python", test))]
pub(crate) use device_buffer::copy_bytes;
#[cfg(feature = "python")]
pub(crate) use device_buffer::copy_bytes_async;
pub use device_buffer::DeviceBuffer;
pub use ragged::DeviceRagged;
pub use scalar::DeviceScalar;
pub use uvector::DeviceUVector;

/// Tests: waits for `stream` where the driver copies (without a driver, host memory is copied
/// by the CPU before an asynchronous copy returns).
#[cfg(test)]
fn wait_for_copies(stream: crate::cuda::Stream) {
    if crate::cuda::driver_available() {
        stream.synchronize().unwrap();
    }
}
