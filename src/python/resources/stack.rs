//! `rrmm._rrmm.build_stack`: a stack kind (`crate::stack`) built and wrapped in one call. The
//! plan's typed layers are made in Rust, bottom to top, and each becomes the Python object of
//! its `rrmm.mr` class over the one below (`wrap`), so the caller gets the top resource with
//! `upstream_mr` all the way down. The options are keyword arguments of this function: a
//! misspelt one is a TypeError at the call.

use super::convert::arg;
use super::resource::DeviceMemoryResource;
use super::wrap::wrap;
use crate::python::errors::py_result;
use crate::resource::SharedResource;
use crate::stack::{plan, Sources, StackOptions, Target, KINDS};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::stack_options::stack_options;

/// The stack of kind `kind` on a simulated device of `simulate` bytes or the current device,
/// with its options (keyword arguments, `super::stack_options`); returns the top resource
/// object. Raises ValueError for an unknown kind or a bad option, TypeError for an unknown
/// option, and what the resources raise (RMM's size messages, MemoryError).
#[pyfunction]
#[pyo3(signature = (kind, *, simulate=None, **options))]
pub(super) fn build_stack(
    py: Python<'_>,
    kind: &str,
    #[pyo3(from_py_with = arg::simulate)] simulate: Option<usize>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Py<DeviceMemoryResource>> {
    let options = stack_options(options)?;
    build(py, kind, simulate, &options)
}

/// [`build_stack`] with the options read.
fn build(
    py: Python<'_>,
    kind: &str,
    simulate: Option<usize>,
    options: &StackOptions,
) -> PyResult<Py<DeviceMemoryResource>> {
    let plan = py_result(py.detach(|| plan(kind, Target::from_simulate(simulate), options)))?;
    let mut top: Option<(Py<DeviceMemoryResource>, SharedResource)> = None;
    for layer in &plan.layers {
        let (below_obj, below) = match top.take() {
            Some((obj, rust)) => (Some(obj), Some(rust)),
            None => (None, None),
        };
        let handle = py_result(py.detach(|| layer.build(below.as_ref(), Sources::Checked)))?;
        let obj = wrap(py, &handle, below_obj)?;
        let rust = obj.bind(py).get().inner.clone();
        top = Some((obj, rust));
    }
    top.map(|(obj, _)| obj)
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("an empty stack"))
}

/// `reinitialize`'s work after its arguments are checked (in Python), in one call: without a
/// CUDA device it forgets every per-device resource and returns why (for the warning);
/// otherwise it checks `devices` against the machine (ValueError, nothing changed), forgets
/// every per-device resource (before the new ones are built, as in RMM: a new pool's default
/// initial size is half the free memory, which the old one may hold), builds the stack of
/// `kind` on each device with it current, and sets them.
#[pyfunction]
#[pyo3(signature = (kind, devices, **options))]
fn _reinitialize(
    py: Python<'_>,
    kind: &str,
    devices: Vec<usize>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<String>> {
    let options = stack_options(options)?;
    let count = crate::cuda::device_count();
    if count == 0 {
        super::registry::clear(py);
        return Ok(Some(match crate::cuda::ensure_driver() {
            Ok(()) => "no devices".to_string(),
            Err(crate::Error::NoDriver(why)) => why,
            Err(e) => e.to_string(),
        }));
    }
    if let Some(device) = devices.iter().find(|&&d| d >= count) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "reinitialize: device {device} is out of range: this machine has {count} CUDA \
             device(s); no resource was changed"
        )));
    }
    // The plan whole (the kind, RMM's pool size rules) before anything is forgotten.
    py_result(plan(kind, Target::Device, &options))?;
    super::registry::clear(py);
    let build = || build(py, kind, None, &options);
    let mut built = Vec::with_capacity(devices.len());
    for &device in &devices {
        built.push((device, on_device(count, device, build)?));
    }
    for (device, mr) in built {
        super::registry::set_resource(device, mr.bind(py).as_any())?;
    }
    Ok(None)
}

/// `make()` with `device` current (as RMM's `setDevice`), the current device restored after.
fn on_device<T>(count: usize, device: usize, make: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    if count <= 1 {
        return make();
    }
    let original = crate::current_device_ordinal();
    py_result(crate::cuda::set_current_device(device))?;
    let made = make();
    let restored = py_result(crate::cuda::set_current_device(original));
    let made = made?;
    restored?;
    Ok(made)
}

/// `_check_stack(kind, *, simulate=None, **options)`: checks a stack's description whole
/// without building anything (the kind, each option's type, RMM's pool size rules, the sizes of
/// simulated memory), as `build_stack` would before its first layer: for the callers that take
/// the options now and build later (`reinitialize` before its hooks, the Dask plugin's
/// constructor). A plan for the device that needs the device's size (a managed pool's default
/// maximum) is checked as far as it goes without a driver: nothing is built there anyway.
#[pyfunction]
#[pyo3(signature = (kind, *, simulate=None, **options))]
fn _check_stack(
    kind: &str,
    #[pyo3(from_py_with = arg::simulate)] simulate: Option<usize>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    let options = stack_options(options)?;
    match plan(kind, Target::from_simulate(simulate), &options) {
        Err(crate::Error::NoDriver(_)) if simulate.is_none() => Ok(()),
        planned => py_result(planned).map(drop),
    }
}

/// The stack kinds' names and one-line summaries.
#[pyfunction]
fn _stack_kinds() -> Vec<(&'static str, &'static str)> {
    KINDS.iter().map(|k| (k.name, k.summary)).collect()
}

crate::python::register_items! {
    functions: build_stack, _reinitialize, _check_stack, _stack_kinds;
}
