//! The per-device current resource (RMM's `get/set_per_device_resource`).

use crate::cuda::{self};
use crate::error::{Error, Result};
use crate::resource::{Calls, CudaMemoryResource, SharedResource};
use parking_lot::RwLock;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

fn table() -> &'static RwLock<HashMap<usize, SharedResource>> {
    // Why process-wide: RMM's per-device resource is process state (`set_per_device_resource`).
    static TABLE: OnceLock<RwLock<HashMap<usize, SharedResource>>> = OnceLock::new();
    TABLE.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Ordinals below this bound are accepted for resources tied to no device
/// ([`MemoryResource::device`](crate::MemoryResource::device) is `None`: simulated memory, host
/// memory, user callbacks) even beyond the machine's devices (and with no driver), so that tests
/// and simulations can use several "devices". Resources on a device need a real ordinal.
pub const MAX_VIRTUAL_DEVICES: usize = 1024;

/// Checks `ordinal` for a per-device table: below [`cuda::device_count`], or below
/// [`MAX_VIRTUAL_DEVICES`] for a resource on no device (`mr`) or a lookup without a driver.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the ordinal.
pub fn check_device_ordinal(ordinal: usize, mr: Option<&SharedResource>) -> Result<()> {
    let devices = cuda::device_count();
    if ordinal < devices {
        return Ok(());
    }
    let virtual_ok = match mr {
        Some(mr) => mr.device().is_none(),
        // A lookup: without a driver, making the default resource reports the missing driver.
        None => !cuda::driver_available(),
    };
    if virtual_ok && ordinal < MAX_VIRTUAL_DEVICES {
        return Ok(());
    }
    Err(Error::invalid(
        "device",
        format!(
            "device ordinal {ordinal} is out of range: this machine has {devices} CUDA device(s) \
             (resources on no device, such as simulated memory, may use ordinals below \
             {MAX_VIRTUAL_DEVICES})"
        ),
    ))
}

/// Bumped by every change of the table, so that per-thread caches know when they are stale.
// Why process-wide: tells each thread's lookup cache that the process-wide table changed.
static GENERATION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's last lookup: (generation, device, resource, its link's calls). Hooks and
    /// buffers ask for the same device's resource on every call; this answers without the
    /// table's lock, and with the calls the hooks' GIL decision reads (one load).
    // Why process-wide: a per-thread cache of the table: a hook's lookup takes no lock.
    static LAST_LOOKUP: RefCell<Option<(u64, usize, SharedResource, Calls)>> = const { RefCell::new(None) };
}

/// The resource of device `ordinal`; a [`CudaMemoryResource`] is made on first use.
///
/// # Errors
/// [`Error::InvalidArgument`] for an ordinal with no resource set and no device (see
/// [`check_device_ordinal`]); making the default resource fails without a driver.
///
/// # Time Complexity
/// O(1): a thread-local hit when the table has not changed since this thread last asked.
pub fn per_device_resource(ordinal: usize) -> Result<SharedResource> {
    cached_lookup(ordinal, |mr, _| mr.clone())
}

/// The resource of device `ordinal` (as [`per_device_resource`]) with its link's
/// [`calls`](crate::resource::Link::calls), kept per thread: what a caller that decides the GIL
/// around every call (the framework hooks) reads with one load.
///
/// # Errors
/// As [`per_device_resource`].
pub fn per_device_resource_and_calls(ordinal: usize) -> Result<(SharedResource, Calls)> {
    cached_lookup(ordinal, |mr, calls| (mr.clone(), calls.clone()))
}

/// What `pick` takes of device `ordinal`'s resource and calls, from this thread's last lookup
/// when the table has not changed since.
fn cached_lookup<T>(ordinal: usize, pick: impl Fn(&SharedResource, &Calls) -> T) -> Result<T> {
    let generation = GENERATION.load(Ordering::Acquire);
    let cached = LAST_LOOKUP.with(|last| match &*last.borrow() {
        Some((g, d, mr, calls)) if *g == generation && *d == ordinal => Some(pick(mr, calls)),
        _ => None,
    });
    if let Some(found) = cached {
        return Ok(found);
    }
    let mr = lookup_or_create(ordinal)?;
    let calls = mr.link().calls;
    let found = pick(&mr, &calls);
    LAST_LOOKUP.with(|last| *last.borrow_mut() = Some((generation, ordinal, mr, calls)));
    Ok(found)
}

