//! What rrmm can tell about a raw pointer handed in from Python before copying through it.
//!
//! Simulated memory has nothing behind it: a copy to or from the address range of a live
//! simulated device made from Python is an error (RuntimeError), never a dereference. A raw
//! address a user passes (`copy_ptr_to_host(db, ...)`, `DeviceBuffer(ptr=...)`, a
//! `__cuda_array_interface__`) is copied through when something vouches for it: CUDA knows an
//! allocation at its first and last byte (device, managed, pinned, pool or mapped virtual
//! memory), it is a live allocation of a system resource made from Python, or it is host memory
//! mapped in this process with the access the copy needs (readable for a source, writable for a
//! destination: RMM copies from pageable host memory, `DeviceBuffer(ptr=a.ctypes.data, ...)`).
//! Anything else (an address that is not mapped, a read-only page as a destination) is a
//! ValueError: the driver would otherwise dereference it on the host and crash the process.

use crate::os::host_memory::{self, Access};
use crate::resource::{SystemMemoryResource, SIMULATED_ADDRESS_BASE};
use crate::{Error, Result};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// The system-memory resources made from Python, while they live.
// Why process-wide: a raw address may lie in any system resource made from Python.
static SYSTEM: Mutex<Vec<Weak<SystemMemoryResource>>> = Mutex::new(Vec::new());

/// Records `mr` in `registry`, pruning entries whose resource is gone.
fn register<T>(registry: &Mutex<Vec<Weak<T>>>, mr: &Arc<T>) {
    let mut all = registry.lock();
    all.retain(|w| w.strong_count() > 0);
    all.push(Arc::downgrade(mr));
}

/// Records a system-memory resource made from Python.
pub(crate) fn register_system(mr: &Arc<SystemMemoryResource>) {
    register(&SYSTEM, mr);
}

/// The live allocation of a system resource made from Python that holds `ptr` (a suballocator's
/// block inside one counts): (start, size).
///
/// # Time Complexity
/// O(live allocations of those resources).
fn system_allocation_at(ptr: usize) -> Option<(usize, usize)> {
    SYSTEM
        .lock()
        .iter()
        .filter_map(Weak::upgrade)
        .find_map(|mr| mr.allocation_containing(ptr))
}

/// What CUDA says of `[ptr, ptr + bytes)`: `None` when it knows no allocation at `ptr`; else
/// whether it knows allocations at the first and the last byte.
fn cuda_memory(ptr: usize, bytes: usize) -> Option<bool> {
    let last = ptr.checked_add(bytes - 1)?;
    match crate::cuda::allocation_range(ptr)? {
        (start, size) if last - start < size => Some(true),
        // The range may span allocations mapped side by side (virtual memory): the last byte
        // must be known too.
        _ => Some(crate::cuda::allocation_range(last).is_some()),
    }
}

/// An error unless `[ptr, ptr + bytes)` (the user's argument `name`) is memory rrmm can copy
/// through with `access`: not simulated, and known to CUDA, a live system allocation, or host
/// memory mapped in this process with that access (see the module doc).
///
/// # Errors
/// [`Error::Logic`] for simulated memory or a sleeping pool's memory;
/// [`Error::InvalidArgument`] for an address nothing vouches for.
pub(crate) fn check_user_range(
    name: &'static str,
    ptr: usize,
    bytes: usize,
    access: Access,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // A sleeping pool's memory is known to rrmm and has no pages behind it: the error names
    // the sleep before the checks below read the range (the copy itself checks again, in
    // `container::copy_bytes`, for every caller).
    crate::resource::sleep::check_awake(name, ptr, bytes)?;
    check_copyable(name, ptr, bytes)?;
    let past_the_end = || {
        Error::invalid(
            name,
            format!(
                "{name}={ptr:#x} ({bytes} bytes) runs past the end of the allocation that holds \
                 its first byte"
            ),
        )
    };
    // An allocation CUDA or rrmm knows at the first byte must hold the whole range; other host
    // memory must be mapped with the access the copy needs.
    match cuda_memory(ptr, bytes) {
        Some(true) => return Ok(()),
        Some(false) => return Err(past_the_end()),
        None => {}
    }
    if let Some((start, size)) = system_allocation_at(ptr) {
        return if bytes <= size - (ptr - start) {
            Ok(())
        } else {
            Err(past_the_end())
        };
    }
    if host_memory::is_accessible(ptr, bytes, access) {
        return Ok(());
    }
    let what = match access {
        Access::Read => "readable",
        Access::Write => "writable",
    };
    Err(Error::invalid(
        name,
        format!(
            "{name}={ptr:#x} ({bytes} bytes) is not memory rrmm can copy: CUDA knows no \
             allocation there (device, managed, pinned or pool memory) and it is not host \
             memory mapped {what} in this process"
        ),
    ))
}

/// Whether `[ptr, ptr + bytes)` touches simulated addresses: every simulated device and
/// simulated virtual memory hands out addresses at or above [`SIMULATED_ADDRESS_BASE`], where
/// no host or CUDA memory can be.
///
/// # Time Complexity
/// O(1).
pub(super) fn is_simulated(ptr: usize, bytes: usize) -> bool {
    ptr.saturating_add(bytes.max(1)) > SIMULATED_ADDRESS_BASE
}

