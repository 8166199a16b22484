//! `kiln.Kernel`: a compiled kernel, launched by calling it.
//!
//! The call is the hot path (`py_call_tiny`): the variables' names are interned Python
//! strings made once per kernel, so binding `n=1024` is a pointer comparison per keyword; the
//! buffers are borrowed from their Python objects without reference counting, on the stack
//! for kernels of up to [`INLINE`] buffers; and the GIL is released only around the launch.

use std::sync::Arc;

use kiln_device::{Buffer, Device, Kernel};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::buffer::PyBuffer;
use crate::errors::{detached, invalid_arg};
use kiln_runtime::LaunchStream;

/// Kernels with at most this many buffers launch without a heap allocation for them.
const INLINE: usize = 8;

/// A compiled kernel. Call it with its buffers in slot order and its variables by name:
/// `kernel(a, b, out, n=1024)`.
#[pyclass(frozen, name = "Kernel", module = "kiln")]
pub struct PyKernel {
    pub kernel: Kernel,
    /// The kernel text, so errors can name the line of the node they report.
    pub text: Option<Arc<str>>,
    /// `var_names` as interned strings: a keyword argument of the same name is usually the
    /// same object.
    keys: Vec<Py<PyString>>,
    /// The device's queue when its launches are asynchronous; `None` launches on the
    /// calling thread.
    stream: Option<Arc<LaunchStream>>,
}

impl PyKernel {
    pub fn new(py: Python<'_>, kernel: Kernel, device: &Arc<Device>, text: Option<Arc<str>>) -> PyResult<PyKernel> {
        let keys = kernel.spec.var_names.iter().map(|n| PyString::intern(py, n).unbind()).collect();
        if let Some(text) = &text {
            crate::errors::remember(&kernel.spec.name, text);
        }
        Ok(PyKernel { kernel, text, keys, stream: LaunchStream::of(device) })
    }

    /// The variables' values in `var_names` order, from keyword arguments.
    pub fn bind(&self, py: Python<'_>, vars: Option<&Bound<'_, PyDict>>, vals: &mut [i64]) -> PyResult<()> {
        bind(py, &self.kernel.spec.name, &self.keys, vars, vals)
    }

    fn run(
        &self,
        py: Python<'_>,
        buffers: &[Bound<'_, PyAny>],
        vars: Option<&Bound<'_, PyDict>>,
        reinterpret: bool,
    ) -> PyResult<()> {
        let mut vals = [0i64; INLINE];
        let mut heap_vals;
        let vals: &mut [i64] = if self.keys.len() <= INLINE {
            &mut vals[..self.keys.len()]
        } else {
            heap_vals = vec![0; self.keys.len()];
            &mut heap_vals
        };
        self.bind(py, vars, vals)?;
        let first = match buffers.first() {
            Some(b) => Some(buffer_arg(py, b)?),
            None => None,
        };
        let mut inline: [&Buffer; INLINE];
        let heap: Vec<&Buffer>;
        let bufs: &[&Buffer] = match first {
            None => &[],
            Some(first) if buffers.len() <= INLINE => {
                inline = [first; INLINE];
                for (slot, b) in inline.iter_mut().zip(buffers).skip(1) {
                    *slot = buffer_arg(py, b)?;
                }
                &inline[..buffers.len()]
            }
            Some(_) => {
                heap = buffers.iter().map(|b| buffer_arg(py, b)).collect::<PyResult<_>>()?;
                &heap
            }
        };
        let views: Vec<Buffer>;
        let view_refs: Vec<&Buffer>;
        let bufs = if reinterpret {
            views = self.as_params(py, bufs)?;
            view_refs = views.iter().collect();
            &view_refs[..]
        } else {
            bufs
        };
        let kernel = &self.kernel;
        let vals = &*vals;
        detached(py, self.text.as_deref(), || match &self.stream {
            Some(stream) => Ok(stream.launch(kernel, bufs, vals)?),
            None => Ok(kernel.launch(bufs, vals)?),
        })
    }
}

impl PyKernel {
    /// `bufs` (one per parameter, in slot order) each viewed as its parameter's dtype.
    fn as_params(&self, py: Python<'_>, bufs: &[&Buffer]) -> PyResult<Vec<Buffer>> {
        let params = &self.kernel.spec.params;
        if bufs.len() != params.len() {
            return Err(invalid_arg(
                py,
                format!("`{}` takes {} buffers, got {}", self.kernel.spec.name, params.len(), bufs.len()),
            ));
        }
        bufs.iter()
            .zip(params)
            .map(|(b, p)| {
                b.reinterpret(p.scalar).map_err(|e| {
                    invalid_arg(py, format!("buffer for slot {} of `{}`: {e}", p.slot, self.kernel.spec.name))
                })
            })
            .collect()
    }
}

/// Binds keyword arguments to positional values by the interned `keys`.
fn bind(
    py: Python<'_>,
    kernel: &str,
    keys: &[Py<PyString>],
    vars: Option<&Bound<'_, PyDict>>,
    vals: &mut [i64],
) -> PyResult<()> {
    let given = vars.map_or(0, |d| d.len());
    let mut found = 0;
    if let Some(vars) = vars {
        for (k, v) in vars.iter() {
            let at = match keys.iter().position(|key| key.as_ptr() == k.as_ptr()) {
                Some(i) => i,
                None => keys.iter().position(|key| k.eq(key.bind(py)).unwrap_or(false)).ok_or_else(|| {
                    let names: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
                    invalid_arg(py, format!("`{kernel}` has no variable `{k}` (its variables: {})", names.join(", ")))
                })?,
            };
            vals[at] = var_value(py, &k, &v)?;
            found += 1;
        }
    }
    if found < keys.len() || given < keys.len() {
        let missing = keys
            .iter()
            .find(|key| vars.is_none_or(|d| !d.contains(key.bind(py)).unwrap_or(false)))
            .map(|k| k.to_string())
            .unwrap_or_default();
        return Err(invalid_arg(
            py,
            format!("variable `{missing}` of `{kernel}` has no value: pass it as a keyword, e.g. {missing}=N"),
        ));
    }
    Ok(())
}

/// A launch's variables: a dict of names to ints (or nothing).
pub fn vars_dict<'py>(py: Python<'py>, vars: Option<&Bound<'py, PyAny>>) -> PyResult<Option<Bound<'py, PyDict>>> {
    vars.map(|v| {
        v.cast::<PyDict>().cloned().map_err(|_| {
            invalid_arg(
                py,
                format!("variables are a dict of names to ints, e.g. {{\"n\": 1024}}, got {}", v.get_type()),
            )
        })
    })
    .transpose()
}

/// The value of variable `name` from a Python object: an int that fits i64 (kiln's variables
/// are 64-bit; each kernel's own bounds are checked at launch).
pub fn var_value(py: Python<'_>, name: &Bound<'_, PyAny>, v: &Bound<'_, PyAny>) -> PyResult<i64> {
    v.extract().map_err(|_| {
        let message = if v.is_instance_of::<pyo3::types::PyInt>() {
            format!("variable `{name}` = {v} does not fit a 64-bit integer (kiln's variables are i64)")
        } else {
            let ty = v.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            format!("variable `{name}` must be an int, got {ty}")
        };
        invalid_arg(py, message)
    })
}

/// A launch argument as a kiln buffer, borrowed from its Python object.
fn buffer_arg<'a>(py: Python<'_>, b: &'a Bound<'_, PyAny>) -> PyResult<&'a Buffer> {
    match b.cast::<PyBuffer>() {
        Ok(buf) => Ok(&buf.get().buf),
        Err(_) => Err(invalid_arg(
            py,
            format!(
                "launch arguments are kiln.Buffer objects, got {}; wrap arrays with dev.from_numpy() or kiln.from_dlpack()",
                b.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            ),
        )),
    }
}

