//! Saved plans from Python: `kiln.load_plan` loads a plan file (`kiln_runtime::saved`) on a
//! device as a `kiln.LoadedPlan`, called with arrays by input name and returning numpy arrays by
//! output name; `kiln.Plan.save` (in `plan`) writes one. Nothing here imports a compiler: a plan
//! file is all a model needs.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kiln_device::Device;
use kiln_ir::Scalar;
use kiln_runtime::ExecutionPlan;
use kiln_runtime::saved::{
    Dim, HostTensor, LoadOptions, LoadStats, LoadedPlan, PlanFileError, PlanInterface, PlanTensor, PlanVariable,
    SavedPlan, TensorRef, TensorSpec,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::buffer::{PyBuffer, host_array, numpy};
use crate::device::PyDevice;
use crate::dlpack::Imported;
use crate::dtype;
use crate::errors::{Failure, detached, invalid_arg, raise};

/// A named input or output of a loaded plan: its dtype and its shape, where a dimension that is
/// a plan variable is its name.
#[pyclass(frozen, name = "TensorSpec", module = "kiln", get_all)]
pub struct PyTensorSpec {
    /// The tensor's name.
    name: String,
    /// Its element type, as a kiln name (`"f32"`).
    dtype: &'static str,
    /// Its shape: an int per fixed dimension, a plan variable's name per variable one.
    shape: Vec<Py<PyAny>>,
}

#[pymethods]
impl PyTensorSpec {
    fn __repr__(&self, py: Python<'_>) -> String {
        let dims: Vec<String> = self.shape.iter().map(|d| d.bind(py).to_string()).collect();
        format!("<kiln.TensorSpec {} {} [{}]>", self.name, self.dtype, dims.join(", "))
    }
}

impl PyTensorSpec {
    fn new(py: Python<'_>, spec: &TensorSpec) -> PyResult<PyTensorSpec> {
        let shape = spec
            .shape
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => Ok(n.into_pyobject(py)?.into_any().unbind()),
                Dim::Var(v) => Ok(PyString::new(py, v).into_any().unbind()),
            })
            .collect::<PyResult<_>>()?;
        Ok(PyTensorSpec { name: spec.name.clone(), dtype: spec.dtype.name(), shape })
    }
}

/// A plan variable of a loaded plan: the value it was saved with (a run that does not bind it
/// uses that) and the range its kernels accept.
#[pyclass(frozen, name = "PlanVariable", module = "kiln", get_all)]
pub struct PyPlanVariable {
    /// Its name.
    name: String,
    /// The value it was saved with.
    value: i64,
    /// The smallest value every kernel that uses it accepts.
    min: i64,
    /// The largest.
    max: i64,
}

#[pymethods]
impl PyPlanVariable {
    fn __repr__(&self) -> String {
        format!("<kiln.PlanVariable {} = {} in [{}, {}]>", self.name, self.value, self.min, self.max)
    }
}

impl From<&PlanVariable> for PyPlanVariable {
    fn from(v: &PlanVariable) -> PyPlanVariable {
        PyPlanVariable { name: v.name.clone(), value: v.value, min: v.min, max: v.max }
    }
}

/// A saved plan loaded on a device (`kiln.load_plan`): call it with arrays by input name.
#[pyclass(frozen, name = "LoadedPlan", module = "kiln")]
pub struct PyLoadedPlan {
    /// The plan; runs take turns.
    plan: Mutex<LoadedPlan>,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    variables: Vec<PlanVariable>,
    device: String,
    stats: LoadStats,
    path: PathBuf,
    /// Seconds `load_plan` took (checks, compiles, recording).
    load_seconds: f64,
}

/// The device a plan loads on: a `kiln.Device`, or a device name; `compiler` makes the pair of
/// that name the default.
fn device_arg(py: Python<'_>, device: &Bound<'_, PyAny>, compiler: Option<&str>) -> PyResult<Arc<Device>> {
    if let Ok(d) = device.cast::<PyDevice>() {
        let dev = d.get().get()?.clone();
        return match compiler {
            None => Ok(dev),
            Some(pair) => detached(py, None, || Ok(Arc::new(dev.with_default_compiler(pair)?))),
        };
    }
    let name: String = device.extract().map_err(|_| {
        invalid_arg(py, format!("device is a kiln.Device or a device name such as \"CPU\", got {}", device.get_type()))
    })?;
    crate::device::open(py, &name, compiler)
}

