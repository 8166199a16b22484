//! `kiln.Plan`: recorded launches, copies and collectives, replayed with new variable values.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use kiln_device::{Buffer, Collective, ReduceOp};
use kiln_runtime::{ExecutionPlan, PlanOptions};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::buffer::PyBuffer;
use crate::channel::PyChannel;
use crate::device::PyDevice;
use crate::errors::{Failure, detached, invalid_arg, no_panic, raise, seconds_arg};
use crate::kernel::PyKernel;
use kiln_runtime::LaunchStream;

/// Records kernel launches, copies and collectives once, then replays them: the object a
/// compiler's JIT replays. The plan orders its work by the bytes each node reads and writes and
/// may run independent nodes at once.
#[pyclass(frozen, name = "Plan", module = "kiln")]
pub struct PyPlan {
    /// The plan; runs and recording take turns.
    recorded: Arc<Mutex<ExecutionPlan>>,
    /// The device's queue of launches from Python, which a run waits for first.
    stream: Option<Arc<LaunchStream>>,
    /// The plan's variable names as of its last recording, readable while a run holds the
    /// plan: `run_async` checks its keywords against them before it starts.
    var_names: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while recording is reported as an error; the plan's state stays usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The `kiln.Buffer` behind `b`, or `kiln.InvalidArgumentError` naming `what` it is for.
fn buffer_arg(py: Python<'_>, what: &str, b: &Bound<'_, PyAny>) -> PyResult<Buffer> {
    b.cast::<PyBuffer>()
        .map(|p| p.get().buf.clone())
        .map_err(|_| invalid_arg(py, format!("{what} is a kiln.Buffer, got {}", b.get_type())))
}

/// A reduction by name (`"sum"`, `"max"`, `"min"`); anything else (`None` included) is
/// `kiln.InvalidArgumentError`.
fn reduce_op(op: &Bound<'_, PyAny>) -> PyResult<ReduceOp> {
    let py = op.py();
    let Ok(name) = op.extract::<String>() else {
        let ty = op.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        return Err(invalid_arg(py, format!("op is \"sum\", \"max\" or \"min\", got {ty} {op}")));
    };
    name.parse().map_err(|e| raise(py, e))
}

/// A rank of `channel` given from Python (`what` names it): an int in `0 .. count`, else
/// `kiln.InvalidArgumentError` saying which ranks the channel has.
fn rank_arg(py: Python<'_>, what: &str, channel: &PyChannel, v: &Bound<'_, PyAny>) -> PyResult<usize> {
    let count = channel.channel.count();
    if !v.is_instance_of::<pyo3::types::PyInt>() {
        let ty = v.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        return Err(invalid_arg(py, format!("{what} must be an int, got {ty}")));
    }
    match v.extract::<i128>() {
        Ok(r) if (0..count as i128).contains(&r) => Ok(r as usize),
        _ => Err(invalid_arg(
            py,
            format!("{what} {v} is not a rank of this channel of {count}: ranks are 0 to {}", count - 1),
        )),
    }
}

/// A run's variables by name, from keyword arguments.
fn named(py: Python<'_>, vars: Option<&Bound<'_, PyDict>>) -> PyResult<Vec<(String, i64)>> {
    vars.map_or(Ok(Vec::new()), |d| {
        d.iter()
            .map(|(k, v)| {
                let value = crate::kernel::var_value(py, &k, &v)?;
                Ok((k.extract()?, value))
            })
            .collect()
    })
}

/// Runs `plan` with `vars` by name (variables not given keep their recorded values), after
/// the launches made from Python on its device.
fn run_named(plan: &mut ExecutionPlan, vars: &[(String, i64)], stream: Option<&LaunchStream>) -> Result<(), Failure> {
    if let Some(s) = stream {
        s.wait()?;
    }
    let pairs: Vec<(&str, i64)> = vars.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    Ok(plan.run(&pairs)?)
}

impl PyPlan {
    /// Records collective `op` over this rank's `send` and `recv` (checked now: dtype, length,
    /// device, root or peer); every rank records the same collectives in the same order.
    fn collective(
        &self,
        py: Python<'_>,
        channel: &PyChannel,
        op: Collective,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let name = op.name();
        let send = buffer_arg(py, &format!("{name}'s send buffer"), send)?;
        let recv = buffer_arg(py, &format!("{name}'s recv buffer"), recv)?;
        let (channel, recorded) = (&channel.channel, &self.recorded);
        detached(py, None, || Ok(lock(recorded).collective(channel, op, &send, &recv)?))
    }
}

#[pymethods]
impl PyPlan {
    /// An empty plan on `device`. `timeout` (seconds) bounds how long a run waits for the
    /// device before raising `TimeoutError`; by default it waits without limit.
    #[new]
    #[pyo3(signature = (device, *, timeout=None))]
    fn new(py: Python<'_>, device: &PyDevice, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<PyPlan> {
        let device = device.get()?;
        let mut options = PlanOptions::default();
        if let Some(t) = timeout {
            options.timeout = seconds_arg(py, t)?;
        }
        let plan = ExecutionPlan::with_options(device, options).map_err(|e| crate::errors::raise(py, e))?;
        Ok(PyPlan {
            recorded: Arc::new(Mutex::new(plan)),
            stream: LaunchStream::of(device),
            var_names: Mutex::new(Vec::new()),
        })
    }

