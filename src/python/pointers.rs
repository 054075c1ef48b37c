//! What rrmm can tell about a raw pointer handed in from Python before copying through it: the
//! address ranges of the live simulated devices made from Python, which have nothing behind
//! them. A copy to or from one is an error (RuntimeError), never a dereference.

use crate::resource::SimulatedMemoryResource;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// The simulated devices made from Python, while they live.
static SIMULATED: Mutex<Vec<Weak<SimulatedMemoryResource>>> = Mutex::new(Vec::new());

/// Records a simulated device made from Python (dropped entries are pruned here).
pub(crate) fn register_simulated(sim: &Arc<SimulatedMemoryResource>) {
    let mut all = SIMULATED.lock();
    all.retain(|w| w.strong_count() > 0);
    all.push(Arc::downgrade(sim));
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
