//! kiln from Python: the `kiln._kiln` extension module behind the `kiln` package.

use pyo3::prelude::*;

#[pymodule]
fn _kiln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    kiln::session::register_backends();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
