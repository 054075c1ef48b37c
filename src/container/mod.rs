//! Typed, stream-ordered containers over any [`MemoryResource`](crate::MemoryResource), as RMM's
//! `device_uvector` and `device_scalar`, with host copies both ways (which RMM's lack), and a
//! ragged container (vectors of vectors in one allocation).
//!
//! Element types are [`bytemuck::Pod`]: any bit pattern is a valid value, so an uninitialised
//! element read back is some value, never undefined behaviour, and elements cross to and from
//! the device as plain bytes.
//!
//! # Ownership and threads
//! A container owns its allocation (a [`DeviceBuffer`](crate::DeviceBuffer)) and frees it on
//! drop, on its stream. It is `Send` and `Sync` (it holds an address, not a reference into
//! host memory; the resource is thread-safe). Methods that change the contents or the size take
//! `&mut self`, so no two changes race through safe code; the copies wait for their stream.
//! Work the caller queues on the device through the raw address is ordered by the caller.
//!
//! cudarc: [`DeviceUVector::on_cudarc`] makes a vector a cudarc device slice (see
//! `cudarc_interop`).

mod cudarc_interop;
mod ragged;
mod scalar;
mod uvector;

pub use cudarc_interop::{stream_of, CudarcView, CudarcViewMut};
pub use ragged::DeviceRagged;
pub use scalar::DeviceScalar;
pub use uvector::DeviceUVector;
