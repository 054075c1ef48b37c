//! rrmm: composable, thread-safe CUDA memory resources (pool, fixed-size, binning, adaptors) on
//! the driver API through `cudarc`, with RMM's semantics.
//!
//! ```toml
//! [dependencies]
//! rrmm = "0.1"
//! ```
//!
//! Every resource implements [`MemoryResource`]; suballocators and adaptors own their upstream as
//! a [`SharedResource`]. No CUDA toolkit is needed to build: the driver is loaded at run time.
//!
//! # What needs a GPU
//! - On a GPU: [`CudaMemoryResource`], [`CudaAsyncMemoryResource`], [`ManagedMemoryResource`],
//!   [`PinnedHostMemoryResource`], [`ExpandableMemoryResource`], and every container or
//!   [`DeviceBuffer`] copy on device memory.
//! - Without a GPU, allocation only: [`SimulatedMemoryResource`] stands in for a device of any
//!   size (for sizing, replays and tests of pools). It has no bytes behind its addresses, so
//!   the calls that copy bytes (`DeviceUVector::from_host`, `resize`, `set_element`,
//!   `element`, `to_vec`, `DeviceBuffer::copy_from_host`, ...) fail with "simulated memory has
//!   nothing behind it".
//! - Without a GPU, with bytes: [`SimulatedMemoryResource::with_backing`] (a simulated device
//!   of the same capacity with host memory behind its addresses) or [`SystemMemoryResource`]
//!   (host memory), alone or under any pool or adaptor, back the containers and
//!   [`DeviceBuffer`] with real bytes, copied by the CPU when there is no driver: the way to
//!   test code that uses containers without a GPU.
//!
//! # A pool on a simulated device
//!
//! ```
//! use rrmm::{MemoryResource, PoolMemoryResource, SharedResource, SimulatedMemoryResource, Stream};
//! use std::sync::Arc;
//!
//! // A 1 GiB device without a GPU; the pool starts at 64 MiB and grows up to 512 MiB.
//! let device: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 30));
//! let pool = PoolMemoryResource::new(device, Some(64 << 20), Some(512 << 20))?;
//! let ptr = pool.allocate(1000, Stream::DEFAULT)?;
//! assert_eq!(ptr % 256, 0);
//! assert!(pool.allocate(1 << 30, Stream::DEFAULT).is_err()); // past the maximum: out of memory
//! // SAFETY: `ptr` came from `allocate` on `pool` with 1000 bytes, is freed once, and no work
//! // uses it (`deallocate` is `unsafe`: a foreign or double free is undefined behaviour for
//! // resources that do not check).
//! unsafe { pool.deallocate(ptr, 1000, Stream::DEFAULT) }?;
//! # Ok::<(), rrmm::Error>(())
//! ```
//!
//! # A container (RMM's `device_uvector`)
//!
//! On a GPU the resource is a device resource (`CudaMemoryResource`, a pool over it); here it
//! is a pool over a simulated device that keeps its bytes, so the example runs anywhere:
//!
//! ```
//! use rrmm::{DeviceUVector, PoolMemoryResource, SharedResource, SimulatedMemoryResource, Stream};
//! use std::sync::Arc;
//!
//! let device: SharedResource = Arc::new(SimulatedMemoryResource::with_backing(256 << 20)?);
//! let pool: SharedResource = Arc::new(PoolMemoryResource::new(device, Some(1 << 20), None)?);
//! let mut v = DeviceUVector::<f32>::from_host(&[1.0, 2.0, 3.0], Stream::DEFAULT, pool)?;
//! v.set_element(1, 20.0)?;
//! v.resize(4)?; // keeps the first three elements
//! assert_eq!(v.len(), 4);
//! assert_eq!(&v.to_vec()?[..3], &[1.0, 20.0, 3.0]);
//! assert_eq!(v.element(2)?, 3.0);
//! # Ok::<(), rrmm::Error>(())
//! ```
#![deny(missing_docs)]

pub mod adaptor;
pub mod container;
pub mod cuda;
mod current;
mod error;
pub mod live;
pub mod os;
pub mod pressure;
pub mod replay;
pub mod report;
pub mod resource;
pub mod shared_gpu;
pub mod shared_memory;
pub mod stack;
pub mod suballocator;
mod sync;
#[cfg(test)]
mod test_support;

pub use adaptor::{
    AlignedResourceAdaptor, CheckedResourceAdaptor, FailureCallbackResourceAdaptor,
    FallbackResourceAdaptor, LimitingResourceAdaptor, LoggingResourceAdaptor,
    PrefetchResourceAdaptor, Statistics, StatisticsResourceAdaptor, TaggedMemoryResource,
    TieredMemoryResource, TrackingResourceAdaptor,
};
pub use bytemuck;
pub use container::{DeviceBuffer, DeviceRagged, DeviceScalar, DeviceUVector};
pub use cuda::{OwnedStream, Stream};
pub use current::{
    check_device_ordinal, clear_per_device_resources, current_device_ordinal,
    current_device_resource, current_host_resource, current_host_resource_and_calls,
    default_host_resource, has_per_device_resource, per_device_resource,
    per_device_resource_and_calls, set_current_device_resource, set_current_host_resource,
    set_per_device_resource, DefaultHostResource, MAX_VIRTUAL_DEVICES,
};
pub use error::{CallbackPayload, Error, Result};
pub use live::LiveAllocations;
pub use report::{Footprint, MemoryStats, PoolReport, SegmentInfo};
pub use resource::{
    CallProfile, CudaAsyncManagedMemoryResource, CudaAsyncMemoryResource,
    CudaAsyncViewMemoryResource, CudaMemoryResource, MemoryKind, MemoryResource,
    PinnedHostMemoryResource, SharedResource, SimulatedMemoryResource, SystemMemoryResource,
    ALLOCATION_ALIGNMENT,
};
pub use suballocator::{
    ArenaMemoryResource, BinningMemoryResource, ExpandableMemoryResource, ExpandableOptions,
    ExpandableSizes, FixedSizeMemoryResource, ManagedMemoryResource, ManagedOptions,
    PoolMemoryResource, StreamEvents, StreamKey,
};

#[cfg(feature = "python")]
mod python;

/// The README's Rust examples, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