    /// Records a launch of `kernel` over `buffers` with its variables (`vars`, by name);
    /// returns the node's index. The values are checked now and are the defaults of later runs.
    #[pyo3(signature = (kernel, buffers, vars=None))]
    fn launch(
        &self,
        py: Python<'_>,
        kernel: &PyKernel,
        buffers: &Bound<'_, PyAny>,
        vars: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let vars = crate::kernel::vars_dict(py, vars)?;
        let bufs: Vec<Buffer> = buffers
            .try_iter()?
            .map(|b| {
                let b = b?;
                b.cast::<PyBuffer>()
                    .map(|p| p.get().buf.clone())
                    .map_err(|_| invalid_arg(py, "a plan launches kiln.Buffer objects"))
            })
            .collect::<PyResult<_>>()?;
        let mut vals = vec![0i64; kernel.kernel.spec.var_names.len()];
        kernel.bind(py, vars.as_ref(), &mut vals)?;
        let (k, recorded, text) = (&kernel.kernel, &self.recorded, kernel.text.as_deref());
        let (node, names) = detached(py, text, || {
            let refs: Vec<&Buffer> = bufs.iter().collect();
            let mut plan = lock(recorded);
            let node = plan.exec_vals(k, &refs, &vals)?;
            Ok((node, plan.var_names().to_vec()))
        })?;
        *lock(&self.var_names) = names;
        Ok(node)
    }

    /// Binds new buffers to recorded launches for the runs that follow: each
    /// `(node, slot, buffer)` replaces the buffer of parameter `slot` of launch `node`. All
    /// are applied or none. Refused when the new buffers would share memory in a way the
    /// recorded ones did not (the plan's order may not hold): record a new plan then.
    fn rebind(&self, py: Python<'_>, bindings: &Bound<'_, PyAny>) -> PyResult<()> {
        let bindings: Vec<(usize, usize, Buffer)> = bindings
            .try_iter()?
            .map(|b| {
                let (node, slot, buf): (usize, usize, Bound<'_, PyAny>) =
                    b?.extract().map_err(|_| invalid_arg(py, "rebind takes (node, slot, kiln.Buffer) tuples"))?;
                let buf = buf
                    .cast::<PyBuffer>()
                    .map(|p| p.get().buf.clone())
                    .map_err(|_| invalid_arg(py, "rebind takes (node, slot, kiln.Buffer) tuples"))?;
                Ok((node, slot, buf))
            })
            .collect::<PyResult<_>>()?;
        let recorded = &self.recorded;
        detached(py, None, || {
            let refs: Vec<(usize, usize, &Buffer)> = bindings.iter().map(|(n, s, b)| (*n, *s, b)).collect();
            Ok(lock(recorded).rebind(&refs)?)
        })
    }

    /// Records a copy of `src` into `dst` (same byte size); returns the node's index.
    fn copy(&self, py: Python<'_>, dst: &Bound<'_, PyAny>, src: &Bound<'_, PyAny>) -> PyResult<usize> {
        let buffer = |b: &Bound<'_, PyAny>| {
            b.cast::<PyBuffer>().map(|p| p.get().buf.clone()).map_err(|_| {
                invalid_arg(py, format!("a plan copies between kiln.Buffer objects, got {}", b.get_type()))
            })
        };
        let (d, s, recorded) = (&buffer(dst)?, &buffer(src)?, &self.recorded);
        detached(py, None, || Ok(lock(recorded).copy(d, s)?))
    }

