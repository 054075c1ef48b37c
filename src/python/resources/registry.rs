//! The per-device current resource as Python objects (`get/set_per_device_resource` and the
//! current-device variants): the core's table holds the Rust resources, this one the Python
//! object set for each device, so `get` returns the very object that was set.

use crate::resource::{MemoryKind, SharedResource};
use crate::stack::Handle;
use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::Arc;

use super::convert::{device_arg, resource_arg};
use super::resource::DeviceMemoryResource;
use crate::python::errors::py_result;

type Entry = (Py<DeviceMemoryResource>, SharedResource);

/// The Python object set for each device, with the Rust resource it was set with (to notice
/// resources set from Rust, for example by the torch hook), indexed by ordinal. Only ordinals the
/// core's table accepted reach it (`crate::per_device_resource` / `set_per_device_resource`
/// check them first), so no ordinal can size it beyond the core's bound.
// Why process-wide: the Python side of the per-device table in `current.rs`.
static PY_TABLE: Mutex<Vec<Option<Entry>>> = Mutex::new(Vec::new());

fn same(a: &SharedResource, b: &SharedResource) -> bool {
    std::ptr::eq(Arc::as_ptr(a) as *const (), Arc::as_ptr(b) as *const ())
}

/// The resource of `device`, as a Python object and as the Rust resource.
pub(super) fn per_device<'py>(
    py: Python<'py>,
    device: usize,
) -> PyResult<(Bound<'py, DeviceMemoryResource>, SharedResource)> {
    // One read lock when a resource is set; on first use this makes the default cuda resource.
    let rust = py_result(crate::per_device_resource(device))?;
    {
        let table = PY_TABLE.lock();
        if let Some(Some((obj, known))) = table.get(device) {
            if same(known, &rust) {
                return Ok((obj.bind(py).clone(), rust));
            }
        }
    }
    let obj = super::wrap::wrap_resource(py, rust.clone())?;
    store(py, device, obj.clone_ref(py), rust.clone());
    Ok((obj.into_bound(py), rust))
}

fn store(_py: Python<'_>, device: usize, obj: Py<DeviceMemoryResource>, mr: SharedResource) {
    let old = {
        let mut table = PY_TABLE.lock();
        if table.len() <= device {
            table.resize_with(device + 1, || None);
        }
        table[device].replace((obj, mr))
    };
    // The old object is dropped here, after the lock is released (its finalizer may run code).
    drop(old);
}

/// The current device's resource.
pub(crate) fn current_resource<'py>(
    py: Python<'py>,
) -> PyResult<(Bound<'py, DeviceMemoryResource>, SharedResource)> {
    per_device(py, crate::current_device_ordinal())
}

/// `get_per_device_resource(device)`.
#[pyfunction]
fn get_per_device_resource<'py>(
    py: Python<'py>,
    device: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, DeviceMemoryResource>> {
    Ok(per_device(py, device_arg(device)?)?.0)
}

/// `set_per_device_resource(device, mr)`.
#[pyfunction]
fn set_per_device_resource(device: &Bound<'_, PyAny>, mr: &Bound<'_, PyAny>) -> PyResult<()> {
    set_resource(device_arg(device)?, mr)
}

/// Sets `mr` (a resource object) as the resource of `device`, checked as
/// `set_per_device_resource` checks it.
pub(super) fn set_resource(device: usize, mr: &Bound<'_, PyAny>) -> PyResult<()> {
    let (obj, rust) = resource_arg(mr, "mr")?;
    // A stack rrmm refused to build cannot be set either (one built in Rust may be deeper):
    // say so, with the limit.
    let depth = py_result(crate::resource::graph::depth(&rust))?;
    let max = crate::resource::graph::MAX_STACK_DEPTH;
    if depth > max {
        return Err(PyValueError::new_err(format!(
            "mr: the resource stack is {depth} resources deep; rrmm uses stacks of at most {max}"
        )));
    }
    py_result(crate::set_per_device_resource(device, rust.clone()))?;
    store(mr.py(), device, obj, rust);
    Ok(())
}

