//! The suballocators of `rrmm.mr`: pool, fixed-size and binning. They answer from host
//! bookkeeping, so they keep the GIL.

use crate::suballocator::{
    BinningMemoryResource as RsBinning, FixedSizeMemoryResource as RsFixedSize,
    PoolMemoryResource as RsPool, DEFAULT_BLOCKS_TO_PREALLOCATE, DEFAULT_BLOCK_SIZE,
};
use crate::MemoryResource;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::PyClass;
use std::sync::Arc;

use super::convert::{arg, bytes_arg, opt_bytes_arg, upstream_arg};
use super::resource::{
    call_blocking, call_locking, over_upstream, DeviceMemoryResource, UpstreamResourceAdaptor,
};
use super::upstream_kw::upstream_of;
use crate::python::errors::{figures_readable, py_result};

/// A figure of `mr`, the Rust suballocator of `slf`, that takes its lock: refused from inside
/// one of its own upstream calls (`figures_readable`), else read through `call_locking`.
fn locked_figure<T, M>(slf: &Bound<'_, T>, mr: &M, figure: fn(&M) -> usize) -> PyResult<usize>
where
    T: PyClass<BaseType = UpstreamResourceAdaptor>,
    M: MemoryResource + Sync,
{
    figures_readable(mr)?;
    Ok(call_locking(slf, || figure(mr)))
}

/// The initializer of a suballocator class over `up` whose Rust suballocator (a handle on shared
/// state) serves both the base class (allocate, deallocate) and the class's own methods,
/// through the clone `leaf` keeps.
pub(super) fn suballocator_keeping<R, T>(
    up: Py<DeviceMemoryResource>,
    suballocator: R,
    leaf: impl FnOnce(R) -> T,
) -> PyClassInitializer<T>
where
    R: MemoryResource + Clone + 'static,
    T: PyClass<BaseType = UpstreamResourceAdaptor>,
{
    over_upstream(leaf(suballocator.clone()), up, Arc::new(suballocator))
}

/// A coalescing, stream-ordered pool over `upstream_mr` (RMM's `PoolMemoryResource`), with
/// rrmm's `release()` and fragmentation figures.
#[pyclass(module = "rrmm.mr", name = "PoolMemoryResource", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct PoolMemoryResource {
    pub(super) pool: RsPool,
}

#[pymethods]
impl PoolMemoryResource {
    #[new]
    #[pyo3(signature = (upstream_mr=None, initial_pool_size=None, maximum_pool_size=None, *, upstream=None))]
    fn new(
        py: Python<'_>,
        upstream_mr: Option<&Bound<'_, PyAny>>,
        initial_pool_size: Option<&Bound<'_, PyAny>>,
        maximum_pool_size: Option<&Bound<'_, PyAny>>,
        upstream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (up, upstream) = upstream_of(upstream_mr, upstream)?;
        let initial = opt_bytes_arg(initial_pool_size, "initial_pool_size")?;
        let maximum = opt_bytes_arg(maximum_pool_size, "maximum_pool_size")?;
        let pool = py_result(py.detach(|| RsPool::new(upstream, initial, maximum)))?;
        Ok(suballocator_keeping(up, pool, |pool| PoolMemoryResource {
            pool,
        }))
    }

    /// Bytes held from the upstream.
    fn pool_size(slf: &Bound<'_, Self>) -> PyResult<usize> {
        locked_figure(slf, &slf.get().pool, RsPool::pool_size)
    }

    /// The maximum pool size (None: no limit but the upstream's).
    fn maximum_pool_size(&self) -> Option<usize> {
        self.pool.maximum_pool_size()
    }

    /// rrmm: gives fully free upstream blocks back; returns the bytes released.
    fn release(slf: &Bound<'_, Self>) -> PyResult<usize> {
        // It synchronizes and frees upstream: a blocking call.
        let pool = &slf.get().pool;
        call_blocking(slf, || pool.release())
    }

    /// rrmm: bytes held but free.
    fn free_bytes(slf: &Bound<'_, Self>) -> PyResult<usize> {
        locked_figure(slf, &slf.get().pool, RsPool::free_bytes)
    }

    /// rrmm: the largest free block, in bytes.
    fn largest_free_block(slf: &Bound<'_, Self>) -> PyResult<usize> {
        locked_figure(slf, &slf.get().pool, RsPool::largest_free_block)
    }

    /// rrmm: the number of free blocks.
    fn free_block_count(slf: &Bound<'_, Self>) -> PyResult<usize> {
        locked_figure(slf, &slf.get().pool, RsPool::free_block_count)
    }
}

/// Blocks of one size from `upstream_mr` (RMM's `FixedSizeMemoryResource`).
#[pyclass(module = "rrmm.mr", name = "FixedSizeMemoryResource", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct FixedSizeMemoryResource {
    pub(super) fixed: RsFixedSize,
}

