//! `rrmm.DeviceBuffer`: the class, how it allocates, frees and grows, and its registration.
//! Its Python methods are in `device_buffer/methods.rs`; the copies (and the pointer copy
//! functions of `rrmm.pylibrmm.device_buffer`) in `device_buffer/copies.rs`.

mod copies;
mod methods;

use crate::cuda::Stream as RawStream;
use crate::resource::memory_summary::explain_out_of_memory;
use crate::resource::{MemoryKind, SharedResource};
use crate::DeviceBuffer as RsBuffer;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::python::edge::stream::{PyStream, StreamArg};
use crate::python::errors::py_result;
use crate::python::gil::{self, CallProfile};
use crate::python::hooks::history;
use crate::python::resources::registry::current_resource;
use crate::python::resources::resource::DeviceMemoryResource;

/// Device memory of `size` bytes from a memory resource (RMM's `DeviceBuffer`), freed when the
/// object goes.
#[pyclass(
    module = "rrmm.pylibrmm.device_buffer",
    name = "DeviceBuffer",
    subclass
)]
pub(super) struct PyDeviceBuffer {
    buf: Option<RsBuffer>,
    mr: Py<DeviceMemoryResource>,
    stream: Py<PyStream>,
    /// The resource's call profile: frees (on drop) and reallocations go through `gil`.
    profile: CallProfile,
}

impl Drop for PyDeviceBuffer {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            if history::enabled() {
                let device = buf
                    .resource()
                    .device()
                    .unwrap_or(crate::current_device_ordinal());
                let stream = buf.stream().raw();
                history::record("free_completed", device, buf.ptr(), buf.size(), stream);
            }
            // A failed free cannot raise from a destructor: it is reported as CPython reports
            // exceptions in `__del__` (`sys.unraisablehook`, which names where it happened),
            // never swallowed.
            let (ptr, size) = (buf.ptr(), buf.size());
            if let Err(e) = gil::call_anywhere(self.profile, move || buf.free()) {
                Python::attach(|py| {
                    let place = pyo3::types::PyString::new(
                        py,
                        &format!("the free of rrmm.DeviceBuffer at {ptr:#x} ({size} bytes)"),
                    );
                    crate::python::errors::to_pyerr(e).write_unraisable(py, Some(place.as_any()));
                });
            }
        }
    }
}

impl PyDeviceBuffer {
    fn inner(&self) -> &RsBuffer {
        // A buffer is only taken in Drop.
        self.buf.as_ref().unwrap_or_else(|| unreachable!())
    }

    fn kind(&self) -> MemoryKind {
        self.inner().resource().kind()
    }

    fn make(
        py: Python<'_>,
        size: usize,
        raw: RawStream,
        stream: Bound<'_, PyStream>,
        mr: Bound<'_, DeviceMemoryResource>,
        shared: SharedResource,
    ) -> PyResult<Self> {
        let res = mr.get();
        let profile = res.profile();
        // `shared` moves into the buffer (no reference-count traffic on the round trip); an
        // out-of-memory error is explained from the resource object's own handle on it.
        let explain_from = &res.inner;
        // The allocation's door (an ask of the processes sharing the GPU runs outside the
        // resource's locks and without the GIL); the buffer takes the pointer and `shared`.
        let buf = gil::allocate(py, profile, || shared.allocate(size, raw))
            .map(|ptr| {
                // SAFETY: `ptr` was allocated just now from `shared` with `size` bytes on
                // `raw`'s stream, and nothing else owns it.
                unsafe { RsBuffer::adopt(ptr, size, raw, shared) }
            })
            .map_err(|e| explain_out_of_memory(e, explain_from, size, raw));
        if let (Ok(b), true) = (&buf, history::enabled()) {
            let device = b
                .resource()
                .device()
                .unwrap_or(crate::current_device_ordinal());
            history::record("alloc", device, b.ptr(), b.size(), raw.raw());
        }
        Ok(PyDeviceBuffer {
            buf: Some(py_result(buf)?),
            mr: mr.unbind(),
            stream: stream.unbind(),
            profile,
        })
    }

    fn resource_of<'py>(
        py: Python<'py>,
        mr: Option<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, DeviceMemoryResource>, SharedResource)> {
        match mr {
            Some(mr) if !mr.is_none() => {
                let mr = mr.cast_into::<DeviceMemoryResource>().map_err(|_| {
                    PyTypeError::new_err("mr must be a DeviceMemoryResource or None")
                })?;
                let shared = mr.get().inner.clone();
                Ok((mr, shared))
            }
            _ => current_resource(py),
        }
    }

    /// The buffer to switch to new memory: waits (with the GIL released, so they can finish)
    /// while copies on other threads still read it; an error after a second (a read that does
    /// not end: a callback on this very thread that resizes the buffer it is copying).
    fn borrow_to_switch<'py>(slf: &Bound<'py, Self>) -> PyResult<PyRefMut<'py, Self>> {
        let start = std::time::Instant::now();
        loop {
            if let Ok(this) = slf.try_borrow_mut() {
                return Ok(this);
            }
            if start.elapsed() > std::time::Duration::from_secs(1) {
                return Err(pyo3::exceptions::PyRuntimeError::new_err(
                    "DeviceBuffer: cannot resize or reserve while another call on the buffer is \
                     still running (on this thread: a callback inside that call?)",
                ));
            }
            slf.py().detach(std::thread::yield_now);
        }
    }

    /// `reserve` (`capacity` given: at least that much room, same size) and `resize` (a new
    /// size, room as needed); the buffer moves to `stream`. A new allocation and its copy are
    /// made while the buffer is only read (other threads may use it meanwhile, with the GIL
    /// released around the copy as the resource's profile asks); the switch to the new memory
    /// and stream is one step with the GIL held, so no Python code ever sees the buffer
    /// mutably borrowed (PyO3's "Already borrowed"); the old memory is freed after.
    fn regrow(
        slf: &Bound<'_, Self>,
        capacity: Option<usize>,
        size: usize,
        stream: StreamArg<'_>,
    ) -> PyResult<()> {
        let py = slf.py();
        let (raw, obj) = stream.resolve(py)?;
        // Decided with the GIL, which other threads may take meanwhile (the allocation, or the
        // wait for a borrow): a decision to stay within the capacity is checked again at the
        // switch, and made again where another thread's switch left too little room.
        let old = loop {
            let replacement = {
                let this = slf.borrow();
                let buf = this.inner();
                let needed = capacity.unwrap_or(size);
                if needed > buf.capacity() {
                    Some(py_result(gil::allocate(py, this.profile, || {
                        buf.reallocated(needed, size, raw)
                    }))?)
                } else {
                    None
                }
            };
            let mut this = Self::borrow_to_switch(slf)?;
            let Some(buf) = this.buf.as_mut() else {
                this.stream = obj.clone().unbind();
                return Ok(());
            };
            match replacement {
                Some(new) => {
                    buf.set_stream(raw);
                    let old = std::mem::replace(buf, new);
                    this.stream = obj.clone().unbind();
                    break Some(old);
                }
                None if capacity.unwrap_or(size) <= buf.capacity() => {
                    buf.set_stream(raw);
                    py_result(buf.resize_within_capacity(size))?;
                    this.stream = obj.clone().unbind();
                    break None;
                }
                // Another thread's switch left less room than was decided on: again.
                None => continue,
            }
        };
        if let Some(old) = old {
            let profile = slf.borrow().profile;
            py_result(gil::call(py, profile, move || old.free()))?;
        }
        Ok(())
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDeviceBuffer>()?;
    copies::register(m)
}
