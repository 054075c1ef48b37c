//! Conversion of Python arguments: byte sizes (RMM's `parse_bytes` grammar, the one parser of
//! rrmm) and upstream resources. Stream arguments (`StreamArg`, `stream_arg`) live with the
//! `Stream` class in `stream`, which the resource base class needs below this file.

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};

use super::resource::DeviceMemoryResource;
use crate::report::{read_byte_spec, NotASize};
use crate::resource::SharedResource;

/// A resource argument `name`: a `DeviceMemoryResource` (a TypeError naming the argument and
/// the type given otherwise).
pub(crate) fn resource_arg<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<(Py<DeviceMemoryResource>, SharedResource)> {
    let mr = obj.cast::<DeviceMemoryResource>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} must be a DeviceMemoryResource, not {}",
            if obj.is_none() {
                "None".to_string()
            } else {
                type_name(obj)
            }
        ))
    })?;
    Ok((mr.clone().unbind(), mr.get().inner.clone()))
}

/// The upstream argument of an adaptor: a `DeviceMemoryResource` a resource can be built over
/// (within rrmm's stack depth), else an exception.
pub(crate) fn upstream_arg<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<(Py<DeviceMemoryResource>, SharedResource)> {
    let (mr, inner) = resource_arg(obj, "upstream_mr")?;
    // No stack deeper than rrmm can call through (or drop) without running out of stack.
    crate::python::errors::py_result(crate::resource::graph::check_upstream(
        "upstream_mr",
        &inner,
    ))?;
    Ok((mr, inner))
}

/// The name of `obj`'s type, for an error message (empty if even that fails).
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

/// A device ordinal argument: an int or an object with `__index__` (a TypeError otherwise);
/// a negative one, or one past `usize`, is a ValueError naming it. (Whether the device exists
/// is the per-device table's check.)
pub(crate) fn device_arg(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    let index = obj.call_method0("__index__").map_err(|_| {
        PyTypeError::new_err(format!(
            "'{}' object cannot be interpreted as an integer",
            type_name(obj)
        ))
    })?;
    index.extract::<usize>().map_err(|_| {
        PyValueError::new_err(format!(
            "invalid argument `device`: device ordinal {index} is out of range"
        ))
    })
}

/// Why a bare unit (`4G`, `2k`, `1.5m`) is refused, for the error message: RMM's grammar needs
/// the `B`, and tools disagree on whether `G` means 2**30 (PyTorch's and CUDA's habit) or 10**9
/// (dask's); empty for any other text.
fn bare_unit_hint(text: &str) -> &'static str {
    let unit = text
        .trim()
        .trim_start_matches(|c: char| c.is_ascii_digit() || c == '.')
        .trim_start();
    match unit.to_ascii_lowercase().as_str() {
        "k" | "m" | "g" | "t" | "p" | "ki" | "mi" | "gi" | "ti" | "pi" => {
            " (a bare unit is not a size: write 4GiB for 4 * 2**30 bytes or 4GB for 4 * 10**9)"
        }
        _ => "",
    }
}

/// `obj` in an error message: its type's name and a short repr (`float 1.5`, `str '16'`).
pub(crate) fn shown(obj: &Bound<'_, PyAny>) -> String {
    let text = obj
        .repr()
        .map_or_else(|_| "?".to_string(), |r| r.to_string());
    let text = match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    };
    format!("{} {text}", type_name(obj))
}

/// A size text read by RMM's grammar; `name` is the argument it was given for (`None`:
/// `parse_bytes` itself, whose messages are RMM's).
fn size_text(text: &str, name: Option<&str>) -> PyResult<usize> {
    read_byte_spec(text).map_err(|why| {
        let given = name.map_or_else(String::new, |n| format!("{n}="));
        match why {
            NotASize::TooLarge => PyValueError::new_err(format!(
                "{given}'{text}' is too large: the largest size is {} bytes (2**64 - 1)",
                usize::MAX
            )),
            NotASize::Unparsable => PyValueError::new_err(format!(
                "Could not parse '{text}' as a byte specification{}{}",
                name.map_or_else(String::new, |n| format!(
                    " for {n}: give bytes (an int) or a size such as \"4GiB\", \"512 MiB\" \
                     or \"1.5GB\""
                )),
                bare_unit_hint(text)
            )),
        }
    })
}

/// A size argument: an int (negative, or past 2**64 - 1, is an OverflowError) or a byte string
/// such as `"4MiB"`; a float is a TypeError. Every refusal names the argument and the value.
pub(crate) fn bytes_arg(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    if obj.is_instance_of::<PyFloat>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an int or a byte string such as \"4MiB\", not {}",
            shown(obj)
        )));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return size_text(&s.extract::<String>()?, Some(name));
    }
    if obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyBool>() {
        return obj.extract::<usize>().map_err(|_| {
            PyOverflowError::new_err(format!(
                "{name} must be a non-negative size that fits in size_t, not {obj}{}",
                out_of_range(obj)
            ))
        });
    }
    // Anything with __index__ (numpy integers).
    match obj.call_method0("__index__") {
        Ok(i) => bytes_arg(&i, name),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{name} must be an int or a byte string such as \"4MiB\", not {}",
            shown(obj)
        ))),
    }
}

