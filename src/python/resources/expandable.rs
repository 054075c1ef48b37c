//! `rrmm.mr.ExpandableMemoryResource`: the expandable pool on one virtual address range per
//! device (or on simulated virtual memory, for CPU tests and sizing).

use super::convert::{arg, opt_bytes_arg};
use super::resource::DeviceMemoryResource;
use crate::python::errors::py_result;
use crate::resource::sleep::{BackingChange, BackingWatcher};
use crate::resource::HostVirtualMemory;
use crate::suballocator::{
    AutoPromote, ExpandableMemoryResource as RsExpandable, ExpandableOptions, ExpandableSizes,
};
use pyo3::prelude::*;
use std::sync::Arc;

/// A stream-ordered, coalescing pool on one virtual address range of a device: physical pages
/// are mapped as it grows (so free blocks coalesce across growth) and unmapped anywhere by
/// `trim()` (rrmm's answer to PyTorch's `expandable_segments`, for every library).
#[pyclass(module = "rrmm.mr", name = "ExpandableMemoryResource", extends = DeviceMemoryResource, frozen)]
pub(super) struct ExpandableMemoryResource {
    pub(super) mr: RsExpandable,
}

#[pymethods]
impl ExpandableMemoryResource {
    /// `device`: the device (default: the current one); `initial_pool_size`: bytes mapped at
    /// once (default 0); `maximum_pool_size`: most bytes mapped (default: the device's memory);
    /// `release_threshold`: free bytes above which a free unmaps free pages at once (default:
    /// none, memory stays mapped until `trim()`); `reserve_size`: bytes of addresses (default 4x
    /// the device's memory); `page_size`: bytes per mapping (default 32 MiB on a device, 128 MiB when shareable, the
    /// simulated page on simulated memory); `simulated_capacity`: use simulated virtual memory of that many bytes instead of
    /// a device (addresses only, never dereference them); `pinned_host`: pinned host memory of
    /// the device; `pageable_host`: plain host memory, no driver needed (CPU tests of
    /// `offload()`/`restore()` with real bytes). `spill_to_host`: when the device is full, map
    /// pinned host pages (on its host NUMA node) under the pool's addresses, read in place
    /// over the link, at most this many bytes of them (True: as many as the host has room
    /// for; default: never); `promote()` moves them back. `device_capacity`: with
    /// `pageable_host`, pretend the memory is a device of that many bytes (CPU tests of
    /// `spill_to_host`). `auto_promote`: when spilled pages move back to the device on their
    /// own: "safe_points" (the default: at a wake from sleep, `at_rest()`, the ledger's busy
    /// declaration and the Dask plugin's task boundaries), "frees" (also after a free that
    /// leaves room: you promise no other thread runs work on the pool's memory meanwhile, as in
    /// a single-threaded CuPy pipeline) or "off" (only `promote()`). `shareable`: make every
    /// page so that other processes of this user can map it (the driver's shareable handle on
    /// a device; a memory file per page with `pageable_host`, the CPU stand-in), so the pool
    /// can be `publish()`ed (`rrmm.share`; default False). ValueError where the memory cannot
    /// be shared: with `spill_to_host` (spilled pages are host memory the driver does not
    /// export, and a promotion remaps pages that importers map), `pinned_host` (registered as
    /// this process's pages) or `simulated_capacity` (no bytes).
    #[new]
    #[pyo3(signature = (
        device=None,
        initial_pool_size=None,
        maximum_pool_size=None,
        release_threshold=None,
        reserve_size=None,
        page_size=None,
        simulated_capacity=None,
        pinned_host=false,
        pageable_host=false,
        spill_to_host=None,
        device_capacity=None,
        auto_promote=None,
        shareable=false,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        device: Option<usize>,
        initial_pool_size: Option<&Bound<'_, PyAny>>,
        maximum_pool_size: Option<&Bound<'_, PyAny>>,
        release_threshold: Option<&Bound<'_, PyAny>>,
        reserve_size: Option<&Bound<'_, PyAny>>,
        page_size: Option<&Bound<'_, PyAny>>,
        simulated_capacity: Option<&Bound<'_, PyAny>>,
        pinned_host: bool,
        pageable_host: bool,
        spill_to_host: Option<&Bound<'_, PyAny>>,
        device_capacity: Option<&Bound<'_, PyAny>>,
        auto_promote: Option<&str>,
        shareable: bool,
    ) -> PyResult<PyClassInitializer<Self>> {
        let auto_promote = auto_promote
            .map(|w| py_result(w.parse::<AutoPromote>()))
            .transpose()?;
        let mut options = ExpandableOptions {
            sizes: ExpandableSizes {
                initial_pool_size: opt_bytes_arg(initial_pool_size, "initial_pool_size")?,
                maximum_pool_size: opt_bytes_arg(maximum_pool_size, "maximum_pool_size")?,
                release_threshold: opt_bytes_arg(release_threshold, "release_threshold")?,
            },
            reserve_size: opt_bytes_arg(reserve_size, "reserve_size")?,
            page_size: opt_bytes_arg(page_size, "page_size")?,
            spill_to_host: None,
            shareable,
        };
        let simulated = opt_bytes_arg(simulated_capacity, "simulated_capacity")?;
        options.spill_to_host = spill_limit(spill_to_host)?;
        let capacity = opt_bytes_arg(device_capacity, "device_capacity")?;
        if capacity.is_some() && !pageable_host {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "device_capacity pretends pageable host memory is a device: it needs \
                 pageable_host=True",
            ));
        }
        if let Some(spill) = options.spill_to_host {
            let memory = match (simulated, pinned_host, pageable_host, capacity) {
                (Some(_), ..) => Some("simulated memory (simulated_capacity)"),
                (None, true, ..) => Some("pinned host memory (pinned_host=True)"),
                (None, false, true, None) => {
                    Some("plain host memory without device_capacity (pageable_host=True)")
                }
                _ => None,
            };
            if let Some(memory) = memory {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "spill_to_host={spill}: {memory} never fills as a device does, so nothing \
                     would spill; spill_to_host needs a device's memory, or pageable_host=True \
                     with device_capacity=SIZE (a pretend device of that size)"
                )));
            }
        }
        let mr = py_result(py.detach(|| match simulated {
            Some(capacity) => RsExpandable::on_simulated(capacity, options),
            None if pageable_host => {
                let (reserve, page) = (options.host_reserve()?, options.page_size);
                let vm = match capacity {
                    Some(capacity) => HostVirtualMemory::pretend_device(
                        reserve,
                        page,
                        capacity,
                        options.spill_to_host.unwrap_or(0),
                    )?,
                    None => HostVirtualMemory::new(reserve, page, false, None)?,
                };
                let vm = match shareable {
                    true => vm.shareable()?,
                    false => vm,
                };
                RsExpandable::new(Arc::new(vm), options.sizes)
            }
            None => {
                let device = match device {
                    Some(d) => d,
                    None => crate::cuda::current_device()?,
                };
                if pinned_host {
                    RsExpandable::on_pinned_host(device, options)
                } else {
                    RsExpandable::on_device(device, options)
                }
            }
        }))?;
        if let Some(when) = auto_promote {
            mr.set_auto_promote(when);
        }
        let base = DeviceMemoryResource::init(Arc::new(mr.clone()));
        Ok(PyClassInitializer::from(base).add_subclass(ExpandableMemoryResource { mr }))
    }

    /// Whether the pool's pages can be shared with other processes (`shareable=True`).
    #[getter]
    fn shareable(&self) -> bool {
        self.mr.is_shareable()
    }

    /// Starts serving the pool's memory to other processes of this user as the exporter
    /// `name` (1 to 30 of `A-Z a-z 0-9 . _ -`), its socket in the ledgers' directory
    /// (`directory`, default `RRMM_LEDGER_DIR` or `/dev/shm/rrmm-ledger-<uid>`) under the
    /// device's UUID (`host` for host memory): an `rrmm.share.PoolPublication` whose `share()`
    /// names the pool's arrays and buffers. ValueError for a pool that is not shareable or is
    /// published already.
    #[pyo3(signature = (name, directory=None))]
    fn publish(
        &self,
        py: Python<'_>,
        name: &str,
        directory: Option<std::path::PathBuf>,
    ) -> PyResult<crate::python::share::SharePublication> {
        crate::python::share::SharePublication::start(py, &self.mr, name, directory)
    }

    /// What the pool shares (None for a pool that is not shareable): the exporter's figures
    /// (segments, names, importers, leases, deferred frees...), the pages kept mapped for
    /// importers, the frees waiting for importers and the bytes held out of use.
    fn share_figures<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        self.mr
            .share_figures()
            .map(|f| crate::python::share::figures_dict(py, f.to_map()))
            .transpose()
    }

    /// When spilled pages move back to the device on their own: "safe_points", "frees" or
    /// "off" (see the constructor).
    #[getter]
    fn get_auto_promote(&self) -> &'static str {
        match self.mr.auto_promote() {
            AutoPromote::SafePoints => "safe_points",
            AutoPromote::Frees => "frees",
            AutoPromote::Off => "off",
        }
    }

    #[setter]
    fn set_auto_promote(&self, when: &str) -> PyResult<()> {
        self.mr
            .set_auto_promote(py_result(when.parse::<AutoPromote>())?);
        Ok(())
    }

    /// Unmaps free pages (anywhere in the range) until at most `target` bytes stay mapped;
    /// returns the bytes unmapped. Synchronizes every stream the pool has seen.
    #[pyo3(signature = (target=0))]
    fn trim(&self, py: Python<'_>, target: usize) -> PyResult<usize> {
        let mr = &self.mr;
        py_result(py.detach(|| mr.trim(target)))
    }

    /// Maps free pages until at least `target` bytes are mapped, or `maximum_pool_size` (the
    /// opposite of `trim`); returns the bytes mapped now. Nothing is allocated; nothing while
    /// asleep. `MemoryError` when the device has no room.
    fn map_to(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = arg::target)] target: usize,
    ) -> PyResult<usize> {
        let mr = &self.mr;
        py_result(py.detach(|| mr.map_to(target)))
    }

    /// `trim(0)`, under the pool's name for it (`PoolMemoryResource.release`).
    fn release(&self, py: Python<'_>) -> PyResult<usize> {
        self.trim(py, 0)
    }

    /// Bytes of physical memory mapped (free and allocated).
    fn mapped_bytes(&self) -> usize {
        self.mr.mapped_bytes()
    }

    /// Bytes of addresses reserved.
    fn reserved_bytes(&self) -> usize {
        self.mr.reserved_bytes()
    }

    /// `mapped_bytes()`, under the pool's name for it.
    fn pool_size(&self) -> usize {
        self.mr.mapped_bytes()
    }

    /// Bytes of one page, the unit of mapping.
    fn page_size(&self) -> usize {
        self.mr.page_size()
    }

    /// The maximum of mapped bytes (None: the device's memory).
    fn maximum_pool_size(&self) -> Option<usize> {
        self.mr.maximum_pool_size()
    }

    /// Free bytes above which a free unmaps free pages at once (None: never on its own).
    fn release_threshold(&self) -> Option<usize> {
        self.mr.release_threshold()
    }

    /// Bytes mapped but free.
    fn free_bytes(&self) -> usize {
        self.mr.free_bytes()
    }

    /// The largest free block, in bytes.
    fn largest_free_block(&self) -> usize {
        self.mr.largest_free_block()
    }

    /// The number of free blocks.
    fn free_block_count(&self) -> usize {
        self.mr.free_block_count()
    }

    /// The latest sleep's figures and times in seconds (None before the first `offload()`).
    fn last_sleep<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyDict>>> {
        self.mr
            .last_sleep()
            .map(|r| super::sleep::report_dict(py, &r))
            .transpose()
    }

    /// Bytes of the pool's mapped pages that lie on the host now (spilled).
    fn spilled_bytes(&self) -> usize {
        self.mr.spilled_bytes()
    }

    /// Makes host pages for a spill of `nbytes` ahead of need, on `threads` threads (default 1:
    /// the driver makes them one at a time, 5-6 GB/s on 1, 4 or 16 threads on H100 and H200),
    /// and keeps them: make them before the work that spills. Returns the bytes made;
    /// RuntimeError for a pool that never spills (built without `spill_to_host`).
    #[pyo3(signature = (nbytes, threads=None))]
    fn prepare_spill(
        &self,
        py: Python<'_>,
        nbytes: &Bound<'_, PyAny>,
        threads: Option<usize>,
    ) -> PyResult<usize> {
        let bytes = super::convert::bytes_arg(nbytes, "nbytes")?;
        let threads = threads.unwrap_or(1);
        if threads == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "threads must be at least 1",
            ));
        }
        let mr = &self.mr;
        py_result(py.detach(|| mr.prepare_spill(bytes, threads)))
    }

    /// Gives the kept spill pages back to the OS until at most `keep` bytes stay kept; returns
    /// the bytes given back.
    #[pyo3(signature = (keep=0))]
    fn give_back_spill(&self, py: Python<'_>, keep: usize) -> usize {
        let mr = &self.mr;
        py.detach(|| mr.give_back_spill(keep))
    }

    /// Bytes of host memory holding the pool's data while asleep (0 when awake).
    fn host_copy_bytes(&self) -> usize {
        self.mr.host_copy_bytes()
    }

    /// Whether `restore()` keeps the host copy's pages for the next `offload()` (default True:
    /// they go back to the process's host page supply, `rrmm.host_pages`, ready for the next
    /// sleep); False gives them back to the OS at every wake, and the supply's free pages now.
    fn set_retain_host_copy(&self, retain: bool) {
        self.mr.set_retain_host_copy(retain)
    }

    /// Where `restore()` puts the host copy: "supply" (back to the process's host page supply,
    /// ready for the next sleep of any pool: the default), "give_back" (to the OS at once) or
    /// "keep" (kept with the pool: its bytes as of the sleep stay readable through
    /// `host_copy_of()`, and the next `offload()` copies into it, at the same host addresses,
    /// where it holds enough).
    fn set_host_copy_after_wake(&self, after: &str) -> PyResult<()> {
        self.mr.set_host_copy_after_wake(py_result(after.parse())?);
        Ok(())
    }

    /// Where `restore()` puts the host copy now ("supply", "give_back" or "keep").
    fn host_copy_after_wake(&self) -> &'static str {
        self.mr.host_copy_after_wake().name()
    }

    /// Whether the host copy is plain pageable pages (True) instead of the memory's own kind
    /// (pinned for a device: page-locked, copied at the link's speed; False, the default).
    /// Plain pages are the OS's to reclaim once given back; a device copies them slower.
    fn set_pageable_host_copy(&self, pageable: bool) {
        self.mr.set_pageable_host_copy(pageable)
    }

    /// The host memory holding the pool's bytes of `buffer` (a pointer, tensor, array or
    /// buffer; `nbytes` from it where not given): a list of (address, bytes), one piece unless
    /// the copy spans two host ranges there, or None where no host copy holds them all (awake
    /// with no copy kept, discarded, a disk backup, simulated memory). While asleep it is the
    /// sleep's copy; while awake, one kept with the pool (`set_host_copy_after_wake("keep")`),
    /// as of its sleep. The addresses are valid until the next `restore()` (a kept copy's,
    /// until the next `offload()`): reading them later is a use after free.
    #[pyo3(signature = (buffer, nbytes = None))]
    fn host_copy_of(
        &self,
        py: Python<'_>,
        buffer: &Bound<'_, PyAny>,
        nbytes: Option<usize>,
    ) -> PyResult<Option<Vec<(usize, usize)>>> {
        let (ptr, bytes) = range_of(buffer, nbytes)?;
        let mr = &self.mr;
        Ok(py.detach(|| mr.host_copy_of(ptr, bytes)))
    }

    /// The pool's bytes of `buffer` from its host copy (as `host_copy_of()` finds them), read
    /// under the pool's lock (no `restore()` frees them meanwhile); None where no host copy
    /// holds them all.
    #[pyo3(signature = (buffer, nbytes = None))]
    fn read_host_copy<'py>(
        &self,
        py: Python<'py>,
        buffer: &Bound<'_, PyAny>,
        nbytes: Option<usize>,
    ) -> PyResult<Option<Bound<'py, pyo3::types::PyBytes>>> {
        let (ptr, bytes) = range_of(buffer, nbytes)?;
        let mut out = vec![0u8; bytes];
        let mr = &self.mr;
        let found = py.detach(|| mr.read_host_copy(ptr, &mut out));
        Ok(found.then(|| pyo3::types::PyBytes::new(py, &out)))
    }

    /// Calls `callback(event, base, size)` with the pool's address range when the physical
    /// memory behind it changes by the user's hand (None: no callback): event "sleep" before
    /// an `offload()` (or a stack's sleep, an engine's pause) unmaps it, "wake" after a
    /// `restore()` mapped it again, or after such a sleep was refused (the pages unchanged).
    /// For code that registered the memory with another library (NCCL's buffer registration):
    /// deregister at "sleep", register again at "wake". It runs on the transition's thread with
    /// the GIL taken and no lock of the pool held: it may call rrmm (the pool's figures, other
    /// pools), but must not `offload()` or `restore()` this pool; what it raises is reported as
    /// unraisable (the transition goes on). The shared-GPU ledger's sleeps and the wakes at
    /// first use are not told (they may run inside an allocation): they count in
    /// `movement()[i]["backing_changes"]`, which every sleep, wake and promotion increases.
    /// The pool holds the callback: set None to let go of it (a callback that holds the pool
    /// keeps both alive until then).
    #[pyo3(signature = (callback))]
    fn set_backing_watcher(&self, callback: Option<Py<PyAny>>) {
        let watcher = callback.map(|callback| -> BackingWatcher {
            Arc::new(move |change: BackingChange, base: usize, bytes: usize| {
                Python::attach(|py| {
                    if let Err(e) = callback.call1(py, (change.name(), base, bytes)) {
                        e.write_unraisable(py, None);
                    }
                });
            })
        });
        self.mr.set_backing_watcher(watcher);
    }
}

/// The address range of `buffer` (a pointer, tensor, array or buffer): its pointer, and
/// `nbytes` or its own size.
fn range_of(buffer: &Bound<'_, PyAny>, nbytes: Option<usize>) -> PyResult<(usize, usize)> {
    let ptr = super::sleep::pointer_of(buffer)?;
    let bytes = nbytes
        .or_else(|| super::sleep::size_of(buffer))
        .ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(
                "nbytes is needed for a buffer that does not say its size (a pointer)",
            )
        })?;
    Ok((ptr, bytes))
}

/// `spill_to_host`: None or False (never), True (as many bytes as the host has room for now),
/// or a size.
fn spill_limit(arg: Option<&Bound<'_, PyAny>>) -> PyResult<Option<usize>> {
    match arg {
        Some(a) if a.is_instance_of::<pyo3::types::PyBool>() => Ok(a
            .extract::<bool>()?
            .then(crate::python::host_pages::host_pages_room)),
        other => opt_bytes_arg(other, "spill_to_host"),
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ExpandableMemoryResource>()?;
    Ok(())
}
