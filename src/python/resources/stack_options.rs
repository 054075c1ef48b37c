//! The stack options from Python, written once: every entry point that builds a stack kind
//! (`build_stack`, `_reinitialize`, `_check_stack`, `replay_logs`, `fit_logs`) takes them as
//! keyword arguments and reads them here into the one typed value, [`StackOptions`]; an unknown
//! name is a TypeError, as a misspelt keyword argument is. Sizes are read by the package's one
//! size reader (ints or strings such as `"4GiB"`); every refusal names the option and the value.

use super::convert::{bytes_arg, shown};
use crate::stack::StackOptions;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Reads `field` of [`StackOptions`] from `value` (None keeps the default): the sizes by
/// [`bytes_arg`], the others by their type, a refusal naming the option and the value.
macro_rules! read_options {
    ($out:ident, $key:expr, $value:expr;
     sizes: $($size:ident),+;
     others: $($field:ident),+ $(,)?) => {
        match $key {
            $(stringify!($size) => {
                if !$value.is_none() {
                    $out.$size = Some(bytes_arg(&$value, stringify!($size))?);
                }
            })+
            $(stringify!($field) => {
                if !$value.is_none() {
                    $out.$field = $value.extract().map_err(|e: PyErr| {
                        let py = $value.py();
                        let why = e.value(py).to_string();
                        PyErr::from_type(
                            e.get_type(py),
                            format!("{}={}: {why}", stringify!($field), shown(&$value)),
                        )
                    })?;
                }
            })+
            other => {
                return Err(PyTypeError::new_err(format!(
                    "unexpected keyword argument {other:?} (a stack option is one of: {})",
                    [$(stringify!($size)),+, $(stringify!($field)),+].join(", ")
                )))
            }
        }
    };
}

/// The options given as keyword arguments (`**options`), each by its field's name.
///
/// # Errors
/// TypeError for a name that is no option, or a value of the wrong type; ValueError or
/// OverflowError for a size that is not one.
pub(crate) fn stack_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<StackOptions> {
    let mut out = StackOptions::default();
    let Some(options) = options else {
        return Ok(out);
    };
    for (key, value) in options.iter() {
        let key: String = key.extract()?;
        read_options!(out, key.as_str(), value;
            sizes: initial_pool_size, maximum_pool_size, block_size, arena_size,
                release_threshold, allocation_limit, host_memory, peer_memory, spill_to_host;
            others: bins, blocks, logging, log_file, statistics, tracking, peer_device,
        );
    }
    Ok(out)
}
