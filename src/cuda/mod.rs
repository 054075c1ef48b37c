//! The driver layer: the one place in rrmm that calls the CUDA driver (through `cudarc::driver::sys`).
//!
//! Everything above this module talks to CUDA only through these functions and types. The driver
//! is loaded dynamically; a machine without one is a normal state ([`driver_available`] is false
//! and every call returns [`Error::NoDriver`](crate::Error::NoDriver)).

mod check;
mod context;
mod device_info;
mod driver;
mod event;
mod kernel;
mod memory;
mod peer;
mod stream;
pub mod vmm;

pub use context::{current_device, set_current_device, ContextGuard};
pub use device_info::{
    concurrent_managed_access, default_managed_pool, device_attribute, host_numa_node,
};
pub use driver::{
    device_count, device_name, device_uuid, driver_available, driver_version, ensure_driver,
};
pub use event::Event;
pub use kernel::SpinKernel;
pub use memory::*;
pub use peer::{can_access_peer, enable_peer_access};
pub use stream::{OwnedStream, Stream};
