//! `rrmm._rrmm._stack_plan`: the steps of a stack kind (`crate::stack`), for
//! `python/rrmm/_stack.py` to build with the `rrmm.mr` classes.

use super::errors::py_result;
use crate::stack::{plan, Arg, StackOptions, Step, Target, KINDS};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

/// The steps of kind `kind` (bottom to top) as `(class name, keyword arguments)` pairs, on a
/// simulated device of `simulate` bytes or the current device. Raises ValueError for an
/// unknown kind or a bad option.
#[pyfunction]
#[pyo3(signature = (kind, *, simulate=None, initial_pool_size=None, maximum_pool_size=None, bins=None, block_size=None, blocks=None, arena_size=None, release_threshold=None, allocation_limit=None, logging=false, log_file=None, statistics=false, tracking=false, host_memory=None))]
#[allow(clippy::too_many_arguments)]
fn _stack_plan<'py>(
    py: Python<'py>,
    kind: &str,
    simulate: Option<usize>,
    initial_pool_size: Option<usize>,
    maximum_pool_size: Option<usize>,
    bins: Option<(u32, u32)>,
    block_size: Option<usize>,
    blocks: Option<usize>,
    arena_size: Option<usize>,
    release_threshold: Option<usize>,
    allocation_limit: Option<usize>,
    logging: bool,
    log_file: Option<String>,
    statistics: bool,
    tracking: bool,
    host_memory: Option<usize>,
) -> PyResult<Bound<'py, PyList>> {
    let options = StackOptions {
        initial_pool_size,
        maximum_pool_size,
        bins,
        block_size,
        blocks,
        arena_size,
        release_threshold,
        allocation_limit,
        logging,
        log_file,
        statistics,
        tracking,
        host_memory,
    };
    let plan = py_result(plan(kind, Target::from_simulate(simulate), &options))?;
    let steps = PyList::empty(py);
    for step in &plan.steps {
        steps.append(step_tuple(py, step)?)?;
    }
    Ok(steps)
}

/// A step as Python builds it: `(class, kwargs)`; a resource argument is such a pair itself
/// (steps nest one level: a fallback's alternate is a source resource).
fn step_tuple<'py>(py: Python<'py>, step: &Step) -> PyResult<Bound<'py, PyTuple>> {
    let kwargs = PyDict::new(py);
    for (name, value) in &step.args {
        match value {
            Arg::Int(v) => kwargs.set_item(name, v)?,
            Arg::OptInt(v) => kwargs.set_item(name, v)?,
            Arg::Exponent(v) => kwargs.set_item(name, v)?,
            Arg::Bool(v) => kwargs.set_item(name, v)?,
            Arg::Text(v) => kwargs.set_item(name, v)?,
            Arg::OptText(v) => kwargs.set_item(name, v)?,
            Arg::Resource(inner) => match inner
                .args
                .iter()
                .any(|(_, a)| matches!(a, Arg::Resource(_)))
            {
                // One level only: no recursion over nested steps.
                true => {
                    return Err(pyo3::exceptions::PyValueError::new_err(
                        "a stack step's resource argument has a resource argument itself",
                    ))
                }
                false => kwargs.set_item(name, step_tuple(py, inner)?)?,
            },
        }
    }
    PyTuple::new(
        py,
        [step.class.into_pyobject(py)?.into_any(), kwargs.into_any()],
    )
}

/// The stack kinds' names and one-line summaries.
#[pyfunction]
fn _stack_kinds() -> Vec<(&'static str, &'static str)> {
    KINDS.iter().map(|k| (k.name, k.summary)).collect()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_stack_plan, m)?)?;
    m.add_function(wrap_pyfunction!(_stack_kinds, m)?)?;
    Ok(())
}
