//! kiln-python: the native module `kiln._kiln` of the `kiln` Python package. A thin layer
//! over kiln-capi's session (the same calls the C ABI and the CLI make): NumPy arrays in and
//! out, DLPack for zero-copy sharing, kiln's errors as Python exceptions.

mod dlpack;
mod errors;
mod model;
mod program;
mod tensor;
mod thread_bound;

use pyo3::prelude::*;

#[pymodule]
fn _kiln(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    module.add("ABI_VERSION", kiln_capi::abi::KILN_ABI_VERSION)?;
    module.add("KilnError", py.get_type::<errors::KilnError>())?;
    module.add_class::<model::PyModel>()?;
    module.add_class::<model::PyPlan>()?;
    module.add_class::<program::PyProgram>()?;
    module.add_class::<tensor::PyTensor>()?;
    module.add_function(wrap_pyfunction!(model::load, module)?)?;
    module.add_function(wrap_pyfunction!(tensor::from_dlpack, module)?)?;
    Ok(())
}
