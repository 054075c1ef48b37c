//! The stack options from Python, written once: every entry point that builds a stack kind
//! (`build_stack`, `_reinitialize`, `replay_logs`, `fit_logs`) takes them as keyword arguments
//! and reads them here into the one typed value, [`StackOptions`]; an unknown name is a
//! TypeError, as a misspelt keyword argument is.

use crate::stack::StackOptions;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Reads `field` of [`StackOptions`] from `value` (None keeps the default).
macro_rules! read_options {
    ($out:ident, $key:expr, $value:expr; $($field:ident),+ $(,)?) => {
        match $key {
            $(stringify!($field) => {
                if !$value.is_none() {
                    $out.$field = $value.extract()?;
                }
            })+
            other => {
                return Err(PyTypeError::new_err(format!(
                    "unexpected keyword argument {other:?} (a stack option is one of: {})",
                    [$(stringify!($field)),+].join(", ")
                )))
            }
        }
    };
}

/// The options given as keyword arguments (`**options`), each by its field's name.
///
/// # Errors
/// TypeError for a name that is no option, or a value of the wrong type.
pub(crate) fn stack_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<StackOptions> {
    let mut out = StackOptions::default();
    let Some(options) = options else {
        return Ok(out);
    };
    for (key, value) in options.iter() {
        let key: String = key.extract()?;
        read_options!(out, key.as_str(), value;
            initial_pool_size, maximum_pool_size, bins, block_size, blocks, arena_size,
            release_threshold, allocation_limit, logging, log_file, statistics, tracking,
            host_memory, peer_memory, peer_device, spill_to_host,
        );
    }
    Ok(out)
}