fn lookup_or_create(ordinal: usize) -> Result<SharedResource> {
    if let Some(mr) = table().read().get(&ordinal) {
        return Ok(mr.clone());
    }
    check_device_ordinal(ordinal, None)?;
    let mut map = table().write();
    if let Some(mr) = map.get(&ordinal) {
        return Ok(mr.clone());
    }
    let mr: SharedResource = Arc::new(CudaMemoryResource::on_device(ordinal)?);
    map.insert(ordinal, mr.clone());
    drop(map);
    // A process that never set a resource (it only installed a framework's hook) joins its
    // GPU's ledger here when RRMM_SHARE_GPU asks, as one that set one does.
    shared_gpu_follows(ordinal, &mr);
    Ok(mr)
}

/// The ledger follows device `ordinal`'s resource, now `mr` ([`crate::shared_gpu::resource_set`]:
/// `RRMM_SHARE_GPU` joins it); a failure to join leaves the resource in place and says why once.
fn shared_gpu_follows(ordinal: usize, mr: &SharedResource) {
    if let Err(e) = crate::shared_gpu::resource_set(mr) {
        // A write to a closed stderr is skipped, never a panic.
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!(
                "rrmm: RRMM_SHARE_GPU is set but device {ordinal} could not join its ledger: {e}\n"
            ),
        );
    }
}

/// Sets the resource of device `ordinal` and returns the previous one, if any was set.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the ordinal when it is not a device of this machine (or,
/// for resources on no device, not below [`MAX_VIRTUAL_DEVICES`]); the table is unchanged then.
pub fn set_per_device_resource(
    ordinal: usize,
    mr: SharedResource,
) -> Result<Option<SharedResource>> {
    check_device_ordinal(ordinal, Some(&mr))?;
    let old = {
        let mut map = table().write();
        GENERATION.fetch_add(1, Ordering::AcqRel);
        forget_this_threads_lookup();
        map.insert(ordinal, mr.clone())
    };
    shared_gpu_follows(ordinal, &mr);
    Ok(old)
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
    // Without a driver there is no context to ask (and no error worth building on a hot path).
    if !cuda::driver_available() {
        return 0;
    }
    cuda::current_device().unwrap_or(0)
}

/// The resource of the current device.
pub fn current_device_resource() -> Result<SharedResource> {
    per_device_resource(current_device_ordinal())
}

/// Sets the resource of the current device, returning the previous one.
///
/// # Errors
/// As [`set_per_device_resource`].
pub fn set_current_device_resource(mr: SharedResource) -> Result<Option<SharedResource>> {
    set_per_device_resource(current_device_ordinal(), mr)
}

/// The default host resource, made on first use, kept with its type so that the Python
/// bindings give it its class (`PinnedHostMemoryResource`, `SystemMemoryResource`).
#[derive(Clone)]
pub enum DefaultHostResource {
    /// Pinned host memory (a CUDA driver is loaded), and the resource handed out: it behind a
    /// [`CheckedResourceAdaptor`](crate::CheckedResourceAdaptor), as Python drives it, so a
    /// bogus, double or wrong-size free is an error and never reaches the driver.
    Pinned(
        Arc<crate::resource::PinnedHostMemoryResource>,
        SharedResource,
    ),
    /// The system allocator (no CUDA driver: host memory without pinning).
    System(Arc<crate::resource::SystemMemoryResource>),
}

impl DefaultHostResource {
    /// The resource handed out.
    pub fn resource(&self) -> SharedResource {
        match self {
            DefaultHostResource::Pinned(_, checked) => checked.clone(),
            DefaultHostResource::System(system) => system.clone(),
        }
    }