#[pymethods]
impl FixedSizeMemoryResource {
    #[new]
    #[pyo3(
        signature = (upstream_mr=None, block_size=None, blocks_to_preallocate=DEFAULT_BLOCKS_TO_PREALLOCATE, *, upstream=None),
        text_signature = "(upstream_mr=None, block_size=None, blocks_to_preallocate=128, *, upstream=None)"
    )]
    fn new(
        py: Python<'_>,
        upstream_mr: Option<&Bound<'_, PyAny>>,
        block_size: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = arg::blocks_to_preallocate)] blocks_to_preallocate: usize,
        upstream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (up, upstream) = upstream_of(upstream_mr, upstream)?;
        let block_size = opt_bytes_arg(block_size, "block_size")?.unwrap_or(DEFAULT_BLOCK_SIZE);
        let fixed =
            py_result(py.detach(|| RsFixedSize::new(upstream, block_size, blocks_to_preallocate)))?;
        Ok(suballocator_keeping(up, fixed, |fixed| {
            FixedSizeMemoryResource { fixed }
        }))
    }

    /// The size of every block.
    fn block_size(&self) -> usize {
        self.fixed.block_size()
    }

    /// Bytes held from the upstream.
    fn pool_size(slf: &Bound<'_, Self>) -> PyResult<usize> {
        locked_figure(slf, &slf.get().fixed, RsFixedSize::pool_size)
    }

    /// Free blocks.
    fn free_block_count(slf: &Bound<'_, Self>) -> PyResult<usize> {
        locked_figure(slf, &slf.get().fixed, RsFixedSize::free_block_count)
    }
}

/// Requests routed by size to bins (RMM's `BinningMemoryResource`); larger ones go upstream.
#[pyclass(module = "rrmm.mr", name = "BinningMemoryResource", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct BinningMemoryResource {
    pub(super) binning: RsBinning,
    pub(super) bin_mrs: Mutex<Vec<Py<DeviceMemoryResource>>>,
}

#[pymethods]
impl BinningMemoryResource {
    #[new]
    #[pyo3(
        signature = (upstream_mr=None, min_size_exponent=-1, max_size_exponent=-1, *, upstream=None, blocks_to_preallocate=None),
        text_signature = "(upstream_mr=None, min_size_exponent=-1, max_size_exponent=-1, *, upstream=None, blocks_to_preallocate=None)"
    )]
    fn new(
        py: Python<'_>,
        upstream_mr: Option<&Bound<'_, PyAny>>,
        min_size_exponent: i64,
        max_size_exponent: i64,
        upstream: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = arg::opt_blocks_to_preallocate)] blocks_to_preallocate: Option<usize>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (up, upstream) = upstream_of(upstream_mr, upstream)?;
        let exp = |e: i64| u32::try_from(e).ok();
        let (min, max) = if min_size_exponent >= 0 && max_size_exponent >= 0 {
            (exp(min_size_exponent), exp(max_size_exponent))
        } else {
            (None, None)
        };
        let blocks = blocks_to_preallocate.unwrap_or(DEFAULT_BLOCKS_TO_PREALLOCATE);
        let binning = py_result(py.detach(|| RsBinning::with_blocks(upstream, min, max, blocks)))?;
        Ok(suballocator_keeping(up, binning, |binning| {
            BinningMemoryResource {
                binning,
                bin_mrs: Mutex::new(Vec::new()),
            }
        }))
    }

    /// Adds a bin for requests up to `allocation_size` bytes: `bin_resource`, or a fixed-size
    /// resource over the upstream.
    #[pyo3(signature = (allocation_size, bin_resource=None))]
    fn add_bin(
        &self,
        py: Python<'_>,
        allocation_size: &Bound<'_, PyAny>,
        bin_resource: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let size = bytes_arg(allocation_size, "allocation_size")?;
        match bin_resource {
            Some(r) if !r.is_none() => {
                let (obj, shared) = upstream_arg(r)?;
                let binning = &self.binning;
                py_result(py.detach(|| binning.add_bin(size, Some(shared))))?;
                self.bin_mrs.lock().push(obj);
            }
            _ => {
                let binning = &self.binning;
                py_result(py.detach(|| binning.add_bin(size, None)))?;
            }
        }
        Ok(())
    }

    /// The garbage collector's view of the bins it keeps alive (skipped while another thread
    /// adds one: an undercount only delays collection).
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Some(bins) = self.bin_mrs.try_lock() {
            for bin in bins.iter() {
                visit.call(bin)?;
            }
        }
        Ok(())
    }

    /// The bin resources given to `add_bin`.
    #[getter]
    fn bin_mrs(&self, py: Python<'_>) -> Vec<Py<DeviceMemoryResource>> {
        self.bin_mrs
            .lock()
            .iter()
            .map(|m| m.clone_ref(py))
            .collect()
    }
}

crate::python::register_items! {
    classes: PoolMemoryResource, FixedSizeMemoryResource, BinningMemoryResource;
}
