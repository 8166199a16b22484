//! [`LoadedPlan`]: a saved plan loaded on a device, run with named host tensors.
//!
//! A run takes every input by name with its dtype and shape, binds the plan variables its
//! shape's named dimensions stand for, copies the inputs into their windows, replays the plan and
//! reads every output back at the shape those variables give it. The buffers stay the plan's:
//! a caller that keeps data on the device fills [`LoadedPlan::input_buffer`] itself and calls
//! [`LoadedPlan::run_vars`].

use kiln_device::Buffer;
use kiln_device::kiln_ir::DeviceSpec;
use kiln_device::kiln_ir::Scalar;

use super::PlanFileError;
use super::format::Dim;
use crate::plan::ExecutionPlan;
use crate::profile::Profile;

type Result<T> = std::result::Result<T, PlanFileError>;

/// A named input or output of a loaded plan: what a caller passes or gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: Scalar,
    /// Its shape, row-major; a [`Dim::Var`] takes the plan variable's value in a run.
    pub shape: Vec<Dim>,
}

impl TensorSpec {
    /// The shape as text, `[batch, 16]`.
    pub fn shape_text(&self) -> String {
        format!("[{}]", self.shape.iter().map(Dim::to_string).collect::<Vec<_>>().join(", "))
    }
}

/// A plan variable of a loaded plan: its recorded value and the range every kernel using it
/// accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanVariable {
    /// Its name.
    pub name: String,
    /// The value it was recorded (and saved) with: a run that does not bind it uses this.
    pub value: i64,
    /// The smallest value every kernel that uses it accepts.
    pub min: i64,
    /// The largest value every kernel that uses it accepts.
    pub max: i64,
}

/// An input given to [`LoadedPlan::run`]: little-endian element bytes in row-major order.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    /// The element type.
    pub dtype: Scalar,
    /// The shape.
    pub shape: &'a [usize],
    /// The elements' bytes: the shape's element count times the dtype's size.
    pub data: &'a [u8],
}

/// An output read back by [`LoadedPlan::run`].
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// The output's name.
    pub name: String,
    /// The element type.
    pub dtype: Scalar,
    /// The shape for this run's variable values.
    pub shape: Vec<usize>,
    /// The elements' bytes, little-endian, row-major.
    pub data: Vec<u8>,
}

/// What loading did, for reports and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// The file's (or byte slice's) length.
    pub file_bytes: u64,
    /// Kernels in the file.
    pub kernels: usize,
    /// Nodes recorded.
    pub nodes: usize,
    /// Bytes of constants.
    pub constant_bytes: u64,
    /// Bytes of constants used in place from the mapped file (the rest were copied).
    pub mapped_bytes: u64,
}

/// A named tensor of the plan and the window holding it.
#[derive(Clone, Debug)]
pub(super) struct Bound {
    pub(super) spec: TensorSpec,
    pub(super) buffer: Buffer,
}

/// A saved plan loaded on a device, ready to run. See the module docs; made by
/// [`LoadedPlan::load`](super::LoadedPlan::load).
pub struct LoadedPlan {
    pub(super) plan: ExecutionPlan,
    pub(super) device: DeviceSpec,
    pub(super) inputs: Vec<Bound>,
    pub(super) outputs: Vec<Bound>,
    pub(super) variables: Vec<PlanVariable>,
    pub(super) stats: LoadStats,
}

impl std::fmt::Debug for LoadedPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlan")
            .field("device", &self.device)
            .field("inputs", &self.inputs().collect::<Vec<_>>())
            .field("outputs", &self.outputs().collect::<Vec<_>>())
            .field("variables", &self.variables)
            .finish()
    }
}

impl LoadedPlan {
    /// The inputs, in the order they were saved.
    pub fn inputs(&self) -> impl Iterator<Item = &TensorSpec> {
        self.inputs.iter().map(|b| &b.spec)
    }

    /// The outputs, in the order they were saved.
    pub fn outputs(&self) -> impl Iterator<Item = &TensorSpec> {
        self.outputs.iter().map(|b| &b.spec)
    }

    /// The plan variables.
    pub fn variables(&self) -> &[PlanVariable] {
        &self.variables
    }

    /// The device the plan runs on.
    pub fn device(&self) -> &DeviceSpec {
        &self.device
    }

    /// What loading did.
    pub fn stats(&self) -> &LoadStats {
        &self.stats
    }

    /// The window input `name` is read from (its full length: a shape with variables uses
    /// its first elements), for a caller that fills it on the device.
    pub fn input_buffer(&self, name: &str) -> Option<&Buffer> {
        self.inputs.iter().find(|b| b.spec.name == name).map(|b| &b.buffer)
    }

    /// The window output `name` is written to.
    pub fn output_buffer(&self, name: &str) -> Option<&Buffer> {
        self.outputs.iter().find(|b| b.spec.name == name).map(|b| &b.buffer)
    }

