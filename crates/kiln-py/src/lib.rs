//! kiln from Python: the `kiln._kiln` extension module behind the `kiln` package
//! (`python/kiln`). Every call that compiles, launches, waits or copies releases the GIL,
//! every object is shareable between threads, and every failure is a `kiln.Error` (Rust
//! panics included).
//!
//! The package sits on top of kiln (see `docs/architecture.md`): it registers the backends
//! through `kiln-backends` (those of its features, every one by default), launches through
//! `kiln-device` and replays through `kiln-runtime`;
//! the Rust crates below it know nothing of Python. Its modules: `device` (`kiln.Device`,
//! `kiln.devices()`), `buffer` (`kiln.Buffer`: numpy copies, zero-copy views), `dlpack`
//! (export and `kiln.from_dlpack`), `kernel` (`kiln.Kernel`), `plan` (`kiln.Plan`,
//! `kiln.PlanRun`), `channel` (`kiln.Channel`, the ranks a plan's collectives combine),
//! `saved` (`kiln.load_plan`, `kiln.LoadedPlan`: saved plan files), `dtype` (element types between kiln,
//! numpy and DLPack) and `errors` (one exception per
//! `kiln_device::ErrorClass`, under `kiln.Error`). The stubs in `python/kiln/_kiln.pyi`
//! document every call; `pip install ./crates/kiln-py` (maturin) builds the package and
//! `pytest crates/kiln-py/tests` tests it. The package's pure-Python `kiln.tinygrad`
//! (`python/kiln/tinygrad`) is tinygrad 0.14.0's `KILN` device (`DEV=KILN`), registered at
//! start-up by the wheel's `kiln-tinygrad.pth`. From the repository root:
//!
//! ```python
//! import kiln, numpy as np
//!
//! dev = kiln.Device("CPU")                        # or "OPENCL:0", "CUDA:0"
//! add = dev.compile("examples/kernels/add.kiln")  # a path, or the kernel text itself
//! a = dev.from_numpy(np.ones(8, np.float32))
//! b = dev.from_numpy(np.arange(8, dtype=np.float32))
//! c = dev.empty("f32", 8)
//! add(a, b, c, n=8)                               # buffers in slot order, variables by name
//! print(c.numpy())                                # [1. 2. 3. 4. 5. 6. 7. 8.]
//!
//! plan = kiln.Plan(dev)                           # record once, replay with new values
//! plan.launch(add, [a, b, c], {"n": 8})
//! plan.run(n=4)
//!
//! try:
//!     add(a, b, c, n=9)                           # longer than the 8-element buffers
//! except kiln.LaunchError as e:                   # every kiln failure is a kiln.Error
//!     print(e)
//! ```
//!
//! Collectives are plan nodes over a `kiln.Channel`, one end per rank; each rank has its own
//! plan (here the CPU's virtual devices `CPU:1` .. `CPU:63`, each with its own threads), and
//! the ranks' plans run at once, since a collective waits for every rank:
//!
//! ```python
//! devs = [kiln.Device(f"CPU:{r}") for r in range(4)]
//! ends = kiln.Channel.local(4, timeout=10)        # rank 0 first
//! bufs = [d.from_numpy(np.full(8, r, np.float32)) for r, d in enumerate(devs)]
//! plans = [kiln.Plan(d) for d in devs]
//! for plan, end, buf in zip(plans, ends, bufs):
//!     plan.all_reduce(end, buf, op="sum")         # in place; also all_gather, reduce_scatter,
//! for run in [p.run_async() for p in plans]:      # broadcast, send / recv
//!     run.wait()                                  # a missing rank: ChannelError at the timeout
//! print(bufs[3].numpy())                          # [6. 6. 6. 6. 6. 6. 6. 6.]
//! ```

mod buffer;
mod channel;
mod device;
mod dlpack;
mod dtype;
mod errors;
mod kernel;
mod plan;
mod saved;

use pyo3::prelude::*;

/// Every device of every backend this build has, available or not (and why not).
#[pyfunction]
fn devices(py: Python<'_>) -> PyResult<Vec<device::DeviceInfo>> {
    device::devices(py)
}