/// A path argument: `str` or `os.PathLike`.
pub fn path_arg(py: Python<'_>, what: &str, path: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
    path.extract::<PathBuf>()
        .map_err(|_| invalid_arg(py, format!("{what} is a path (str or os.PathLike), got {}", path.get_type())))
}

/// Loads the plan file at `path` on `device` (see the stubs).
#[pyfunction]
#[pyo3(signature = (path, device=None, *, compiler=None, strict_bounds=false, map_constants=true))]
pub fn load_plan(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
    device: Option<&Bound<'_, PyAny>>,
    compiler: Option<String>,
    strict_bounds: bool,
    map_constants: bool,
) -> PyResult<PyLoadedPlan> {
    let path = path_arg(py, "the plan", path)?;
    let device = match device {
        Some(d) => device_arg(py, d, compiler.as_deref())?,
        None => crate::device::open(py, "CPU", compiler.as_deref())?,
    };
    let options = LoadOptions { strict_bounds, map_constants, ..LoadOptions::default() };
    let start = Instant::now();
    let plan = detached(py, None, || Ok(LoadedPlan::load_with(&path, &device, &options)?))?;
    let load_seconds = start.elapsed().as_secs_f64();
    Ok(PyLoadedPlan {
        inputs: plan.inputs().cloned().collect(),
        outputs: plan.outputs().cloned().collect(),
        variables: plan.variables().to_vec(),
        device: plan.device().to_string(),
        stats: plan.stats().clone(),
        plan: Mutex::new(plan),
        path,
        load_seconds,
    })
}

/// A `PlanInputError` for input `name`.
fn input_error(py: Python<'_>, name: &str, message: String) -> PyErr {
    raise(py, PlanFileError::Input { name: name.to_string(), message })
}

/// Input `name` as host memory the run can read: a DLPack tensor (a numpy array) in place when
/// it is contiguous host memory, else a contiguous copy made by numpy (lists, strided arrays).
fn input_arg(py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<Imported> {
    let direct = if value.hasattr("__dlpack__")? { Some(Imported::take(value)) } else { None };
    let imported = match direct {
        Some(Ok(t)) => t,
        // numpy copies what DLPack cannot give in place (a strided array); a tensor numpy
        // cannot take either is reported with DLPack's reason.
        Some(Err(e)) => host_array(value).map_err(|_| input_error(py, name, reason(py, &e)))?,
        None => host_array(value).map_err(|e| input_error(py, name, reason(py, &e)))?,
    };
    if !imported.on_host() {
        return Err(input_error(
            py,
            name,
            format!(
                "its memory is on DLPack device {:?}, not the host: pass host memory (a numpy array)",
                imported.device
            ),
        ));
    }
    Ok(imported)
}

/// The message of a conversion's error, without its class's prefix.
fn reason(py: Python<'_>, e: &PyErr) -> String {
    let text = e.value(py).to_string();
    text.strip_prefix("invalid argument: ").map_or(text.clone(), str::to_string)
}

/// `out` as a numpy array of its shape (bf16, which numpy lacks, as uint16 holding its bits).
fn output_array<'py>(py: Python<'py>, out: &HostTensor) -> PyResult<Bound<'py, PyAny>> {
    let name = dtype::numpy_name(out.dtype).unwrap_or(if out.dtype == Scalar::BF16 { "uint16" } else { "uint8" });
    let shape = PyTuple::new(py, &out.shape)?;
    let array = numpy(py)?.getattr("empty")?.call1((shape, name))?;
    let mut target = Imported::take(&array)?;
    // SAFETY: `array` was just made and is referenced nowhere else while it is filled.
    let bytes = unsafe { target.bytes_mut() }.ok_or_else(|| invalid_arg(py, "numpy.empty is not writable"))?;
    if bytes.len() != out.data.len() {
        return Err(invalid_arg(
            py,
            format!("output `{}`: {} bytes for a numpy array of {}", out.name, out.data.len(), bytes.len()),
        ));
    }
    bytes.copy_from_slice(&out.data);
    Ok(array)
}

