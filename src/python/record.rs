//! Records of figures (structs that derive `serde::Serialize`) as Python dicts: the dict's keys
//! are the Rust fields' names, made from the struct's one declaration (a nested record marked
//! `#[serde(flatten)]` adds its keys; an enum is its name; `None` is `None`). Their TypedDicts
//! in `python/rrmm/_sleep_types.py` are checked against the same declarations
//! ([`_record_fields`], `tests/python/test_records.py`).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde::Serialize;
use serde_json::Value;

/// `value` as a Python object: objects as dicts, arrays as lists, numbers as int or float.
fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => pyo3::types::PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into_pyobject(py)?.into_any(),
            (None, Some(i)) => i.into_pyobject(py)?.into_any(),
            _ => n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let d = PyDict::new(py);
            for (k, v) in map {
                d.set_item(k, to_py(py, v)?)?;
            }
            d.into_any()
        }
    })
}

/// `record` as a dict of its fields.
///
/// # Errors
/// A record that is not a struct of named fields (a programming error) is a `RuntimeError`.
pub(crate) fn record_dict<'py, T: Serialize>(
    py: Python<'py>,
    record: &T,
) -> PyResult<Bound<'py, PyDict>> {
    let value = serde_json::to_value(record)
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    to_py(py, &value)?
        .cast_into::<PyDict>()
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("a record is not a struct"))
}

/// The keys of `T`'s dicts, in declaration order.
fn fields_of<T: Serialize + Default>() -> Vec<String> {
    match serde_json::to_value(T::default()) {
        Ok(Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// The keys of the dicts of the record named `name` (`"SleepEstimate"`, `"SleepReport"`,
/// `"PromoteReport"`, `"SpillFigures"`, `"Movement"`, `"SupplyFigures"`, `"FallbackCounts"`,
/// `"TierCounts"`), for the test that checks their TypedDicts; `None` for another name.
#[pyfunction]
pub(crate) fn _record_fields(name: &str) -> Option<Vec<String>> {
    use crate::adaptor::{FallbackCounts, TierCounts};
    use crate::resource::host_pages::mapped::{PromoteReport, SpillFigures};
    use crate::resource::host_pages::registered::SupplyFigures;
    use crate::resource::sleep::{Movement, SleepEstimate, SleepReport};
    Some(match name {
        "SleepEstimate" => fields_of::<SleepEstimate>(),
        "SleepReport" => fields_of::<SleepReport>(),
        "PromoteReport" => fields_of::<PromoteReport>(),
        "SpillFigures" => fields_of::<SpillFigures>(),
        "Movement" => fields_of::<Movement>(),
        "SupplyFigures" => fields_of::<SupplyFigures>(),
        "FallbackCounts" => fields_of::<FallbackCounts>(),
        "TierCounts" => fields_of::<TierCounts>(),
        _ => return None,
    })
}

crate::python::register_items!(functions: _record_fields;);
