//! The Python extension module `rrmm._rrmm` (cargo feature `python`): the only code that knows
//! about Python. Each file registers its classes and functions with `register`.

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _rrmm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