    /// Records an all-reduce on `channel`: `recv` (same dtype and length as `send`; `None`
    /// reduces in place into `send`) gets `op` (`"sum"`, `"max"`, `"min"`) over every rank's
    /// `send`. Returns the node's index.
    #[pyo3(signature = (channel, send, recv=None, op=ReduceOp::Sum))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        channel: &PyChannel,
        send: &Bound<'_, PyAny>,
        recv: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = reduce_op)] op: ReduceOp,
    ) -> PyResult<usize> {
        let op = Collective::AllReduce(op);
        self.collective(py, channel, op, send, recv.unwrap_or(send))
    }

    /// Records an all-gather on `channel`: `recv` (`count` times `send`'s length) gets every
    /// rank's `send` in rank order. Returns the node's index.
    fn all_gather(
        &self,
        py: Python<'_>,
        channel: &PyChannel,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        self.collective(py, channel, Collective::AllGather, send, recv)
    }

    /// Records a reduce-scatter on `channel`: `recv` gets this rank's block of `op` over every
    /// rank's `send` (`count` times `recv`'s length). Returns the node's index.
    #[pyo3(signature = (channel, send, recv, op=ReduceOp::Sum))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        channel: &PyChannel,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = reduce_op)] op: ReduceOp,
    ) -> PyResult<usize> {
        let op = Collective::ReduceScatter(op);
        self.collective(py, channel, op, send, recv)
    }

    /// Records a broadcast on `channel`: every rank's `buffer` gets rank `root`'s. Returns the
    /// node's index.
    fn broadcast(
        &self,
        py: Python<'_>,
        channel: &PyChannel,
        buffer: &Bound<'_, PyAny>,
        root: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let root = rank_arg(py, "the root rank", channel, root)?;
        self.collective(py, channel, Collective::Broadcast { root }, buffer, buffer)
    }

    /// Records a send of `buffer` on `channel` to rank `peer`, which records the matching
    /// `recv`. Returns the node's index.
    fn send(
        &self,
        py: Python<'_>,
        channel: &PyChannel,
        buffer: &Bound<'_, PyAny>,
        peer: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let peer = rank_arg(py, "the peer rank", channel, peer)?;
        self.collective(py, channel, Collective::Send { peer }, buffer, buffer)
    }

    /// Records a receive into `buffer` on `channel` from rank `peer`, which records the
    /// matching `send`. Returns the node's index.
    fn recv(
        &self,
        py: Python<'_>,
        channel: &PyChannel,
        buffer: &Bound<'_, PyAny>,
        peer: &Bound<'_, PyAny>,
    ) -> PyResult<usize> {
        let peer = rank_arg(py, "the peer rank", channel, peer)?;
        self.collective(py, channel, Collective::Recv { peer }, buffer, buffer)
    }

    /// Replays every node with these variable values (the others keep the values they were
    /// recorded with) and waits for it.
    #[pyo3(signature = (**vars))]
    fn run(&self, py: Python<'_>, vars: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        let vars = named(py, vars)?;
        let (recorded, stream) = (&self.recorded, self.stream.clone());
        detached(py, None, || run_named(&mut lock(recorded), &vars, stream.as_deref()))
    }

    /// Starts a replay on a helper thread and returns at once; `wait()` on the result waits.
    /// Runs of one plan never overlap: a second run starts when the first is done.
    #[pyo3(signature = (**vars))]
    fn run_async(&self, py: Python<'_>, vars: Option<&Bound<'_, PyDict>>) -> PyResult<PlanRun> {
        let vars = named(py, vars)?;
        // Refused now, as `run` refuses it, rather than at `wait()`.
        let names = lock(&self.var_names).clone();
        if let Some((name, _)) = vars.iter().find(|(n, _)| !names.contains(n)) {
            let known = if names.is_empty() { "none".to_string() } else { names.join(", ") };
            let e = kiln_device::Error::Launch(format!("the plan has no variable `{name}` (its variables: {known})"));
            // As a refused `run`: the peers waiting in this rank's collectives fail now.
            let (recorded, why) = (&self.recorded, &e);
            py.detach(|| lock(recorded).leave(why));
            return Err(crate::errors::raise(py, e));
        }
        let (recorded, stream) = (self.recorded.clone(), self.stream.clone());
        let running = AsyncRun::start();
        let handle = std::thread::Builder::new()
            .name("kiln-plan-run".into())
            .spawn(move || {
                let _running = running;
                no_panic(|| run_named(&mut lock(&recorded), &vars, stream.as_deref()))
            })
            .map_err(|e| invalid_arg(py, format!("cannot start a thread for the run: {e}")))?;
        Ok(PlanRun { state: Mutex::new(RunState::Running(handle)) })
    }

    /// Saves the plan to the file `path` with its named inputs and outputs (`kiln.load_plan`
    /// loads it on any device); returns the file's size in bytes. Each entry of `inputs` and
    /// `outputs` is a buffer the plan uses, or a `(buffer, shape)` pair (ints, and plan
    /// variable names for dimensions that follow a variable).
    #[pyo3(signature = (path, inputs=None, outputs=None))]
    fn save(
        &self,
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        inputs: Option<&Bound<'_, PyAny>>,
        outputs: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        // The constants are read now: the launches made from Python that may write them first.
        if let Some(s) = &self.stream {
            detached(py, None, || Ok(s.wait()?))?;
        }
        crate::saved::save(py, &self.recorded, path, inputs, outputs)
    }

    /// The number of recorded nodes.
    fn __len__(&self) -> usize {
        lock(&self.recorded).len()
    }

    /// The plan's variables, in the order runs bind them.
    #[getter]
    fn var_names(&self) -> Vec<String> {
        lock(&self.recorded).var_names().to_vec()
    }

    fn __repr__(&self) -> String {
        let plan = lock(&self.recorded);
        format!("<kiln.Plan {} nodes, vars {:?}>", plan.len(), plan.var_names())
    }
}

