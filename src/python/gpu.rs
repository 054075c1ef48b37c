//! Driver queries behind `rrmm._cuda.gpu` (RMM's `rmm._cuda.gpu`, there over cuda-python).

use pyo3::prelude::*;

use super::errors::py_result;

/// `cuDeviceGetAttribute(attribute, device)`; `attribute` is a `cudaDeviceAttr` or its int value
/// (the runtime's and the driver's numbering agree).
#[pyfunction]
fn _device_attribute(attribute: i32, device: usize) -> PyResult<i32> {
    py_result(crate::cuda::device_attribute(attribute, device))
}

/// Registers the driver queries.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_device_attribute, m)?)
}