/// Why an int is no `size_t`, for a message: negative, or past 2**64 - 1.
fn out_of_range(int: &Bound<'_, PyAny>) -> String {
    if int.lt(0).unwrap_or(false) {
        " (negative: sizes are 0 or more bytes)".to_string()
    } else {
        format!(" (too big: at most {} bytes, 2**64 - 1)", usize::MAX)
    }
}

/// [`bytes_arg`] where `None` means "not given".
pub(crate) fn opt_bytes_arg(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<usize>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => bytes_arg(o, name).map(Some),
    }
}

/// A whole-number argument of RMM's (`size_t` and pointer arguments: `nbytes`, `ptr`,
/// `size`, ...): an int or an object with `__index__`, never a string or a float. Python's own
/// words start each message (what RMM's Cython says), then the argument, the value and what it
/// must be: `what` says it ("a number of bytes", "an address").
pub(crate) fn whole_arg(obj: &Bound<'_, PyAny>, name: &str, what: &str) -> PyResult<usize> {
    // Every DeviceBuffer takes this path: PyO3's own reading (an int, or `__index__` through
    // the C API) first; the refusals below only build their messages.
    if let Ok(value) = obj.extract::<usize>() {
        return Ok(value);
    }
    let int = obj.call_method0("__index__").map_err(|_| {
        PyTypeError::new_err(format!(
            "'{}' object cannot be interpreted as an integer: {name} must be {what} (an int), \
             not {}",
            type_name(obj),
            shown(obj)
        ))
    })?;
    int.extract::<usize>().map_err(|_| {
        let python = if int.lt(0).unwrap_or(false) {
            "can't convert negative int to unsigned"
        } else {
            "int too big to convert"
        };
        PyOverflowError::new_err(format!(
            "{python}: {name}={int} must be {what} from 0 to 2**64 - 1"
        ))
    })
}

/// Readers of RMM's whole-number arguments by name ([`whole_arg`]), for PyO3's
/// `from_py_with`: a refusal names the argument, which PyO3's own extraction does not.
pub(crate) mod arg {
    use pyo3::prelude::*;

    macro_rules! whole_readers {
        ($($name:ident: $what:literal),+ $(,)?) => {$(
            #[doc = concat!("The argument `", stringify!($name), "`: ", $what, ".")]
            pub(crate) fn $name(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
                super::whole_arg(obj, stringify!($name), $what)
            }
        )+};
    }

    /// The argument `simulate` (a simulated device's size: bytes or a size string; None: the
    /// GPU).
    pub(crate) fn simulate(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        super::opt_bytes_arg(Some(obj), "simulate")
    }

    whole_readers!(
        nbytes: "a number of bytes",
        size: "a number of bytes",
        new_size: "a number of bytes",
        new_capacity: "a number of bytes",
        count: "a number of bytes",
        ptr: "an address",
        db: "an address",
        d_src: "an address",
        d_dst: "an address",
        blocks_to_preallocate: "a number of blocks",
        target: "a number of bytes",
    );

    /// The optional argument `blocks_to_preallocate` (None: the default).
    pub(crate) fn opt_blocks_to_preallocate(obj: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
        if obj.is_none() {
            return Ok(None);
        }
        blocks_to_preallocate(obj).map(Some)
    }
}

/// `_read_size(value, name)`: the package's one size reader for Python code (the Dask plugin,
/// `reinitialize`, `HostBuffer`): [`bytes_arg`], naming `name` in every refusal.
#[pyfunction]
fn _read_size(value: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    bytes_arg(value, name)
}

/// `parse_bytes(s)`: an int is returned as is; a string is parsed as a byte specification.
#[pyfunction]
fn parse_bytes(s: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(text) = s.cast::<PyString>() {
        size_text(&text.extract::<String>()?, None)
    } else if s.is_instance_of::<PyInt>() {
        bytes_arg(s, "s")
    } else {
        Err(PyTypeError::new_err(format!(
            "parse_bytes expects a str or an int, not {}",
            s.get_type().name()?
        )))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(parse_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(_read_size, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    fn p(text: &str) -> Option<usize> {
        super::read_byte_spec(text).ok()
    }

    #[test]
    fn byte_specs_follow_rmm() {
        assert_eq!(p("4MiB"), Some(4 << 20));
        assert_eq!(p("2kib"), Some(2048));
        assert_eq!(p("2kb"), Some(2000));
        assert_eq!(p("2 KB"), Some(2000));
        assert_eq!(p("1.5KiB"), Some(1536));
        assert_eq!(p("100"), Some(100));
        assert_eq!(p("100b"), Some(100));
        assert_eq!(p("1."), Some(1));
        assert_eq!(p("2k"), None);
        assert_eq!(p("4G"), None);
        assert_eq!(p("4 gi"), None);
        assert_eq!(p(" 4GiB"), None);
        assert_eq!(p("1e3"), None);
        assert_eq!(p("4GiB\n"), Some(4 << 30));
        assert_eq!(p(".5kb"), None);
        assert_eq!(p("-1"), None);
        assert!(!super::bare_unit_hint("4G").is_empty());
        assert!(!super::bare_unit_hint("1.5 gi").is_empty());
        assert_eq!(super::bare_unit_hint("4XB"), "");
        assert_eq!(p("abc"), None);
        assert_eq!(p(""), None);
    }
}
