//! The peer tier's classes of `rrmm.mr`: `PeerMemoryResource` (memory of a peer GPU) and
//! `TieredMemoryResource` (device -> peer GPU -> host, with counts per tier).

use crate::adaptor::{Tier, TieredMemoryResource as RsTiered};
use crate::resource::{MemoryKind, PeerMemoryResource as RsPeer};
use crate::{CheckedResourceAdaptor, MemoryResource};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::sync::Arc;

use super::convert::{device_arg, resource_arg};
use super::resource::{over_upstream, sub, DeviceMemoryResource, UpstreamResourceAdaptor};
use super::upstream_kw::upstream_of;
use crate::python::errors::py_result;
use crate::python::record::record_dict;

/// Device memory of another GPU of the machine (the peer GPU `peer`) for use by `device` (the
/// current device when None): `cuMemAlloc` on the peer with peer access enabled both ways, so
/// kernels on `device` read and write it over NVLink or PCIe. Raises RuntimeError ("no peer
/// link: ...") when the machine has no GPU `peer` or the two GPUs have no peer link, and
/// without a CUDA driver; ValueError when `peer` is `device`.
#[pyclass(module = "rrmm.mr", name = "PeerMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(super) struct PeerMemoryResource {
    /// The GPU that holds the memory.
    #[pyo3(get)]
    pub(super) peer: usize,
    /// The GPU that uses it.
    #[pyo3(get)]
    pub(super) device: usize,
}

#[pymethods]
impl PeerMemoryResource {
    #[new]
    #[pyo3(signature = (peer, device=None))]
    fn new(
        py: Python<'_>,
        peer: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let peer = device_arg(peer)?;
        let device = match device {
            Some(d) if !d.is_none() => device_arg(d)?,
            _ => py_result(crate::cuda::current_device())?,
        };
        let mr = py_result(py.detach(|| RsPeer::new(device, peer)))?;
        let checked: crate::SharedResource = Arc::new(CheckedResourceAdaptor::new(Arc::new(mr)));
        Ok(sub(PeerMemoryResource { peer, device }, checked))
    }
}

/// Tiers for data beyond one GPU: allocations go to `upstream_mr` (the tier named "device")
/// while it has room, then to each of `tiers` in order (a `PeerMemoryResource`, then pinned
/// host or managed memory); each free goes back to the tier that made the allocation (frees
/// are checked: an unknown pointer, a double free or a wrong size is a RuntimeError).
/// `names` names the further tiers (default: "peer" for a `PeerMemoryResource`, "host" for
/// host or managed memory, else "tier<N>"). `tier_counts()` gives each tier's bytes and
/// allocations, current, peak and total.
#[pyclass(module = "rrmm.mr", name = "TieredMemoryResource", extends = UpstreamResourceAdaptor, frozen)]
pub(super) struct TieredMemoryResource {
    pub(super) tiered: Arc<RsTiered>,
    /// The tiers after the first, as Python objects (kept alive here).
    pub(super) further: Vec<Py<DeviceMemoryResource>>,
}

/// The default name of tier `index` (from 1) over `obj`.
fn default_name(obj: &Bound<'_, PyAny>, index: usize) -> String {
    if obj.is_instance_of::<PeerMemoryResource>() {
        return "peer".into();
    }
    let kind = obj
        .cast::<DeviceMemoryResource>()
        .map(|mr| mr.get().inner.kind())
        .ok();
    match kind {
        Some(MemoryKind::PinnedHost | MemoryKind::Host | MemoryKind::Managed) => "host".into(),
        _ => format!("tier{index}"),
    }
}

impl TieredMemoryResource {
    /// The Python object over a tiered resource made in Rust (the stack builder).
    pub(crate) fn keeping(
        up: Py<DeviceMemoryResource>,
        tiered: Arc<RsTiered>,
        further: Vec<Py<DeviceMemoryResource>>,
    ) -> PyClassInitializer<Self> {
        over_upstream(
            TieredMemoryResource {
                tiered: tiered.clone(),
                further,
            },
            up,
            tiered,
        )
    }
}

#[pymethods]
impl TieredMemoryResource {
    #[new]
    #[pyo3(signature = (upstream_mr=None, tiers=None, *, names=None, upstream=None))]
    fn new(
        upstream_mr: Option<&Bound<'_, PyAny>>,
        tiers: Option<&Bound<'_, PyAny>>,
        names: Option<Vec<String>>,
        upstream: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let (up, upstream) = upstream_of(upstream_mr, upstream)?;
        let tiers =
            tiers.ok_or_else(|| PyTypeError::new_err("missing required argument 'tiers'"))?;
        if tiers.is_instance_of::<pyo3::types::PyString>()
            || tiers.is_instance_of::<DeviceMemoryResource>()
        {
            return Err(PyTypeError::new_err(
                "tiers must be a sequence of DeviceMemoryResource (the tiers after upstream_mr)",
            ));
        }
        let objs: Vec<Bound<'_, PyAny>> = tiers.try_iter()?.collect::<PyResult<_>>()?;
        if let Some(n) = &names {
            if n.len() != objs.len() {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "names: {} names for {} tiers",
                    n.len(),
                    objs.len()
                )));
            }
        }
        let mut made = vec![Tier::new("device", upstream)];
        let mut further = Vec::with_capacity(objs.len());
        for (i, obj) in objs.iter().enumerate() {
            let (py_obj, rs) = resource_arg(obj, "tiers")?;
            let name = match &names {
                Some(n) => n[i].clone(),
                None => default_name(obj, i + 1),
            };
            made.push(Tier::new(name, rs));
            further.push(py_obj);
        }
        let tiered = Arc::new(py_result(RsTiered::new(made))?);
        Ok(Self::keeping(up, tiered, further))
    }

    /// The garbage collector's view of the tiers this object holds.
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        for t in &self.further {
            visit.call(t)?;
        }
        Ok(())
    }

    /// Every tier's resource, in the order they are tried (`upstream_mr` first).
    #[getter]
    fn tiers<'py>(slf: PyRef<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let py = slf.py();
        let out = PyList::empty(py);
        let base: &DeviceMemoryResource = slf.as_super().as_super();
        if let Some(up) = &base.upstream {
            out.append(up.clone_ref(py))?;
        }
        for t in &slf.further {
            out.append(t.clone_ref(py))?;
        }
        Ok(out)
    }

    /// The tiers' names, in order ("device" first).
    #[getter]
    fn tier_names(&self) -> Vec<String> {
        self.tiered.tier_names()
    }

    /// Each tier's counts, in order: a dict with `name`, `resource`, `current_bytes`,
    /// `peak_bytes`, `total_bytes`, `current_allocations`, `peak_allocations`,
    /// `total_allocations` and `refused` (allocations the tier passed on for want of memory).
    fn tier_counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for c in self.tiered.tier_counts() {
            out.append(record_dict(py, &c)?)?;
        }
        Ok(out)
    }

    /// The name of the tier holding the live allocation at `ptr`, or None.
    fn tier_of(&self, ptr: usize) -> Option<String> {
        self.tiered
            .tier_of(ptr)
            .map(|i| self.tiered.tier_names()[i].clone())
    }

    /// Allocations that no tier could serve (each raised MemoryError).
    fn failures(&self) -> u64 {
        self.tiered.failures()
    }

    /// Sets every tier's peaks to its current values.
    fn reset_peaks(&self) {
        self.tiered.reset_peaks();
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PeerMemoryResource>()?;
    m.add_class::<TieredMemoryResource>()?;
    Ok(())
}
