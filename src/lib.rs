//! rrmm: composable, thread-safe CUDA memory resources (pool, fixed-size, binning, adaptors) on
//! the driver API through `cudarc`, with RMM's semantics.
//!
//! Every resource implements [`MemoryResource`]; suballocators and adaptors own their upstream as
//! a [`SharedResource`]. Without a GPU, [`SimulatedMemoryResource`] stands in for device memory.
//!
//! ```
//! use rrmm::{MemoryResource, SimulatedMemoryResource, Stream};
//!
//! let device = SimulatedMemoryResource::new(1 << 30);
//! let ptr = device.allocate(1000, Stream::DEFAULT)?;
//! assert_eq!(ptr % 256, 0);
//! // SAFETY: `ptr` came from `allocate` on `device` with 1000 bytes, is freed once, and no
//! // work uses it (`deallocate` is `unsafe`: a foreign or double free is undefined behaviour
//! // for resources that do not check).
//! unsafe { device.deallocate(ptr, 1000, Stream::DEFAULT) }?;
//! # Ok::<(), rrmm::Error>(())
//! ```
#![deny(missing_docs)]

pub mod adaptor;
pub mod container;
pub mod cuda;
mod current;
mod device_buffer;
mod error;
pub mod live;
pub mod os;
pub mod pressure;
pub mod replay;
pub mod report;
pub mod resource;
pub mod stack;
pub mod suballocator;
mod sync;
#[cfg(test)]
mod test_support;

pub use adaptor::{
    AlignedResourceAdaptor, CheckedResourceAdaptor, FailureCallbackResourceAdaptor,
    FallbackResourceAdaptor, LimitingResourceAdaptor, LoggingResourceAdaptor,
    PrefetchResourceAdaptor, Statistics, StatisticsResourceAdaptor, TrackingResourceAdaptor,
};
pub use bytemuck;
pub use container::{DeviceRagged, DeviceScalar, DeviceUVector};
pub use cuda::{OwnedStream, Stream};
pub use current::{
    check_device_ordinal, clear_per_device_resources, current_device_ordinal,
    current_device_resource, current_host_resource, has_per_device_resource, per_device_resource,
    set_current_device_resource, set_current_host_resource, set_per_device_resource,
    MAX_VIRTUAL_DEVICES,
};
pub use device_buffer::DeviceBuffer;
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
    ArenaMemoryResource, BinningMemoryResource, ExpandableMemoryResource, FixedSizeMemoryResource,
    ManagedMemoryResource, ManagedOptions, PoolMemoryResource, StreamEvents, StreamKey,
};

#[cfg(feature = "python")]
mod python;

/// The README's Rust examples, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