impl PyLoadedPlan {
    /// Runs with `inputs` (name, value) and `vars`; returns the outputs by name.
    fn run_inputs<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<(String, Bound<'py, PyAny>)>,
        vars: Vec<(String, i64)>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut arrays = Vec::with_capacity(inputs.len());
        for (name, value) in &inputs {
            if !self.inputs.iter().any(|t| &t.name == name) {
                // Named before any conversion, as the loader names it.
                let known: Vec<String> =
                    self.inputs.iter().map(|t| format!("{} {} {}", t.name, t.dtype, t.shape_text())).collect();
                let known = if known.is_empty() { "none".to_string() } else { known.join(", ") };
                return Err(input_error(py, name, format!("the plan has no input of this name (its inputs: {known})")));
            }
            arrays.push((name.as_str(), input_arg(py, name, value)?));
        }
        let plan = &self.plan;
        let outs = detached(py, None, || {
            let refs = arrays
                .iter()
                .map(|(name, a)| {
                    let data = a
                        .bytes()
                        .ok_or_else(|| Failure::from(kiln_device::Error::Invalid("not host memory".into())))?;
                    Ok((*name, TensorRef { dtype: a.scalar, shape: &a.shape, data }))
                })
                .collect::<Result<Vec<_>, Failure>>()?;
            let vars: Vec<(&str, i64)> = vars.iter().map(|(n, v)| (n.as_str(), *v)).collect();
            let mut plan = plan.lock().unwrap_or_else(|p| p.into_inner());
            Ok(plan.run_with(&refs, &vars)?)
        })?;
        let result = PyDict::new(py);
        for out in &outs {
            result.set_item(&out.name, output_array(py, out)?)?;
        }
        Ok(result)
    }
}

/// `(name, value)` pairs from a mapping argument and keyword arguments; a name in both is an
/// error.
fn named_inputs<'py>(
    py: Python<'py>,
    inputs: Option<&Bound<'py, PyAny>>,
    named: Option<&Bound<'py, PyDict>>,
) -> PyResult<Vec<(String, Bound<'py, PyAny>)>> {
    let mut out: Vec<(String, Bound<'py, PyAny>)> = Vec::new();
    let mut add = |k: Bound<'py, PyAny>, v: Bound<'py, PyAny>| -> PyResult<()> {
        let name: String =
            k.extract().map_err(|_| invalid_arg(py, format!("inputs are named by strings, got {}", k.get_type())))?;
        if out.iter().any(|(n, _)| *n == name) {
            return Err(input_error(py, &name, "given more than once".into()));
        }
        out.push((name, v));
        Ok(())
    };
    if let Some(m) = inputs.filter(|m| !m.is_none()) {
        let items = m.call_method0("items").map_err(|_| {
            invalid_arg(py, format!("inputs are a mapping of names to arrays (a dict), got {}", m.get_type()))
        })?;
        for item in items.try_iter()? {
            let (k, v): (Bound<'py, PyAny>, Bound<'py, PyAny>) = item?.extract()?;
            add(k, v)?;
        }
    }
    if let Some(d) = named {
        for (k, v) in d.iter() {
            add(k, v)?;
        }
    }
    Ok(out)
}

#[pymethods]
impl PyLoadedPlan {
    /// `plan(x=array)` or `plan({"x": array})`: runs the plan (see the stubs).
    #[pyo3(signature = (inputs=None, /, **named))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        inputs: Option<&Bound<'py, PyAny>>,
        named: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let inputs = named_inputs(py, inputs, named)?;
        self.run_inputs(py, inputs, Vec::new())
    }

    /// Runs the plan on `inputs` with plan variables `vars` bound by name.
    #[pyo3(signature = (inputs, *, vars=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyAny>,
        vars: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let inputs = named_inputs(py, Some(inputs), None)?;
        let vars = match crate::kernel::vars_dict(py, vars)? {
            None => Vec::new(),
            Some(d) => d
                .iter()
                .map(|(k, v)| {
                    let value = crate::kernel::var_value(py, &k, &v)?;
                    let name: String = k.extract().map_err(|_| invalid_arg(py, "variables are named by strings"))?;
                    Ok((name, value))
                })
                .collect::<PyResult<_>>()?,
        };
        self.run_inputs(py, inputs, vars)
    }

    /// The inputs, in the order they were saved.
    #[getter]
    fn inputs(&self, py: Python<'_>) -> PyResult<Vec<PyTensorSpec>> {
        self.inputs.iter().map(|t| PyTensorSpec::new(py, t)).collect()
    }

    /// The outputs, in the order they were saved.
    #[getter]
    fn outputs(&self, py: Python<'_>) -> PyResult<Vec<PyTensorSpec>> {
        self.outputs.iter().map(|t| PyTensorSpec::new(py, t)).collect()
    }

    /// The plan variables.
    #[getter]
    fn variables(&self) -> Vec<PyPlanVariable> {
        self.variables.iter().map(PyPlanVariable::from).collect()
    }

    /// The device the plan runs on.
    #[getter]
    fn device(&self) -> &str {
        &self.device
    }

    /// The file it was loaded from.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// What loading did (see the stubs).
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = &self.stats;
        let d = PyDict::new(py);
        d.set_item("file_bytes", s.file_bytes)?;
        d.set_item("kernels", s.kernels)?;
        d.set_item("nodes", s.nodes)?;
        d.set_item("constant_bytes", s.constant_bytes)?;
        d.set_item("mapped_bytes", s.mapped_bytes)?;
        d.set_item("load_seconds", self.load_seconds)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        let list = |specs: &[TensorSpec]| {
            specs.iter().map(|t| format!("{} {} {}", t.name, t.dtype, t.shape_text())).collect::<Vec<_>>().join(", ")
        };
        format!(
            "<kiln.LoadedPlan {} on {}: inputs ({}) -> outputs ({})>",
            self.path.display(),
            self.device,
            list(&self.inputs),
            list(&self.outputs)
        )
    }
}