/// The number of `run_async` runs whose thread has not finished, for [`wait_for_runs`].
static ASYNC_RUNS: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// Counts one `run_async` thread while it lives.
struct AsyncRun;

impl AsyncRun {
    fn start() -> AsyncRun {
        *lock(&ASYNC_RUNS.0) += 1;
        AsyncRun
    }
}

impl Drop for AsyncRun {
    fn drop(&mut self) {
        *lock(&ASYNC_RUNS.0) -= 1;
        ASYNC_RUNS.1.notify_all();
    }
}

/// Waits until every `run_async` run has finished (at interpreter exit), up to `timeout`.
pub fn wait_for_runs(timeout: Duration) {
    let guard = lock(&ASYNC_RUNS.0);
    let _ = ASYNC_RUNS.1.wait_timeout_while(guard, timeout, |n| *n > 0);
}

/// A replay started by `Plan.run_async`.
#[pyclass(frozen, name = "PlanRun", module = "kiln")]
pub struct PlanRun {
    state: Mutex<RunState>,
}

enum RunState {
    Running(JoinHandle<Result<(), Failure>>),
    /// The outcome, raised again (same class and attributes) by every later `wait()`.
    Done(Result<(), Failure>),
}

#[pymethods]
impl PlanRun {
    /// Waits for the run and raises its error, if any; every later call raises it again.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        // The lock is taken and held with the GIL released: a second waiter blocks here until
        // the first has the outcome, then reads it.
        let outcome = py.detach(|| {
            let mut state = lock(&self.state);
            let outcome = match std::mem::replace(&mut *state, RunState::Done(Ok(()))) {
                RunState::Running(handle) => {
                    handle.join().unwrap_or_else(|_| Err(Failure::Panic("the run's thread".into())))
                }
                RunState::Done(outcome) => outcome,
            };
            *state = RunState::Done(outcome.clone());
            outcome
        });
        outcome.map_err(|f| f.into_py(py, None))
    }

    /// Whether the run has finished (successfully or not); `False` while another thread's
    /// `wait()` is collecting it.
    fn done(&self) -> bool {
        match self.state.try_lock() {
            Ok(state) => match &*state {
                RunState::Running(handle) => handle.is_finished(),
                RunState::Done(_) => true,
            },
            Err(_) => false,
        }
    }
}