/// `get_current_device_resource()`.
#[pyfunction]
fn get_current_device_resource(py: Python<'_>) -> PyResult<Bound<'_, DeviceMemoryResource>> {
    Ok(current_resource(py)?.0)
}

/// `set_current_device_resource(mr)`.
#[pyfunction]
fn set_current_device_resource(mr: &Bound<'_, PyAny>) -> PyResult<()> {
    set_resource(crate::current_device_ordinal(), mr)
}

/// Forgets every per-device resource (used by `reinitialize`).
#[pyfunction]
fn _clear_per_device_resources(py: Python<'_>) {
    clear(py);
}

/// Forgets every per-device resource, the Rust ones and their objects.
pub(super) fn clear(_py: Python<'_>) {
    crate::clear_per_device_resources();
    let old = std::mem::take(&mut *PY_TABLE.lock());
    // The old objects are dropped here, after the lock is released.
    drop(old);
}

/// Whether a resource has been set (or made) for the current device.
#[pyfunction]
fn is_initialized() -> bool {
    crate::has_per_device_resource(crate::current_device_ordinal())
}

/// Whether device `device` has a resource set (without making one).
#[pyfunction]
fn has_per_device_resource(device: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(crate::has_per_device_resource(device_arg(device)?))
}

/// The Python object of the process-wide host resource, with the Rust resource it stands for:
/// the resource itself is owned by the core (`crate::current_host_resource`), this is only the
/// object Python set or was given for it, so `get` returns the very object that was set.
// Why process-wide: the Python side of the current host resource in `current.rs`.
static HOST_PY: Mutex<Option<Entry>> = Mutex::new(None);

/// rrmm: the process-wide host resource (`rrmm.mr.get_current_host_resource`): the object set
/// with `_set_current_host_resource`, else the core's default (pinned host memory, or the
/// system allocator without a CUDA driver) as an object of its class.
#[pyfunction]
fn _current_host_resource(py: Python<'_>) -> PyResult<Py<DeviceMemoryResource>> {
    let rust = py_result(crate::current_host_resource())?;
    if let Some((obj, known)) = HOST_PY.lock().as_ref() {
        if same(known, &rust) {
            return Ok(obj.clone_ref(py));
        }
    }
    let obj = match crate::default_host_resource() {
        Some(default) if same(&default.resource(), &rust) => wrap_default_host(py, &default)?,
        _ => super::wrap::wrap_resource(py, rust.clone())?,
    };
    let old = HOST_PY.lock().replace((obj.clone_ref(py), rust));
    drop(old);
    Ok(obj)
}

/// The object of the core's default host resource, of its class.
fn wrap_default_host(
    py: Python<'_>,
    default: &crate::DefaultHostResource,
) -> PyResult<Py<DeviceMemoryResource>> {
    match default {
        crate::DefaultHostResource::Pinned(pinned, checked) => super::wrap::wrap(
            py,
            &Handle::PinnedHost(checked.clone(), pinned.clone()),
            None,
        ),
        crate::DefaultHostResource::System(system) => {
            super::source_resources::system_object(py, system.clone())
        }
    }
}

/// rrmm: sets the process-wide host resource (CuPy's pinned allocator hook and `HostBuffer`
/// use it); `None` goes back to the default. The core keeps the resource, this module the
/// object (`_current_host_resource` returns it).
#[pyfunction]
#[pyo3(signature = (mr))]
fn _set_current_host_resource(mr: Option<Bound<'_, DeviceMemoryResource>>) -> PyResult<()> {
    if let Some(m) = &mr {
        let inner = &m.get().inner;
        let kind = inner.kind();
        if !matches!(kind, MemoryKind::PinnedHost | MemoryKind::Host) {
            return Err(PyValueError::new_err(format!(
                "the host resource must hand out memory the host can read and write (pinned or \
                 system host memory), not {} memory ({})",
                match kind {
                    MemoryKind::Device => "device",
                    MemoryKind::Managed => "managed",
                    MemoryKind::Simulated => "simulated",
                    MemoryKind::PinnedHost | MemoryKind::Host => "host",
                },
                inner.name()
            )));
        }
    }
    let entry = mr.map(|m| (m.clone().unbind(), m.get().inner.clone()));
    crate::set_current_host_resource(entry.as_ref().map(|(_, rust)| rust.clone()));
    let old = std::mem::replace(&mut *HOST_PY.lock(), entry);
    drop(old);
    Ok(())
}

crate::python::register_items! {
    functions: _set_current_host_resource, _current_host_resource, get_per_device_resource,
        set_per_device_resource, get_current_device_resource, set_current_device_resource,
        _clear_per_device_resources, is_initialized, has_per_device_resource;
}

#[cfg(test)]
mod tests {
    use super::super::wrap::chain_of_names;
    use super::*;
    use crate::{ManagedMemoryResource as RsManaged, SimulatedMemoryResource};

    #[test]
    fn the_class_follows_the_type_not_the_name() {
        let sim: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 30));
        let managed: SharedResource = Arc::new(RsManaged::over(sim.clone(), Some(1 << 20)));
        assert!(matches!(
            Handle::of_resource(&managed),
            Some(Handle::Managed(_))
        ));
        assert!(Handle::of_resource(&sim).is_none());
        // A pool set from Rust is a pool (it came back as a bare adaptor), over the managed cache.
        let pool: SharedResource =
            Arc::new(crate::PoolMemoryResource::new(managed.clone(), Some(0), None).unwrap());
        let handle = Handle::of_resource(&pool).unwrap();
        assert!(matches!(handle, Handle::Pool(..)));
        assert_eq!(handle.built_over().unwrap().name(), "managed");
        // An adaptor set from Rust is its own class too, over its upstream.
        let stats: SharedResource = Arc::new(crate::StatisticsResourceAdaptor::new(pool.clone()));
        let handle = Handle::of_resource(&stats).unwrap();
        assert!(matches!(handle, Handle::Statistics(_)));
        assert_eq!(handle.built_over().unwrap().name(), "pool");
    }

    #[test]
    fn a_fallback_or_tiered_resource_set_from_rust_is_its_own_class_with_every_tier() {
        let sim = |n| -> SharedResource { Arc::new(SimulatedMemoryResource::new(n)) };
        let pool: SharedResource =
            Arc::new(crate::PoolMemoryResource::new(sim(1 << 30), Some(0), None).unwrap());
        let alternate = sim(1 << 20);
        let fallback: SharedResource = Arc::new(crate::FallbackResourceAdaptor::new(
            pool.clone(),
            alternate.clone(),
        ));
        let handle = Handle::of_resource(&fallback).unwrap();
        let Handle::Fallback(_, alt) = &handle else {
            panic!("{handle:?}")
        };
        assert!(matches!(**alt, Handle::Other(_)));
        assert_eq!(handle.built_over().unwrap().name(), "pool");
        let tiers = vec![
            crate::adaptor::Tier::new("device", pool.clone()),
            crate::adaptor::Tier::new("peer", fallback.clone()),
            crate::adaptor::Tier::new("host", alternate),
        ];
        let tiered: SharedResource =
            Arc::new(crate::adaptor::TieredMemoryResource::new(tiers).unwrap());
        let handle = Handle::of_resource(&tiered).unwrap();
        let Handle::Tiered(_, further) = &handle else {
            panic!("{handle:?}")
        };
        assert!(matches!(
            further.as_slice(),
            [Handle::Fallback(..), Handle::Other(_)]
        ));
        let names = chain_of_names(tiered);
        assert_eq!(names, ["tiered", "pool", "simulated"]);
    }

    #[test]
    fn a_stack_set_from_rust_is_walked_down_its_upstreams_to_a_known_class() {
        let sim: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 30));
        let managed: SharedResource = Arc::new(RsManaged::over(sim.clone(), Some(1 << 20)));
        let pool: SharedResource =
            Arc::new(crate::PoolMemoryResource::new(managed.clone(), Some(0), None).unwrap());
        let stats: SharedResource = Arc::new(crate::StatisticsResourceAdaptor::new(pool.clone()));
        let names = chain_of_names(stats);
        // The managed cache is a source of a known class: its object is whole, the walk stops
        // there; the pool is walked through to what it carves from.
        assert_eq!(names, ["statistics", "pool", "managed"]);
        let binning: SharedResource =
            Arc::new(crate::BinningMemoryResource::new(pool.clone(), Some(10), Some(12)).unwrap());
        let names = chain_of_names(binning);
        assert_eq!(
            names,
            ["binning", "pool", "managed"],
            "through binning's upstream"
        );
        assert_eq!(chain_of_names(sim).len(), 1);
    }
}