/// The backends this build registers, in registration order (`CPU` first): the names of
/// their devices, without an ordinal. Opens nothing.
#[pyfunction]
fn backends() -> Vec<&'static str> {
    kiln_device::backends().iter().map(|b| b.name).collect()
}

/// A buffer sharing `x`'s memory (any DLPack tensor, e.g. a numpy array) when the device can
/// use it in place, else a copy on it; the device is the CPU unless given.
#[pyfunction]
#[pyo3(signature = (x, device=None))]
fn from_dlpack(py: Python<'_>, x: &Bound<'_, PyAny>, device: Option<&device::PyDevice>) -> PyResult<buffer::PyBuffer> {
    buffer::from_dlpack(py, x, device.map(|d| d.get().cloned()).transpose()?)
}

/// Waits for the work made from Python that is still in flight: `run_async` runs (up to a
/// minute) and launches on every device. `kiln` registers it with `atexit`, so that no
/// driver thread runs kiln's work while the interpreter unloads the driver's library. Every
/// channel is broken first: a run whose collective waits for a peer that will not come now
/// (this process is ending) stops at once instead of at the channel's timeout.
#[pyfunction]
fn _drain(py: Python<'_>) {
    py.detach(|| {
        channel::stop_all("the Python interpreter is exiting");
        plan::wait_for_runs(std::time::Duration::from_secs(60));
        kiln_runtime::LaunchStream::drain_all();
    });
}

/// Panics inside a guarded call: tests that a Rust panic reaches Python as `kiln.Error`.
#[pyfunction]
fn _panic_for_test(py: Python<'_>) -> PyResult<()> {
    errors::detached(py, None, || -> Result<(), errors::Failure> { panic!("a test panic") })
}

/// Raises the exception of a representative kiln error of each kind (`driver`, `timeout`,
/// `fatal_driver`, `chained_oom`): tests that every error class maps to its exception, for
/// the failures a test cannot cause on demand.
#[pyfunction]
fn _raise_for_test(py: Python<'_>, kind: &str) -> PyResult<()> {
    use kiln_device::Error;
    use std::sync::Arc;
    let e = match kind {
        "driver" => Error::driver("CPU", "a test failure"),
        "timeout" => Error::Timeout { target: 2, current: 1, waited_ms: 5 },
        "fatal_driver" => Error::Driver { backend: "CPU", code: Some(-1), fatal: true, message: "gone".into() },
        "chained_oom" => Error::QueueFailed {
            device: "CPU".into(),
            cause: Arc::new(Error::SignalFailed(Arc::new(Error::OutOfMemory {
                device: "CPU".into(),
                requested: 64,
                in_use: 0,
                cached: 0,
                budget: Some(32),
            }))),
        },
        other => return Err(errors::invalid_arg(py, format!("no test error `{other}`"))),
    };
    Err(errors::raise(py, e))
}

#[pymodule]
fn _kiln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    kiln_backends::register_all();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_class::<device::PyDevice>()?;
    m.add_class::<device::DeviceInfo>()?;
    m.add_class::<buffer::PyBuffer>()?;
    m.add_class::<channel::PyChannel>()?;
    m.add_class::<kernel::PyKernel>()?;
    m.add_class::<plan::PyPlan>()?;
    m.add_class::<plan::PlanRun>()?;
    m.add_class::<saved::PyLoadedPlan>()?;
    m.add_class::<saved::PyTensorSpec>()?;
    m.add_class::<saved::PyPlanVariable>()?;
    m.add_function(wrap_pyfunction!(saved::load_plan, m)?)?;
    m.add_function(wrap_pyfunction!(backends, m)?)?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    m.add_function(wrap_pyfunction!(from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(_drain, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    m.add_function(wrap_pyfunction!(_raise_for_test, m)?)?;
    m.add("DTYPES", kiln_ir::Scalar::ALL.map(|s| s.name()).to_vec())?;
    m.add("MAX_LOCAL_BYTES", kiln_ir::MAX_LOCAL_BYTES)?;
    Ok(())
}
