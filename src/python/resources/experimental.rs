//! `rrmm.mr.experimental`: RMM 26.10's experimental resources.

use crate::resource::CudaAsyncManagedMemoryResource as RsCudaAsyncManaged;
use pyo3::prelude::*;
use std::sync::Arc;

use super::resource::DeviceMemoryResource;
use crate::python::errors::py_result;

/// Stream-ordered managed memory from the current device's default managed memory pool
/// (RMM's `rmm.mr.experimental.CudaAsyncManagedMemoryResource`; needs CUDA 13.0).
#[pyclass(
    module = "rrmm.mr.experimental",
    name = "CudaAsyncManagedMemoryResource",
    extends = DeviceMemoryResource,
    frozen
)]
pub(super) struct CudaAsyncManagedMemoryResource {
    pool_handle: usize,
}

#[pymethods]
impl CudaAsyncManagedMemoryResource {
    #[new]
    fn new(py: Python<'_>) -> PyResult<PyClassInitializer<Self>> {
        let mr = py_result(py.detach(RsCudaAsyncManaged::new))?;
        let pool_handle = mr.pool_handle();
        // Pool allocation calls may block: the GIL is released around them.
        let base =
            DeviceMemoryResource::init(Arc::new(crate::CheckedResourceAdaptor::new(Arc::new(mr))));
        Ok(PyClassInitializer::from(base)
            .add_subclass(CudaAsyncManagedMemoryResource { pool_handle }))
    }

    /// The raw `cudaMemPool_t` handle of the managed pool.
    fn pool_handle(&self) -> usize {
        self.pool_handle
    }
}

/// Registers the experimental resources.
pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CudaAsyncManagedMemoryResource>()
}