    /// The default by the rule: pinned host memory where a CUDA driver is loaded, else the
    /// system allocator.
    ///
    /// # Errors
    /// The driver's errors making pinned memory.
    fn make() -> Result<Self> {
        if !cuda::driver_available() {
            return Ok(DefaultHostResource::System(Arc::new(
                crate::resource::SystemMemoryResource::new(),
            )));
        }
        let pinned = Arc::new(crate::resource::PinnedHostMemoryResource::new()?);
        let checked: SharedResource =
            Arc::new(crate::adaptor::CheckedResourceAdaptor::new(pinned.clone()));
        Ok(DefaultHostResource::Pinned(pinned, checked))
    }
}

/// What the process-wide host resource is: nothing yet, one a caller set, or the default.
#[derive(Clone)]
enum HostSlot {
    Unset,
    /// Set by the user, with its link's calls (read by every pinned allocation of the hooks).
    Set(SharedResource, Calls),
    /// Made on first use, with its link's calls.
    Default(DefaultHostResource, Calls),
}

impl HostSlot {
    /// The resource and its calls, unless unset.
    fn get(&self) -> Option<(SharedResource, Calls)> {
        match self {
            HostSlot::Unset => None,
            HostSlot::Set(mr, calls) => Some((mr.clone(), calls.clone())),
            HostSlot::Default(d, calls) => Some((d.resource(), calls.clone())),
        }
    }
}

fn host_slot() -> &'static RwLock<HostSlot> {
    // Why process-wide: RMM's current host resource is process state (`set_current_host_resource`).
    static HOST: RwLock<HostSlot> = RwLock::new(HostSlot::Unset);
    &HOST
}

/// The process-wide host resource (pinned host memory for staging, CuPy's pinned allocator,
/// `rrmm.HostBuffer`, Python's `rrmm.mr.get_current_host_resource`): the one set with
/// [`set_current_host_resource`], else the default made on first use
/// ([`DefaultHostResource`]: pinned host memory, or the system allocator without a CUDA
/// driver). The one owner of it: Python asks here.
///
/// # Errors
/// The driver's errors making the default pinned resource.
pub fn current_host_resource() -> Result<SharedResource> {
    current_host_resource_and_calls().map(|(mr, _)| mr)
}

/// The process-wide host resource (as [`current_host_resource`]) with its link's
/// [`calls`](crate::resource::Link::calls), kept beside it: what a caller that decides the GIL
/// around every call (CuPy's pinned allocator hook) reads with one load.
///
/// # Errors
/// As [`current_host_resource`].
pub fn current_host_resource_and_calls() -> Result<(SharedResource, Calls)> {
    if let Some(found) = host_slot().read().get() {
        return Ok(found);
    }
    let mut slot = host_slot().write();
    if let Some(found) = slot.get() {
        return Ok(found);
    }
    let made = DefaultHostResource::make()?;
    let mr = made.resource();
    let calls = mr.link().calls;
    *slot = HostSlot::Default(made, calls.clone());
    Ok((mr, calls))
}

/// The default host resource, where the current host resource is it (made on first use).
pub fn default_host_resource() -> Option<DefaultHostResource> {
    match &*host_slot().read() {
        HostSlot::Default(d, _) => Some(d.clone()),
        _ => None,
    }
}