    /// The execution plan itself (to profile a run, or replay it with other options).
    pub fn plan_mut(&mut self) -> &mut ExecutionPlan {
        &mut self.plan
    }

    /// Runs the plan on `inputs` (every input once, by name) and returns every output.
    /// Variables are bound from the inputs' shapes; the others keep their saved values.
    ///
    /// # Errors
    /// [`PlanFileError::Input`] for an unknown or missing input, an input given twice, a dtype
    /// or shape that is not the input's (the message says what it expects), or a dimension
    /// outside its variable's range; [`PlanFileError::Device`] for the run's own errors.
    pub fn run(&mut self, inputs: &[(&str, TensorRef<'_>)]) -> Result<Vec<HostTensor>> {
        self.run_with(inputs, &[])
    }

    /// [`LoadedPlan::run`] with variables bound by name as well (a variable no input shape
    /// names, or one an input names with the same value).
    ///
    /// # Errors
    /// As [`LoadedPlan::run`], and [`PlanFileError::Input`] for a variable the plan does not
    /// have or one given another value by an input's shape.
    pub fn run_with(&mut self, inputs: &[(&str, TensorRef<'_>)], vars: &[(&str, i64)]) -> Result<Vec<HostTensor>> {
        let vals = self.bind(inputs, vars)?;
        self.plan.run_vals(&vals)?;
        self.outputs.iter().map(|b| read_output(b, &self.variables, &vals)).collect()
    }

    /// Runs the plan on `inputs` as [`LoadedPlan::run_with`] does, timing every node
    /// ([`ExecutionPlan::run_profiled`]); the outputs stay in their buffers.
    ///
    /// # Errors
    /// As [`LoadedPlan::run_with`].
    pub fn profile_with(&mut self, inputs: &[(&str, TensorRef<'_>)], vars: &[(&str, i64)]) -> Result<Profile> {
        let vals = self.bind(inputs, vars)?;
        let named: Vec<(&str, i64)> = self.variables.iter().zip(&vals).map(|(v, x)| (v.name.as_str(), *x)).collect();
        Ok(self.plan.run_profiled(&named)?)
    }

    /// Checks `inputs` and `vars`, copies the inputs into their buffers and returns every
    /// variable's value (bound by name, from an input's shape, or as saved).
    fn bind(&mut self, inputs: &[(&str, TensorRef<'_>)], vars: &[(&str, i64)]) -> Result<Vec<i64>> {
        let mut values: Vec<Option<(i64, String)>> = vec![None; self.variables.len()];
        for (name, v) in vars {
            let i = self.variable_index(name).ok_or_else(|| PlanFileError::Input {
                name: name.to_string(),
                message: format!("the plan has no variable `{name}` (its variables: {})", self.variable_names()),
            })?;
            values[i] = Some((*v, "given".to_string()));
        }
        for (name, _) in inputs {
            if !self.inputs.iter().any(|b| b.spec.name == *name) {
                return Err(PlanFileError::Input {
                    name: name.to_string(),
                    message: format!("the plan has no input of this name (its inputs: {})", self.input_list()),
                });
            }
            if inputs.iter().filter(|(n, _)| n == name).count() > 1 {
                return Err(PlanFileError::Input { name: name.to_string(), message: "given more than once".into() });
            }
        }
        let mut given = Vec::with_capacity(self.inputs.len());
        for b in &self.inputs {
            let Some((_, t)) = inputs.iter().find(|(n, _)| *n == b.spec.name) else {
                return Err(PlanFileError::Input {
                    name: b.spec.name.clone(),
                    message: format!("missing: the plan takes {} {}", b.spec.dtype, b.spec.shape_text()),
                });
            };
            self.bind_shape(&b.spec, t, &mut values)?;
            given.push((b, t));
        }
        let vals: Vec<i64> =
            self.variables.iter().zip(&values).map(|(v, given)| given.as_ref().map_or(v.value, |(x, _)| *x)).collect();
        for (b, t) in given {
            let numel = t.data.len() / t.dtype.size().max(1);
            if numel > b.buffer.len() {
                return Err(PlanFileError::Input {
                    name: b.spec.name.clone(),
                    message: format!("{numel} elements, more than its buffer's {}", b.buffer.len()),
                });
            }
            b.buffer.view(0, numel)?.copyin(t.data)?;
        }
        Ok(vals)
    }

    /// Replays the plan with the inputs' buffers as they are, binding `vars` by name (the others
    /// keep their saved values); the outputs stay in their buffers.
    ///
    /// # Errors
    /// [`PlanFileError::Input`] for a variable the plan does not have; the run's errors.
    pub fn run_vars(&mut self, vars: &[(&str, i64)]) -> Result<()> {
        if let Some((name, _)) = vars.iter().find(|(n, _)| self.variable_index(n).is_none()) {
            return Err(PlanFileError::Input {
                name: name.to_string(),
                message: format!("the plan has no variable `{name}` (its variables: {})", self.variable_names()),
            });
        }
        Ok(self.plan.run(vars)?)
    }

    fn variable_index(&self, name: &str) -> Option<usize> {
        self.variables.iter().position(|v| v.name == name)
    }

    fn variable_names(&self) -> String {
        if self.variables.is_empty() {
            return "none".into();
        }
        self.variables.iter().map(|v| v.name.as_str()).collect::<Vec<_>>().join(", ")
    }

    fn input_list(&self) -> String {
        let list: Vec<String> =
            self.inputs.iter().map(|b| format!("{} {} {}", b.spec.name, b.spec.dtype, b.spec.shape_text())).collect();
        if list.is_empty() { "none".into() } else { list.join(", ") }
    }

    /// Checks `t` against input `spec` and binds the variables its shape names.
    fn bind_shape(&self, spec: &TensorSpec, t: &TensorRef<'_>, values: &mut [Option<(i64, String)>]) -> Result<()> {
        let expected = || format!("the plan takes {} {}", spec.dtype, spec.shape_text());
        let refuse = |message: String| Err(PlanFileError::Input { name: spec.name.clone(), message });
        if t.dtype != spec.dtype {
            return refuse(format!("got {} elements, {}", t.dtype, expected()));
        }
        if t.shape.len() != spec.shape.len() {
            return refuse(format!("got shape {:?} ({} dimensions), {}", t.shape, t.shape.len(), expected()));
        }
        for (axis, (d, &n)) in spec.shape.iter().zip(t.shape).enumerate() {
            match d {
                Dim::Fixed(want) if *want != n as u64 => {
                    return refuse(format!("got shape {:?}: dimension {axis} is {n}, {}", t.shape, expected()));
                }
                Dim::Fixed(_) => {}
                Dim::Var(var) => {
                    let Some(i) = self.variable_index(var) else {
                        return refuse(format!("its dimension {axis} names `{var}`, which is no plan variable"));
                    };
                    let v = &self.variables[i];
                    let value = i64::try_from(n).unwrap_or(i64::MAX);
                    if value < v.min || value > v.max {
                        return refuse(format!(
                            "got shape {:?}: dimension {axis} ({var}) is {n}, the plan takes {var} in [{}, {}]",
                            t.shape, v.min, v.max
                        ));
                    }
                    match &values[i] {
                        Some((other, from)) if *other != value => {
                            return refuse(format!(
                                "got shape {:?}: dimension {axis} makes {var} = {n}, but {var} = {other} ({from})",
                                t.shape
                            ));
                        }
                        _ => values[i] = Some((value, format!("from input `{}`", spec.name))),
                    }
                }
            }
        }
        let numel = t.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let bytes = numel.and_then(|n| n.checked_mul(t.dtype.size()));
        if bytes != Some(t.data.len()) {
            return refuse(format!(
                "shape {:?} of {} needs {} bytes, got {}",
                t.shape,
                t.dtype,
                bytes.map_or("too many".to_string(), |b| b.to_string()),
                t.data.len()
            ));
        }
        Ok(())
    }
}

/// Output `b` after a run with plan variable values `vals`.
fn read_output(b: &Bound, variables: &[PlanVariable], vals: &[i64]) -> Result<HostTensor> {
    let mut shape = Vec::with_capacity(b.spec.shape.len());
    for d in &b.spec.shape {
        let n = match d {
            Dim::Fixed(n) => usize::try_from(*n).ok(),
            Dim::Var(var) => variables.iter().position(|v| &v.name == var).and_then(|i| usize::try_from(vals[i]).ok()),
        };
        shape.push(
            n.ok_or_else(|| PlanFileError::Malformed(format!("output `{}`: dimension {d} has no size", b.spec.name)))?,
        );
    }
    let numel =
        shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).filter(|&n| n <= b.buffer.len()).ok_or_else(|| {
            PlanFileError::Malformed(format!(
                "output `{}` of shape {shape:?} needs more elements than its buffer's {}",
                b.spec.name,
                b.buffer.len()
            ))
        })?;
    let window = b.buffer.view(0, numel)?;
    // The device memory first: a size the device cannot hold is its typed out-of-memory error.
    window.raw()?;
    let bytes = window.nbytes();
    let mut data = Vec::new();
    data.try_reserve_exact(bytes).map_err(|_| {
        PlanFileError::Device(kiln_device::Error::Buffer(format!(
            "cannot allocate {bytes} bytes of host memory to read output `{}`",
            b.spec.name
        )))
    })?;
    data.resize(bytes, 0);
    window.copyout(&mut data)?;
    Ok(HostTensor { name: b.spec.name.clone(), dtype: b.spec.dtype, shape, data })
}
