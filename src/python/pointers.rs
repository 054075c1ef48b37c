//! What rrmm can tell about a raw pointer handed in from Python before copying through it.
//!
//! Simulated memory has nothing behind it: a copy to or from the address range of a live
//! simulated device made from Python is an error (RuntimeError), never a dereference. A raw
//! address a user passes (`copy_ptr_to_host(db, ...)`, `DeviceBuffer(ptr=...)`, a
//! `__cuda_array_interface__`) is copied through only when something vouches for it: CUDA knows
//! an allocation at its first and last byte (device, managed, pinned, pool or mapped virtual
//! memory), or it is a live allocation of a system resource made from Python. Anything else (a
//! bogus address, pageable host memory CUDA does not know) is a ValueError: the driver would
//! otherwise dereference it on the host and crash the process.

use crate::resource::{SimulatedMemoryResource, SystemMemoryResource};
use crate::{Error, Result};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// The simulated devices made from Python, while they live.
static SIMULATED: Mutex<Vec<Weak<SimulatedMemoryResource>>> = Mutex::new(Vec::new());

/// The system-memory resources made from Python, while they live.
static SYSTEM: Mutex<Vec<Weak<SystemMemoryResource>>> = Mutex::new(Vec::new());

/// Records `mr` in `registry`, pruning entries whose resource is gone.
fn register<T>(registry: &Mutex<Vec<Weak<T>>>, mr: &Arc<T>) {
    let mut all = registry.lock();
    all.retain(|w| w.strong_count() > 0);
    all.push(Arc::downgrade(mr));
}

/// Records a simulated device made from Python.
pub(crate) fn register_simulated(sim: &Arc<SimulatedMemoryResource>) {
    register(&SIMULATED, sim);
}

/// Records a system-memory resource made from Python.
pub(crate) fn register_system(mr: &Arc<SystemMemoryResource>) {
    register(&SYSTEM, mr);
}

/// Whether `[ptr, ptr + bytes)` lies in one live allocation of a system resource made from
/// Python (a suballocator's block inside one counts).
///
/// # Time Complexity
/// O(live allocations of those resources).
fn is_system_allocation(ptr: usize, bytes: usize) -> bool {
    SYSTEM.lock().iter().filter_map(Weak::upgrade).any(|mr| {
        mr.allocation_containing(ptr)
            .is_some_and(|(start, size)| bytes <= size - (ptr - start))
    })
}

/// Whether CUDA knows allocations at the first and the last byte of `[ptr, ptr + bytes)`.
fn is_cuda_memory(ptr: usize, bytes: usize) -> bool {
    let Some(last) = ptr.checked_add(bytes - 1) else {
        return false;
    };
    match crate::cuda::allocation_range(ptr) {
        Some((start, size)) if last - start < size => true,
        // The range may span allocations mapped side by side (virtual memory): the last byte
        // must be known too.
        Some(_) => crate::cuda::allocation_range(last).is_some(),
        None => false,
    }
}

/// An error unless `[ptr, ptr + bytes)` (the user's argument `name`) is memory rrmm can copy
/// through: not simulated, and known to CUDA or a live system allocation (see the module doc).
///
/// # Errors
/// [`Error::Logic`] for simulated memory; [`Error::InvalidArgument`] for an address nothing
/// vouches for.
pub(crate) fn check_user_range(name: &'static str, ptr: usize, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    check_copyable(name, ptr, bytes)?;
    if is_system_allocation(ptr, bytes) || is_cuda_memory(ptr, bytes) {
        return Ok(());
    }
    Err(Error::invalid(
        name,
        format!(
            "{name}={ptr:#x} ({bytes} bytes) is not memory rrmm can copy: CUDA knows no \
             allocation there (device, managed, pinned or pool memory) and it is no live \
             allocation of a SystemMemoryResource"
        ),
    ))
}

/// Whether `[ptr, ptr + bytes)` touches the addresses of a live simulated device.
///
/// # Time Complexity
/// O(live simulated devices made from Python).
pub(crate) fn is_simulated(ptr: usize, bytes: usize) -> bool {
    let end = ptr.saturating_add(bytes.max(1));
    SIMULATED
        .lock()
        .iter()
        .filter_map(Weak::upgrade)
        .any(|sim| {
            let range = sim.address_range();
            ptr < range.end && range.start < end
        })
}

/// An error when `[ptr, ptr + bytes)` (the argument `name`) is simulated memory.
///
/// # Errors
/// [`Error::Logic`] naming the argument and the address.
pub(crate) fn check_copyable(name: &str, ptr: usize, bytes: usize) -> Result<()> {
    if bytes > 0 && is_simulated(ptr, bytes) {
        return Err(Error::Logic(format!(
            "{name}={ptr:#x} is simulated memory, which has nothing behind it and cannot be \
             copied"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryResource, Stream};

    #[test]
    fn live_simulated_ranges_are_known_and_host_memory_is_not() {
        let sim = Arc::new(SimulatedMemoryResource::new(1 << 20));
        register_simulated(&sim);
        let p = sim.allocate(256, Stream::DEFAULT).unwrap();
        assert!(is_simulated(p, 16));
        assert!(check_copyable("src", p, 16).is_err());
        assert!(check_copyable("src", p, 0).is_ok());
        let host = [0u8; 16];
        assert!(!is_simulated(host.as_ptr() as usize, 16));
        // SAFETY: `p` came from `sim` with 256 bytes; simulated memory touches nothing.
        unsafe { sim.deallocate(p, 256, Stream::DEFAULT) }.unwrap();
    }
}