/// Sets the process-wide host resource; the previous one, if any was set or made. `None` goes
/// back to the default (made on next use).
pub fn set_current_host_resource(mr: Option<SharedResource>) -> Option<SharedResource> {
    let new = mr.map_or(HostSlot::Unset, |mr| {
        let calls = mr.link().calls;
        HostSlot::Set(mr, calls)
    });
    std::mem::replace(&mut *host_slot().write(), new)
        .get()
        .map(|(mr, _)| mr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::SimulatedMemoryResource;
    use crate::MemoryResource;

    #[test]
    fn the_host_resource_has_one_owner_and_one_default_rule() {
        // Without a driver the default is the system allocator (with one: pinned memory).
        let before = set_current_host_resource(None);
        let default = current_host_resource().unwrap();
        let typed = default_host_resource().expect("the default was made");
        assert!(Arc::ptr_eq(&typed.resource(), &default));
        let expected = if cuda::driver_available() {
            crate::MemoryKind::PinnedHost
        } else {
            crate::MemoryKind::Host
        };
        assert_eq!(default.kind(), expected);
        // The same one until another is set; a set one is no default.
        assert!(Arc::ptr_eq(&current_host_resource().unwrap(), &default));
        let sys: SharedResource = Arc::new(crate::SystemMemoryResource::new());
        assert!(set_current_host_resource(Some(sys.clone())).is_some());
        assert!(Arc::ptr_eq(&current_host_resource().unwrap(), &sys));
        assert!(default_host_resource().is_none());
        // The calls kept beside it are its link's (the GIL decision of the pinned hook).
        let (kept, calls) = current_host_resource_and_calls().unwrap();
        assert!(Arc::ptr_eq(&kept, &sys));
        assert_eq!(calls.get(), sys.call_profile());
        set_current_host_resource(before);
    }

    #[test]
    fn set_and_get_round_trip() {
        let mr: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 20));
        set_per_device_resource(7, mr.clone()).unwrap();
        assert!(Arc::ptr_eq(&per_device_resource(7).unwrap(), &mr));
        assert!(has_per_device_resource(7));
        // The per-thread cache sees a replacement at once.
        let other: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 10));
        set_per_device_resource(7, other.clone()).unwrap();
        assert!(Arc::ptr_eq(&per_device_resource(7).unwrap(), &other));
    }

    /// Issue 9: `set_per_device_resource(2**40, sim)` aborted (a table indexed by ordinal) and
    /// `10**8` took 10 s and 2.4 GB.
    #[test]
    fn huge_ordinals_are_invalid_arguments_naming_the_ordinal() {
        let sim: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 20));
        for ordinal in [1usize << 40, 100_000_000, MAX_VIRTUAL_DEVICES, usize::MAX] {
            let started = std::time::Instant::now();
            let Err(err) = set_per_device_resource(ordinal, sim.clone()) else {
                panic!("ordinal {ordinal} accepted");
            };
            assert!(
                matches!(&err, Error::InvalidArgument { argument: "device", message }
                    if message.contains(&ordinal.to_string())),
                "{err}"
            );
            assert!(!has_per_device_resource(ordinal));
            assert!(started.elapsed() < std::time::Duration::from_secs(1));
            let Err(lookup) = per_device_resource(ordinal) else {
                panic!("ordinal {ordinal} looked up");
            };
            assert!(
                matches!(&lookup, Error::InvalidArgument { .. }),
                "{ordinal}: {lookup}"
            );
        }
        // Below the bound, simulated memory may stand for a device that is not there.
        set_per_device_resource(MAX_VIRTUAL_DEVICES - 1, sim.clone()).unwrap();
        assert!(Arc::ptr_eq(
            &per_device_resource(MAX_VIRTUAL_DEVICES - 1).unwrap(),
            &sim
        ));
    }

    #[test]
    fn device_resources_need_a_real_device() {
        // A resource on a device (here faked by a wrapper claiming device 0) is only accepted
        // at the ordinals the driver reports.
        struct OnDevice(SharedResource);
        impl crate::MemoryResource for OnDevice {
            fn allocate(&self, bytes: usize, stream: crate::Stream) -> Result<usize> {
                self.0.allocate(bytes, stream)
            }
            unsafe fn deallocate(&self, ptr: usize, bytes: usize, s: crate::Stream) -> Result<()> {
                // SAFETY: the caller's contract, forwarded.
                unsafe { self.0.deallocate(ptr, bytes, s) }
            }
            fn device(&self) -> Option<usize> {
                Some(0)
            }
            fn name(&self) -> &'static str {
                "on_device"
            }
        }
        let mr: SharedResource = Arc::new(OnDevice(Arc::new(SimulatedMemoryResource::new(64))));
        let beyond = cuda::device_count();
        assert!(matches!(
            set_per_device_resource(beyond + 500, mr.clone()),
            Err(Error::InvalidArgument { .. })
        ));
    }
}