/// An error when `[ptr, ptr + bytes)` (the argument `name`) is simulated memory, or no range
/// at all (it wraps past the end of the address space, or a size carries it from a host
/// address past every address a process can have).
///
/// # Errors
/// [`Error::InvalidArgument`] for a range that wraps or whose size exceeds the address space;
/// [`Error::Logic`] naming the argument and the address for simulated memory.
pub(crate) fn check_copyable(name: &'static str, ptr: usize, bytes: usize) -> Result<()> {
    if bytes > 0 && ptr.checked_add(bytes).is_none() {
        return Err(Error::invalid(
            name,
            format!(
                "{name}={ptr:#x} ({bytes} bytes) wraps past the end of the address space \
                 (2**64): no memory holds that range"
            ),
        ));
    }
    if bytes > 0 && ptr >= SIMULATED_ADDRESS_BASE {
        return Err(Error::Logic(format!(
            "{name}={ptr:#x} is simulated memory (or above every host address), which has \
             nothing behind it and cannot be copied"
        )));
    }
    if bytes > 0 && is_simulated(ptr, bytes) {
        // The address is a host or device one; the size carries the range past every address
        // a process can have (issue 39: a 2**63-byte copy from a host buffer was blamed on
        // simulated memory).
        return Err(Error::invalid(
            name,
            format!(
                "{name}={ptr:#x} with {bytes} bytes ends at {:#x}, past every address a \
                 process can have (2**56): the size exceeds the address space, no memory holds \
                 that range",
                ptr + bytes
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryResource, Stream};

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Issue 39: the message names what is wrong with the range, for every size: nothing
        /// for a range of host memory (or no bytes); a size that wraps past 2**64; a size that
        /// carries a host address past every address a process can have (not "simulated"); an
        /// address of a live simulated device.
        #[test]
        fn the_message_names_the_cause_for_every_size(
            shift in 0u32..64,
            low in 0usize..4096,
            simulated: bool,
        ) {
            use crate::resource::SimulatedMemoryResource;
            let bytes = (1usize << shift) + low;
            let sim = SimulatedMemoryResource::new(1 << 30);
            let host = [0u8; 64];
            let ptr = if simulated {
                sim.allocate(256, Stream::DEFAULT).unwrap()
            } else {
                host.as_ptr() as usize
            };
            let got = check_copyable("src", ptr, bytes);
            match ptr.checked_add(bytes) {
                _ if bytes == 0 => proptest::prop_assert!(got.is_ok()),
                None => {
                    let e = got.unwrap_err().to_string();
                    proptest::prop_assert!(e.contains("wraps past the end"), "{}", e);
                }
                Some(_) if simulated => {
                    let e = got.unwrap_err();
                    proptest::prop_assert!(matches!(e, Error::Logic(_)), "{}", e);
                    proptest::prop_assert!(e.to_string().contains("is simulated memory"), "{}", e);
                }
                Some(end) if end > SIMULATED_ADDRESS_BASE => {
                    let e = got.unwrap_err();
                    let text = e.to_string();
                    proptest::prop_assert!(matches!(e, Error::InvalidArgument { .. }), "{}", text);
                    proptest::prop_assert!(text.contains("the size exceeds the address space"), "{}", text);
                    proptest::prop_assert!(text.contains(&format!("with {bytes} bytes")), "{}", text);
                    proptest::prop_assert!(!text.contains("simulated"), "{}", text);
                }
                Some(_) => proptest::prop_assert!(got.is_ok(), "{:?}", got),
            }
            if simulated {
                // SAFETY: allocated above with 256 bytes, freed once.
                unsafe { sim.deallocate(ptr, 256, Stream::DEFAULT) }.unwrap();
            }
        }
    }

    #[test]
    fn simulated_ranges_are_known_and_host_memory_is_not() {
        use crate::resource::SimulatedMemoryResource;
        // A device larger than any host's memory (the probe's 141 GB) stays out of host
        // addresses.
        let sim = Arc::new(SimulatedMemoryResource::new(141_000_000_000));
        let p = sim.allocate(256, Stream::DEFAULT).unwrap();
        assert!(is_simulated(p, 16));
        assert!(check_copyable("src", p, 16).is_err());
        assert!(check_copyable("src", p, 0).is_ok());
        let host = [0u8; 16];
        assert!(!is_simulated(host.as_ptr() as usize, 16));
        let heap = vec![0u8; 4 << 20];
        assert!(check_copyable("src", heap.as_ptr() as usize, heap.len()).is_ok());
        assert!(check_user_range("src", heap.as_ptr() as usize, heap.len(), Access::Read).is_ok());
        assert!(check_user_range("src", 0x1000, 16, Access::Read).is_err());
        // SAFETY: `p` came from `sim` with 256 bytes; simulated memory touches nothing.
        unsafe { sim.deallocate(p, 256, Stream::DEFAULT) }.unwrap();
    }
}