#[pymethods]
impl PyKernel {
    /// Launches the kernel on `buffers` (in slot order) with its variables by keyword. On a
    /// host device (the CPU) it has run when the call returns; on OpenCL, CUDA and WebGPU it
    /// is queued, and reading a buffer or `Device.synchronize()` waits for it.
    #[pyo3(signature = (*buffers, **vars))]
    fn __call__(&self, py: Python<'_>, buffers: &Bound<'_, PyTuple>, vars: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        let items: Vec<Bound<'_, PyAny>> = buffers.iter().collect();
        self.run(py, &items, vars, false)
    }

    /// `kernel(*buffers, **vars)`, with the buffers as a sequence and the variables as a dict.
    /// With `reinterpret=True` each buffer is first viewed as its parameter's dtype, as
    /// `buffer.reinterpret(dtype)` would, without making the view objects (for callers that
    /// hold untyped byte buffers, like tinygrad's).
    #[pyo3(signature = (buffers, vars=None, *, reinterpret=false))]
    fn launch(
        &self,
        py: Python<'_>,
        buffers: &Bound<'_, PyAny>,
        vars: Option<&Bound<'_, PyAny>>,
        reinterpret: bool,
    ) -> PyResult<()> {
        let items: Vec<Bound<'_, PyAny>> = buffers.try_iter()?.collect::<PyResult<_>>()?;
        let vars = vars_dict(py, vars)?;
        self.run(py, &items, vars.as_ref(), reinterpret)
    }

    /// The kernel's entry-point name.
    #[getter]
    fn name(&self) -> &str {
        &self.kernel.spec.name
    }

    /// The device family it was compiled for.
    #[getter]
    fn device(&self) -> String {
        self.kernel.spec.device.to_string()
    }

    /// The variables' names, in the order `launch` binds them.
    #[getter]
    fn var_names(&self) -> Vec<String> {
        self.kernel.spec.var_names.clone()
    }

    /// Each variable as `(name, min, max)`.
    #[getter]
    fn vars(&self) -> Vec<(String, i64, i64)> {
        self.kernel.spec.vars.iter().map(|v| (v.name.clone(), v.min, v.max)).collect()
    }

    /// Each buffer parameter as `(slot, dtype)`, in slot order.
    #[getter]
    fn params(&self) -> Vec<(usize, &'static str)> {
        self.kernel.spec.params.iter().map(|p| (p.slot, p.scalar.name())).collect()
    }

    /// The slots the kernel writes.
    #[getter]
    fn outs(&self) -> Vec<usize> {
        self.kernel.spec.outs.clone()
    }

    /// The backend source the kernel was rendered to.
    #[getter]
    fn source(&self) -> &str {
        &self.kernel.spec.src
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let params = PyList::new(py, self.params()).map(|l| l.to_string()).unwrap_or_default();
        format!(
            "<kiln.Kernel {} on {} params={params} vars={:?}>",
            self.kernel.spec.name, self.kernel.spec.device, self.kernel.spec.var_names
        )
    }
}
