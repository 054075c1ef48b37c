//! The per-device current resource (RMM's `get/set_per_device_resource`).

use crate::cuda::{self};
use crate::error::Result;
use crate::resource::{CudaMemoryResource, SharedResource};
use parking_lot::RwLock;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

fn table() -> &'static RwLock<HashMap<usize, SharedResource>> {
    static TABLE: OnceLock<RwLock<HashMap<usize, SharedResource>>> = OnceLock::new();
    TABLE.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Bumped by every change of the table, so that per-thread caches know when they are stale.
static GENERATION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's last lookup: (generation, device, resource). Hooks and buffers ask for the
    /// same device's resource on every call; this answers without the table's lock.
    static LAST_LOOKUP: RefCell<Option<(u64, usize, SharedResource)>> = const { RefCell::new(None) };
}

/// The resource of device `ordinal`; a [`CudaMemoryResource`] is made on first use.
///
/// # Errors
/// Making the default resource fails without a driver.
///
/// # Time Complexity
/// O(1): a thread-local hit when the table has not changed since this thread last asked.
pub fn per_device_resource(ordinal: usize) -> Result<SharedResource> {
    let generation = GENERATION.load(Ordering::Acquire);
    let cached = LAST_LOOKUP.with(|last| match &*last.borrow() {
        Some((g, d, mr)) if *g == generation && *d == ordinal => Some(mr.clone()),
        _ => None,
    });
    if let Some(mr) = cached {
        return Ok(mr);
    }
    let mr = lookup_or_create(ordinal)?;
    LAST_LOOKUP.with(|last| *last.borrow_mut() = Some((generation, ordinal, mr.clone())));
    Ok(mr)
}

fn lookup_or_create(ordinal: usize) -> Result<SharedResource> {
    if let Some(mr) = table().read().get(&ordinal) {
        return Ok(mr.clone());
    }
    let mut map = table().write();
    if let Some(mr) = map.get(&ordinal) {
        return Ok(mr.clone());
    }
    let mr: SharedResource = Arc::new(CudaMemoryResource::on_device(ordinal)?);
    map.insert(ordinal, mr.clone());
    Ok(mr)
}

/// Sets the resource of device `ordinal` and returns the previous one, if any was set.
pub fn set_per_device_resource(ordinal: usize, mr: SharedResource) -> Option<SharedResource> {
    let mut map = table().write();
    GENERATION.fetch_add(1, Ordering::AcqRel);
    forget_this_threads_lookup();
    map.insert(ordinal, mr)
}

/// Drops this thread's cached lookup, so a replaced resource is not kept alive by it. (Other
/// threads drop theirs at their next lookup.)
fn forget_this_threads_lookup() {
    let _ = LAST_LOOKUP.try_with(|last| last.borrow_mut().take());
}

/// Whether a resource has been set (or made) for device `ordinal`.
pub fn has_per_device_resource(ordinal: usize) -> bool {
    table().read().contains_key(&ordinal)
}

/// Forgets every per-device resource (they are dropped once no one else holds them).
pub fn clear_per_device_resources() {
    let mut map = table().write();
    GENERATION.fetch_add(1, Ordering::AcqRel);
    forget_this_threads_lookup();
    map.clear();
}

/// The device that "current" refers to: the current context's device, or 0 with no driver.
pub fn current_device_ordinal() -> usize {
    cuda::current_device().unwrap_or(0)
}

/// The resource of the current device.
pub fn current_device_resource() -> Result<SharedResource> {
    per_device_resource(current_device_ordinal())
}

/// Sets the resource of the current device, returning the previous one.
pub fn set_current_device_resource(mr: SharedResource) -> Option<SharedResource> {
    set_per_device_resource(current_device_ordinal(), mr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::SimulatedMemoryResource;

    #[test]
    fn set_and_get_round_trip() {
        let mr: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 20));
        set_per_device_resource(7, mr.clone());
        assert!(Arc::ptr_eq(&per_device_resource(7).unwrap(), &mr));
        assert!(has_per_device_resource(7));
        // The per-thread cache sees a replacement at once.
        let other: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 10));
        set_per_device_resource(7, other.clone());
        assert!(Arc::ptr_eq(&per_device_resource(7).unwrap(), &other));
    }
}