/// One entry of `Plan.save`'s `inputs` or `outputs`: a buffer (one-dimensional, all of it) or a
/// `(buffer, shape)` pair, the shape's entries ints or plan variable names.
fn plan_tensor(py: Python<'_>, kind: &str, name: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<PlanTensor> {
    let name: String =
        name.extract().map_err(|_| invalid_arg(py, format!("{kind} names are strings, got {}", name.get_type())))?;
    let usage = || {
        invalid_arg(
            py,
            format!(
                "{kind} `{name}` is a kiln.Buffer or a (kiln.Buffer, shape) pair, the shape a sequence of ints and variable names"
            ),
        )
    };
    if let Ok(b) = value.cast::<PyBuffer>() {
        return Ok(PlanTensor::new(name, &b.get().buf));
    }
    let (buffer, shape): (Bound<'_, PyAny>, Bound<'_, PyAny>) = value.extract().map_err(|_| usage())?;
    let buffer = buffer.cast::<PyBuffer>().map_err(|_| usage())?.get().buf.clone();
    let mut dims = Vec::new();
    for d in shape.try_iter().map_err(|_| usage())? {
        let d = d?;
        if let Ok(s) = d.cast::<PyString>() {
            dims.push(Dim::Var(s.to_cow()?.into_owned()));
        } else {
            let n = crate::buffer::size_arg(py, &format!("a dimension of {kind} `{name}`"), &d)?;
            dims.push(Dim::Fixed(n as u64));
        }
    }
    Ok(PlanTensor { name, buffer, shape: dims })
}

/// The entries of a `Plan.save` mapping.
fn plan_tensors(py: Python<'_>, kind: &str, map: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<PlanTensor>> {
    let Some(map) = map.filter(|m| !m.is_none()) else { return Ok(Vec::new()) };
    let items = map.call_method0("items").map_err(|_| {
        invalid_arg(py, format!("{kind}s are a mapping of names to buffers (a dict), got {}", map.get_type()))
    })?;
    let mut out = Vec::new();
    for item in items.try_iter()? {
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
        out.push(plan_tensor(py, kind, &k, &v)?);
    }
    Ok(out)
}

/// Saves `plan` with the named `inputs` and `outputs` to `path`; returns the file's size.
pub fn save(
    py: Python<'_>,
    plan: &Mutex<ExecutionPlan>,
    path: &Bound<'_, PyAny>,
    inputs: Option<&Bound<'_, PyAny>>,
    outputs: Option<&Bound<'_, PyAny>>,
) -> PyResult<u64> {
    let path = path_arg(py, "the plan file", path)?;
    let io =
        PlanInterface { inputs: plan_tensors(py, "input", inputs)?, outputs: plan_tensors(py, "output", outputs)? };
    detached(py, None, || {
        let plan = plan.lock().unwrap_or_else(|p| p.into_inner());
        Ok(SavedPlan::save(&plan, &io, &path)?)
    })
}
