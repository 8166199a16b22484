//! [`ExecutionPlan`]: a recorded graph of kernel launches and copies, run on several queues
//! that are ordered only by timeline signals, and replayed with new variable values.
//!
//! Recording derives each node's dependencies from the byte ranges it reads and writes (see
//! [`crate::hazard`]). The first run places the nodes on queues (see [`crate::schedule`]) and
//! creates one timeline signal per queue; later runs only re-evaluate what depends on the
//! variables and hand the same command sequence to the queues again.
//!
//! Signal values: each run continues each queue's timeline where the previous run left it
//! (`base + position`), so values only grow, even across failed runs.
//!
//! After a failed run the plan drops its queues and signals and creates new ones on the
//! next run: a failed signal's value is frozen, and a queue that saw a failure may refuse
//! further work (the CPU queue's poison is sticky). The timeline values carry over.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln_device::collective::{self, Channel, Collective, ReduceOp};
use kiln_device::kiln_ir::UOp;
use kiln_device::queue::{CommandTimer, DynQueue, DynQueueFactory};
use kiln_device::{Buffer, Device, Error, Kernel, PreparedLaunch, Result, TimelineSignal};

use crate::fuse::{Launch, Segment, find_segments, fused_kernel};
use crate::hazard::{Access, Dependency, HazardTracker};
use crate::profile::{self, Profile, ProfileEvent, Stamps};
use crate::schedule::{Lane, QueueLayout, Schedule, schedule};

mod collectives;
mod graph;
mod rebind;
use collectives::RunCollectives;
use graph::GraphState;

/// How many queues a plan spreads its nodes over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanOptions {
    /// Compute queues to create (at least 1).
    pub compute_queues: usize,
    /// Put copies on the device's copy queue when it has one.
    pub use_copy_queue: bool,
    /// The longest `run` waits for a queue to finish; `Duration::MAX` waits without limit.
    /// A run's collectives give up with it (see [`ExecutionPlan::collective`]).
    pub timeout: Duration,
    /// Hand each run of kernels on host memory that needs no signal in between to its queue
    /// as one command that calls the kernels' programs in order with arguments checked when
    /// the variable values were bound: a replay then costs one queue command per run of
    /// kernels instead of one argument check and recording per kernel. Failure is the same:
    /// the first failing kernel's error fails the queue's signal and the rest do not run.
    pub fuse: bool,
    /// Replay a plan of kernel launches as one device-side graph where the backend offers
    /// one (CUDA graphs; see [`kiln_device::graph`]): a synchronous run is then one graph
    /// launch. Backends without graphs replay through the queues either way.
    pub graph: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        PlanOptions {
            compute_queues: cores.clamp(2, 4),
            use_copy_queue: true,
            timeout: Duration::MAX,
            fuse: true,
            graph: true,
        }
    }
}

/// A launch of a kernel not compiled yet, for [`ExecutionPlan::exec_many`]: the kernel's graph
/// and entry-point name (as [`Device::compile`] takes them) with the arguments of
/// [`ExecutionPlan::exec`].
#[derive(Clone, Copy, Debug)]
pub struct KernelLaunch<'a> {
    /// The kernel (a SINK).
    pub sink: &'a Arc<UOp>,
    /// Its entry-point name; the renderer's default when `None`.
    pub name: Option<&'a str>,
    /// One buffer per parameter slot.
    pub bufs: &'a [&'a Buffer],
    /// The values of the kernel's variables, by name.
    pub vars: &'a [(&'a str, i64)],
}

enum NodeKind {
    Exec {
        kernel: Kernel,
        bufs: Vec<Buffer>,
        /// For each of the kernel's variables (in `var_names` order), the plan variable.
        var_index: Vec<usize>,
        /// The node's positional values inside `ExecutionPlan::node_vals`.
        vals_at: usize,
    },
    Copy {
        dst: Buffer,
        src: Buffer,
        /// Marker kernels (start, end) for profiling, made on first use.
        markers: Option<(Kernel, Kernel)>,
    },
    /// A collective on a channel, run as a host step of its queue.
    Collective { channel: Arc<dyn Channel>, op: Collective, send: Buffer, recv: Buffer, name: String },
}

/// A recorded node, borrowed: what a saved plan needs of it.
pub(crate) enum Recorded<'a> {
    /// A kernel launch over one buffer per parameter slot.
    Exec { kernel: &'a Kernel, bufs: &'a [Buffer] },
    /// A copy of `src` into `dst`.
    Copy { dst: &'a Buffer, src: &'a Buffer },
    /// A collective on a channel (named by its operation).
    Collective { name: &'a str },
}

struct Node {
    kind: NodeKind,
    deps: Vec<Dependency>,
    /// Scheduling weight: work items of a launch at record time, bytes / 16 of a copy.
    cost: u64,
    stamps: Arc<Stamps>,
}

impl NodeKind {
    /// The byte ranges the node reads and writes, for the hazard tracker.
    fn accesses(&self) -> Vec<Access> {
        let access = |buf: &Buffer, write: bool| {
            let (alloc, range) = buf.byte_range();
            Access { alloc, range, write }
        };
        match self {
            NodeKind::Exec { kernel, bufs, .. } => [(&kernel.spec.ins, false), (&kernel.spec.outs, true)]
                .into_iter()
                .flat_map(|(slots, write)| slots.iter().filter_map(move |&s| bufs.get(s).map(|b| access(b, write))))
                .collect(),
            NodeKind::Copy { dst, src, .. } => vec![access(src, false), access(dst, true)],
            NodeKind::Collective { channel, op, send, recv, .. } => {
                let rank = channel.rank();
                // The collectives of one channel run in the order recorded, on every rank: each
                // writes the channel itself.
                let order = Access { alloc: Arc::as_ptr(channel) as *const () as usize, range: 0..1, write: true };
                let mut accesses = vec![order];
                accesses.extend(op.reads(rank).then(|| access(send, false)));
                accesses.extend(op.writes(rank).then(|| access(recv, true)));
                accesses
            }
        }
    }
}

impl Node {
    fn name(&self) -> &str {
        match &self.kind {
            NodeKind::Exec { kernel, .. } => &kernel.spec.name,
            NodeKind::Copy { .. } => "copy",
            NodeKind::Collective { name, .. } => name,
        }
    }
}

/// Queues, signals and timeline positions, made on the first run.
struct Lanes {
    layout: QueueLayout,
    queues: Vec<DynQueue>,
    signals: Vec<Arc<dyn TimelineSignal>>,
}

/// A recorded sequence of kernel launches and copies. See the module documentation.
///
/// Ownership: the plan keeps a clone of every buffer it was given, so the memory outlives
/// the plan's runs. Reading or writing those buffers from the host while a run is in
/// flight is a data race the plan cannot see; do it between runs.
pub struct ExecutionPlan {
    factory: Arc<dyn DynQueueFactory>,
    options: PlanOptions,
    nodes: Vec<Node>,
    tracker: HazardTracker,
    /// Whether a rebinding changed buffers since the tracker saw them (see [`rebind`]).
    tracker_stale: bool,
    /// Plan variables: names and the values they were recorded with.
    var_names: Vec<String>,
    var_defaults: Vec<i64>,
    /// Positional values of every exec node, back to back (`vals_at` indexes here).
    node_vals: Vec<i64>,
    /// The plan values `node_vals` was filled and checked with, and whether the fused
    /// segments were built for a profiled run.
    checked: Option<(Vec<i64>, bool)>,
    /// Cleared by recording, made on the next run.
    schedule: Option<Schedule>,
    /// Fusable runs of the schedule and each node's segment (made with the schedule).
    segments: Vec<Segment>,
    segment_of: Vec<Option<usize>>,
    /// Signal values of the submitted run that nobody waited for yet.
    in_flight: Vec<(Arc<dyn TimelineSignal>, u64)>,
    lanes: Option<Lanes>,
    /// Each queue's signal value before the next run (outlives recreated lanes).
    base: Vec<u64>,
    /// The clock profiled runs measure against.
    epoch: Instant,
    /// Replay as a device graph (see [`graph`]).
    graph: GraphState,
    /// Whether the graph's last launch may still run (its wait timed out).
    graph_running: bool,
    /// The collectives of the submitted run nobody waited for yet.
    collectives: Option<Arc<RunCollectives>>,
}

impl std::fmt::Debug for ExecutionPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutionPlan")
            .field("device", self.factory.dyn_device())
            .field("nodes", &self.nodes.len())
            .field("vars", &self.var_names)
            .finish()
    }
}

impl ExecutionPlan {
    /// An empty plan on `device`'s queues, with default options.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the device has no command queues.
    pub fn new(device: &Device) -> Result<ExecutionPlan> {
        Self::with_options(device, PlanOptions::default())
    }

    /// An empty plan on `device`'s queues. Queues are created on the first run, so options
    /// cost nothing until then.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when the device has no command queues.
    pub fn with_options(device: &Device, options: PlanOptions) -> Result<ExecutionPlan> {
        let factory = device.queues().ok_or_else(|| {
            Error::Unavailable(format!("device {} has no command queues; execution plans need them", device.spec()))
        })?;
        Ok(Self::on_queues(factory, options))
    }

    /// An empty plan on the queues of `factory`.
    pub fn on_queues(factory: Arc<dyn DynQueueFactory>, options: PlanOptions) -> ExecutionPlan {
        ExecutionPlan {
            factory,
            options,
            nodes: Vec::new(),
            tracker: HazardTracker::new(),
            tracker_stale: false,
            var_names: Vec::new(),
            var_defaults: Vec::new(),
            node_vals: Vec::new(),
            checked: None,
            schedule: None,
            segments: Vec::new(),
            segment_of: Vec::new(),
            in_flight: Vec::new(),
            lanes: None,
            base: Vec::new(),
            epoch: Instant::now(),
            graph: GraphState::Untried,
            graph_running: false,
            collectives: None,
        }
    }

    /// Records a launch of `kernel` over `bufs` (one per parameter slot). `vars` binds every
    /// variable of the kernel by name; these values are checked now and are the plan
    /// variables' values in runs that do not override them. A variable name shared by
    /// several kernels is one plan variable and must be recorded with one value.
    ///
    /// Returns the node index. On error nothing is recorded.
    ///
    /// # Errors
    /// [`Error::Launch`] for a kernel built for another backend, a name that is not one of the
    /// kernel's variables, a variable recorded with another value by an earlier node, or
    /// buffers that do not match the kernel's slots (count, dtype, size); [`Error::Ir`] for a
    /// variable without a value or with a value outside its bounds; [`Error::OutOfBounds`] for
    /// an access that cannot be proven inside its buffer with these values.
    pub fn exec(&mut self, kernel: &Kernel, bufs: &[&Buffer], vars: &[(&str, i64)]) -> Result<usize> {
        let spec = &kernel.spec;
        if let Some((name, _)) = vars.iter().find(|(n, _)| !spec.var_names.iter().any(|k| k == n)) {
            return Err(Error::Launch(format!(
                "kernel `{}` has no variable `{name}` (its variables: {})",
                spec.name,
                spec.var_names.join(", ")
            )));
        }
        let vals = spec
            .var_names
            .iter()
            .map(|k| {
                vars.iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| *v)
                    .ok_or_else(|| Error::Ir(kiln_device::kiln_ir::IrError::MissingVar(k.clone())))
            })
            .collect::<Result<Vec<i64>>>()?;
        self.exec_vals(kernel, bufs, &vals)
    }

    /// Records launches of kernels given as graphs: first compiles them all on `device` (the
    /// plan's device) with [`Device::compile_many`], so the kernels the cache does not hold
    /// compile together on all cores and a kernel launched several times compiles once;
    /// then records each launch in order, as [`ExecutionPlan::exec`] does. Returns the node
    /// indices, in `launches` order.
    ///
    /// # Errors
    /// The compile error of the first launch (in order) whose kernel fails, before anything
    /// is recorded; then the errors of [`ExecutionPlan::exec`] for the first launch that
    /// cannot be recorded (the launches before it stay recorded).
    pub fn exec_many(&mut self, device: &Device, launches: &[KernelLaunch<'_>]) -> Result<Vec<usize>> {
        let batch: Vec<_> = launches.iter().map(|l| (l.sink.clone(), l.name)).collect();
        let kernels = device.compile_many(&batch).into_iter().collect::<Result<Vec<Kernel>>>()?;
        launches.iter().zip(&kernels).map(|(l, k)| self.exec(k, l.bufs, l.vars)).collect()
    }

    /// [`ExecutionPlan::exec`] with the values positional, in the kernel's `var_names` order.
    ///
    /// # Errors
    /// As [`ExecutionPlan::exec`].
    pub fn exec_vals(&mut self, kernel: &Kernel, bufs: &[&Buffer], vals: &[i64]) -> Result<usize> {
        let spec = &kernel.spec;
        let device = self.factory.dyn_device();
        if spec.device.base_type() != device.base_type() {
            return Err(Error::Launch(format!(
                "kernel `{}` was built for {}, this plan runs on the queues of {device}",
                spec.name, spec.device
            )));
        }
        // A launch that needs the guarded form records the kernel itself; each run prepares it.
        let dims = kernel.prepare(bufs, vals)?.dims;
        // Bind the kernel's variables to plan variables without changing anything yet.
        let mut var_index = Vec::with_capacity(vals.len());
        let mut new_vars: Vec<(&str, i64)> = Vec::new();
        for (name, &v) in spec.var_names.iter().zip(vals) {
            match self.var_names.iter().position(|n| n == name) {
                Some(i) if self.var_defaults[i] != v => {
                    return Err(Error::Launch(format!(
                        "variable `{name}` was recorded as {} by an earlier node and as {v} now; a plan variable has one value per run",
                        self.var_defaults[i]
                    )));
                }
                Some(i) => var_index.push(i),
                None => match new_vars.iter().position(|(n, _)| n == name) {
                    Some(j) => var_index.push(self.var_names.len() + j),
                    None => {
                        var_index.push(self.var_names.len() + new_vars.len());
                        new_vars.push((name, v));
                    }
                },
            }
        }
        let work = dims.global.iter().chain(dims.local.iter().flatten()).fold(1u64, |a, &d| a.saturating_mul(d as u64));

        for (name, v) in new_vars {
            self.var_names.push(name.to_string());
            self.var_defaults.push(v);
        }
        let vals_at = self.node_vals.len();
        self.node_vals.extend_from_slice(vals);
        let kind = NodeKind::Exec {
            kernel: kernel.clone(),
            bufs: bufs.iter().map(|b| (*b).clone()).collect(),
            var_index,
            vals_at,
        };
        let accesses = kind.accesses();
        Ok(self.push(kind, &accesses, work))
    }

    /// Records a copy of `src` into `dst` (same byte size, not overlapping; either may be on
    /// another device). Returns the node index.
    ///
    /// # Errors
    /// [`Error::Buffer`] when the sizes differ or the two are overlapping windows of one buffer;
    /// [`Error::DeviceLost`] for a buffer of an ended device generation.
    pub fn copy(&mut self, dst: &Buffer, src: &Buffer) -> Result<usize> {
        dst.check_current()?;
        src.check_current()?;
        if dst.nbytes() != src.nbytes() {
            return Err(Error::Buffer(format!(
                "copy of {} bytes into a buffer of {} bytes",
                src.nbytes(),
                dst.nbytes()
            )));
        }
        if dst.overlaps(src) {
            return Err(Error::Buffer("copy between overlapping windows of one buffer".into()));
        }
        let kind = NodeKind::Copy { dst: dst.clone(), src: src.clone(), markers: None };
        let accesses = kind.accesses();
        Ok(self.push(kind, &accesses, (dst.nbytes() / 16) as u64))
    }

    /// Records collective `op` on `channel` over this rank's `send` and `recv` (the same
    /// buffer for a broadcast, a send or a receive), both on the plan's device; returns the
    /// node index. The node runs once the nodes writing `send` finished, and the nodes
    /// reading `recv` run after it; the collectives of one channel run in the order recorded.
    /// Every rank records the same collectives of the channel in the same order (each in its
    /// own plan). In a run, the node waits for its peers at most the channel's timeout and
    /// never past the run's end (its submission plus the plan's timeout); a peer missing
    /// either way is [`Error::Channel`]. A run that fails before one of its collectives (or
    /// is refused before anything is queued) leaves the channel, so that the peers fail at
    /// once ([`Channel::leave`]); see [`kiln_device::collective`] for the buffers each
    /// collective takes and what failure does.
    ///
    /// # Errors
    /// Before anything runs: [`Error::Buffer`] for buffers not on the plan's device or that do
    /// not fit `op` (dtype, length, overlap), [`Error::Invalid`] for a root or peer out of
    /// range, [`Error::Channel`] for a broken channel, [`Error::DeviceLost`] for a buffer of an
    /// ended generation. While running (from [`ExecutionPlan::run`]): [`Error::Channel`], also
    /// when the plan's timeout passed while the collective waited for a peer.
    pub fn collective(
        &mut self,
        channel: &Arc<dyn Channel>,
        op: Collective,
        send: &Buffer,
        recv: &Buffer,
    ) -> Result<usize> {
        send.check_current()?;
        recv.check_current()?;
        let device = self.factory.dyn_device();
        if let Some(b) = [send, recv].into_iter().find(|b| b.device() != device) {
            return Err(Error::Buffer(format!(
                "{}: a buffer on {} in a plan on {device}; a rank's collectives take buffers of its plan's device",
                op.name(),
                b.device()
            )));
        }
        collective::check(channel.as_ref(), op, send, recv)?;
        let cost = (send.nbytes().max(recv.nbytes()) / 16) as u64;
        let name = op.name();
        let kind = NodeKind::Collective { channel: channel.clone(), op, send: send.clone(), recv: recv.clone(), name };
        let accesses = kind.accesses();
        Ok(self.push(kind, &accesses, cost))
    }

    /// [`ExecutionPlan::collective`] of [`Collective::AllReduce`]: `recv` gets `op` over every
    /// rank's `send` (`send` and `recv` may be one buffer).
    ///
    /// # Errors
    /// As [`ExecutionPlan::collective`].
    pub fn all_reduce(
        &mut self,
        channel: &Arc<dyn Channel>,
        send: &Buffer,
        recv: &Buffer,
        op: ReduceOp,
    ) -> Result<usize> {
        self.collective(channel, Collective::AllReduce(op), send, recv)
    }

    /// [`ExecutionPlan::collective`] of [`Collective::AllGather`]: `recv` (`count` times
    /// `send`'s length) gets every rank's `send` in rank order.
    ///
    /// # Errors
    /// As [`ExecutionPlan::collective`].
    pub fn all_gather(&mut self, channel: &Arc<dyn Channel>, send: &Buffer, recv: &Buffer) -> Result<usize> {
        self.collective(channel, Collective::AllGather, send, recv)
    }

    /// [`ExecutionPlan::collective`] of [`Collective::ReduceScatter`]: `recv` gets this rank's
    /// block of `op` over every rank's `send` (`count` times `recv`'s length).
    ///
    /// # Errors
    /// As [`ExecutionPlan::collective`].
    pub fn reduce_scatter(
        &mut self,
        channel: &Arc<dyn Channel>,
        send: &Buffer,
        recv: &Buffer,
        op: ReduceOp,
    ) -> Result<usize> {
        self.collective(channel, Collective::ReduceScatter(op), send, recv)
    }

    /// [`ExecutionPlan::collective`] of [`Collective::Broadcast`]: every rank's `buffer` gets
    /// rank `root`'s.
    ///
    /// # Errors
    /// As [`ExecutionPlan::collective`].
    pub fn broadcast(&mut self, channel: &Arc<dyn Channel>, buffer: &Buffer, root: usize) -> Result<usize> {
        self.collective(channel, Collective::Broadcast { root }, buffer, buffer)
    }

    /// [`ExecutionPlan::collective`] of [`Collective::Send`]: `buffer` goes to rank `peer`.
    ///
    /// # Errors
    /// As [`ExecutionPlan::collective`].
    pub fn send(&mut self, channel: &Arc<dyn Channel>, buffer: &Buffer, peer: usize) -> Result<usize> {
        self.collective(channel, Collective::Send { peer }, buffer, buffer)
    }

    /// [`ExecutionPlan::collective`] of [`Collective::Recv`]: `buffer` gets rank `peer`'s.
    ///
    /// # Errors
    /// As [`ExecutionPlan::collective`].
    pub fn recv(&mut self, channel: &Arc<dyn Channel>, buffer: &Buffer, peer: usize) -> Result<usize> {
        self.collective(channel, Collective::Recv { peer }, buffer, buffer)
    }

    fn push(&mut self, kind: NodeKind, accesses: &[Access], cost: u64) -> usize {
        let index = self.nodes.len();
        if std::mem::take(&mut self.tracker_stale) {
            // The recorded nodes' orders stay as they were (a rebinding keeps them valid);
            // the tracker learns their current buffers for the new node's dependencies.
            self.tracker = HazardTracker::new();
            for (i, n) in self.nodes.iter().enumerate() {
                self.tracker.record(i, &n.kind.accesses());
            }
        }
        let deps = self.tracker.record(index, accesses);
        self.nodes.push(Node { kind, deps, cost, stamps: Arc::new(Stamps::default()) });
        self.schedule = None;
        self.checked = None;
        // The graph is dropped: first wait for a run of it that timed out, so that the next
        // run (through the queues) cannot race with it.
        let _ = self.wait_graph();
        self.graph = GraphState::Untried;
        index
    }

    /// Number of recorded nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether nothing was recorded (a run then does nothing).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Each queue's signal value at the end of the last submitted run (compute queues
    /// first, then the copy queue; empty before the first run). Runs only raise these.
    pub fn timeline(&self) -> &[u64] {
        &self.base
    }

    /// The plan variables, in the order [`ExecutionPlan::run_vals`] takes their values.
    pub fn var_names(&self) -> &[String] {
        &self.var_names
    }

    /// The values the plan variables were recorded with, in [`ExecutionPlan::var_names`]
    /// order: what a run binds for a variable it is not given.
    pub fn var_defaults(&self) -> &[i64] {
        &self.var_defaults
    }

    /// The device family the plan's queues run on.
    pub(crate) fn device_spec(&self) -> &kiln_device::kiln_ir::DeviceSpec {
        self.factory.dyn_device()
    }

    /// The recorded nodes in order, as a saved plan writes them (see [`crate::saved`]).
    pub(crate) fn recorded(&self) -> impl Iterator<Item = Recorded<'_>> {
        self.nodes.iter().map(|n| match &n.kind {
            NodeKind::Exec { kernel, bufs, .. } => Recorded::Exec { kernel, bufs },
            NodeKind::Copy { dst, src, .. } => Recorded::Copy { dst, src },
            NodeKind::Collective { name, .. } => Recorded::Collective { name },
        })
    }

    /// The earlier nodes node `node` must run after (empty for an unknown node).
    pub fn dependencies(&self, node: usize) -> &[Dependency] {
        self.nodes.get(node).map_or(&[], |n| &n.deps)
    }

    /// The queue each node runs on (compute queues first, then the copy queue), scheduling
    /// the plan if recording changed it. Creates the queues on first use.
    ///
    /// # Errors
    /// What the device returns when creating a queue or signal fails (e.g. [`Error::Driver`]).
    pub fn queue_assignment(&mut self) -> Result<Vec<usize>> {
        self.prepare()?;
        Ok(self.schedule.as_ref().map(|s| s.queue.clone()).unwrap_or_default())
    }

    /// Number of cross-queue waits a run records.
    ///
    /// # Errors
    /// As [`ExecutionPlan::queue_assignment`].
    pub fn wait_count(&mut self) -> Result<usize> {
        self.prepare()?;
        Ok(self.schedule.as_ref().map_or(0, Schedule::wait_count))
    }

    /// Runs every node once and waits for all of them. `vars` overrides plan variables by
    /// name; the others keep their recorded values. Launch sizes and buffer sizes are
    /// checked for the new values before anything is submitted; nothing is recompiled.
    ///
    /// Failure: a node that fails on its queue fails that queue's signal, which fails every
    /// queue waiting on it; `run` waits for every queue to stop and returns the failing
    /// node's own error. The plan stays usable: the next run creates fresh queues and signals.
    ///
    /// # Errors
    /// Before anything runs: [`Error::Launch`] for a name that is no plan variable, or a node
    /// whose launch or buffer sizes are invalid for the new values (the message names the
    /// node); [`Error::Ir`] for a value outside its variable's bounds; [`Error::OutOfBounds`]
    /// for an access that cannot be proven inside its buffer with these values. While
    /// running: the failing node's own error, or [`Error::Timeout`] after
    /// [`PlanOptions::timeout`].
    pub fn run(&mut self, vars: &[(&str, i64)]) -> Result<()> {
        let vals = self.resolve(vars)?;
        self.run_vals(&vals)
    }

    /// Tells the peers of every channel the plan's collectives use that this rank's next run
    /// will not come, because of `why` (see [`Channel::leave`]): they fail at once instead of
    /// at their timeout, and the channels are broken. The plan's own runs do it when they fail
    /// or are refused; a caller that refuses to start a run itself calls it.
    pub fn leave(&self, why: &Error) {
        if self.nodes.iter().any(|n| matches!(n.kind, NodeKind::Collective { .. })) {
            let (run, _) = RunCollectives::new(self.collective_nodes(), Duration::ZERO);
            run.close(why);
        }
    }

    /// [`ExecutionPlan::leave`], returning `why`.
    fn leave_channels(&self, why: Error) -> Error {
        self.leave(&why);
        why
    }

    /// Every collective node's channel and collective, in recorded order.
    fn collective_nodes(&self) -> impl Iterator<Item = (&Arc<dyn Channel>, Collective)> {
        self.nodes.iter().filter_map(|n| match &n.kind {
            NodeKind::Collective { channel, op, .. } => Some((channel, *op)),
            _ => None,
        })
    }

    /// [`ExecutionPlan::run`] with every plan variable positional, in
    /// [`ExecutionPlan::var_names`] order (no name lookups).
    ///
    /// # Errors
    /// As [`ExecutionPlan::run`], and [`Error::Launch`] when `vals` does not hold one value
    /// per plan variable.
    pub fn run_vals(&mut self, vals: &[i64]) -> Result<()> {
        if self.graph_run(vals)? {
            return Ok(());
        }
        self.submit_vals(vals, false)?.wait()
    }

    /// Submits a run and returns without waiting; [`PlanRun::wait`] (or dropping the handle)
    /// waits. The handle borrows the plan, so runs never overlap.
    ///
    /// # Errors
    /// The errors [`ExecutionPlan::run`] reports before anything runs; failures while running
    /// come from [`PlanRun::wait`].
    pub fn submit(&mut self, vars: &[(&str, i64)]) -> Result<PlanRun<'_>> {
        let vals = self.resolve(vars)?;
        self.submit_vals(&vals, false)
    }

    /// Runs once with timing on the executing side and returns the timeline.
    ///
    /// Every node is recorded with `exec_timed`/`copy_timed`: a queue that runs programs on
    /// its own threads (CPU) reports the host times around each kernel, and one that enqueues
    /// them natively (OpenCL) the device's own start and end of each command, placed on the
    /// host clock. A fused segment times each of its nodes; copies between host buffers are
    /// timed by marker programs around them. A node no queue measured (a copy on a queue
    /// that neither runs markers nor measures copies) is missing from the profile.
    ///
    /// # Errors
    /// As [`ExecutionPlan::run`].
    pub fn run_profiled(&mut self, vars: &[(&str, i64)]) -> Result<Profile> {
        let vals = self.resolve(vars)?;
        let start = Instant::now();
        let run = self.submit_vals(&vals, true)?;
        run.wait()?;
        let wall = start.elapsed();
        let mut events: Vec<ProfileEvent> = Vec::with_capacity(self.nodes.len());
        let schedule = self.schedule.as_ref().ok_or_else(|| Error::Invalid("plan lost its schedule".into()))?;
        for (i, node) in self.nodes.iter().enumerate() {
            if let Some((s, e)) = node.stamps.read(self.epoch) {
                let rel = |t: Duration| t.saturating_sub(start.saturating_duration_since(self.epoch));
                events.push(ProfileEvent {
                    node: i,
                    name: node.name().to_string(),
                    queue: schedule.queue[i],
                    start: rel(s),
                    end: rel(e),
                });
            }
        }
        events.sort_by_key(|e| (e.start, e.node));
        let layout = self.lanes.as_ref().map_or(QueueLayout { compute: 0, copy: false }, |l| l.layout);
        let mut queue_names: Vec<String> = (0..layout.compute).map(|q| format!("compute {q}")).collect();
        if layout.copy {
            queue_names.push("copy".into());
        }
        Ok(Profile { events, queue_names, wall })
    }

    /// Plan variable values for `vars` (overrides by name, defaults otherwise). A name that is
    /// no plan variable fails the run before anything is queued: the plan leaves its channels.
    fn resolve(&self, vars: &[(&str, i64)]) -> Result<Vec<i64>> {
        self.resolve_names(vars).map_err(|e| self.leave_channels(e))
    }

    fn resolve_names(&self, vars: &[(&str, i64)]) -> Result<Vec<i64>> {
        let mut vals = self.var_defaults.clone();
        for (name, v) in vars {
            let i = self.var_names.iter().position(|n| n == name).ok_or_else(|| {
                Error::Launch(format!(
                    "the plan has no variable `{name}` (its variables: {})",
                    if self.var_names.is_empty() { "none".to_string() } else { self.var_names.join(", ") }
                ))
            })?;
            vals[i] = *v;
        }
        Ok(vals)
    }

    /// Schedules the nodes and creates queues and signals, if not done yet.
    fn prepare(&mut self) -> Result<()> {
        if self.lanes.is_none() {
            let compute = self.options.compute_queues.max(1);
            let mut queues = Vec::with_capacity(compute + 1);
            for _ in 0..compute {
                queues.push(self.factory.create_dyn_compute_queue()?);
            }
            let mut copy = false;
            if self.options.use_copy_queue
                && let Some(q) = self.factory.create_dyn_copy_queue()?
            {
                queues.push(q);
                copy = true;
            }
            let signals = (0..queues.len()).map(|_| self.factory.create_dyn_signal()).collect::<Result<Vec<_>>>()?;
            let layout = QueueLayout { compute, copy };
            if self.schedule.as_ref().is_some_and(|s| s.order.len() != layout.len()) {
                self.schedule = None;
            }
            // New signals of a new layout start the timeline above every value used so far.
            let floor = self.base.iter().copied().max().unwrap_or(0);
            let start = signals.iter().map(|s| s.value()).max().unwrap_or(0).max(floor);
            if self.base.len() != signals.len() {
                self.base = vec![start; signals.len()];
            }
            for (b, s) in self.base.iter_mut().zip(&signals) {
                *b = (*b).max(s.value());
            }
            self.lanes = Some(Lanes { layout, queues, signals });
        }
        if self.schedule.is_none() {
            let layout = self.lanes.as_ref().map_or(QueueLayout { compute: 1, copy: false }, |l| l.layout);
            let deps: Vec<Vec<usize>> = self.nodes.iter().map(|n| n.deps.iter().map(|d| d.node).collect()).collect();
            let lanes: Vec<Lane> = self
                .nodes
                .iter()
                .map(|n| if matches!(n.kind, NodeKind::Copy { .. }) { Lane::Copy } else { Lane::Compute })
                .collect();
            let costs: Vec<u64> = self.nodes.iter().map(|n| n.cost).collect();
            let s = schedule(&deps, &lanes, &costs, layout);
            let fusable: Vec<bool> = self
                .nodes
                .iter()
                .map(|n| match &n.kind {
                    NodeKind::Exec { kernel, bufs, .. } => {
                        self.options.fuse
                            && kernel.spec.device.base_type() == self.factory.dyn_device().base_type()
                            && bufs.iter().all(|b| b.allocator().is_host())
                    }
                    NodeKind::Copy { .. } | NodeKind::Collective { .. } => false,
                })
                .collect();
            (self.segments, self.segment_of) = find_segments(&s, &fusable);
            self.schedule = Some(s);
            self.checked = None;
        }
        Ok(())
    }

    /// Fills every node's positional values from the plan values, checks each launch
    /// (bounds, launch sizes, buffer sizes) and builds the fused segments, unless these exact
    /// values were bound before (for the same kind of run).
    fn bind(&mut self, vals: &[i64], profiled: bool) -> Result<()> {
        self.check_vals_len(vals)?;
        if self.checked.as_ref().is_some_and(|(v, p)| v == vals && *p == profiled) {
            return Ok(());
        }
        self.checked = None;
        let mut launches: Vec<Vec<Launch>> = self.segments.iter().map(|g| Vec::with_capacity(g.nodes.len())).collect();
        let mut scratch: Vec<&Buffer> = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if let NodeKind::Exec { kernel, bufs, var_index, vals_at } = &node.kind {
                let slot = &mut self.node_vals[*vals_at..*vals_at + var_index.len()];
                for (dst, &vi) in slot.iter_mut().zip(var_index) {
                    *dst = vals[vi];
                }
                scratch.clear();
                scratch.extend(bufs.iter());
                let prepared = kernel.prepare(&scratch, slot).map_err(|e| with_node(e, i, &kernel.spec.name))?;
                if let Some(g) = self.segment_of.get(i).copied().flatten() {
                    let PreparedLaunch { kernel, views, dims, faults } = prepared;
                    launches[g].push(Launch {
                        kernel,
                        views,
                        vals: slot.to_vec(),
                        dims,
                        faults,
                        timer: profiled.then(|| timer(&node.stamps)),
                    });
                }
            }
        }
        let device = self.factory.dyn_device().clone();
        for (g, launches) in self.segments.iter_mut().zip(launches) {
            let keep: Vec<Buffer> = g
                .nodes
                .iter()
                .filter_map(|&n| match &self.nodes[n].kind {
                    NodeKind::Exec { bufs, .. } => Some(bufs.iter().cloned()),
                    NodeKind::Copy { .. } | NodeKind::Collective { .. } => None,
                })
                .flatten()
                .collect();
            g.kernel = Some(fused_kernel(&device, launches, keep));
        }
        self.checked = Some((vals.to_vec(), profiled));
        Ok(())
    }

    /// Refuses `vals` unless it holds one value per plan variable.
    fn check_vals_len(&self, vals: &[i64]) -> Result<()> {
        if vals.len() != self.var_names.len() {
            return Err(Error::Launch(format!(
                "the plan takes {} variable value(s) ({}), got {}",
                self.var_names.len(),
                self.var_names.join(", "),
                vals.len()
            )));
        }
        Ok(())
    }

    /// Waits for a run that was submitted and never waited for (its handle was leaked), so
    /// two runs never overlap.
    ///
    /// A failed run's collectives are closed (see [`collectives`]): the wait returns after
    /// every collective that started has returned, and a timeout while one waited for a peer
    /// is that collective's channel error.
    fn drain(&mut self) -> Result<()> {
        let mut first = self.wait_graph().err();
        for (signal, value) in std::mem::take(&mut self.in_flight) {
            if let Err(e) = signal.wait(value, self.options.timeout) {
                first.get_or_insert(e);
            }
        }
        let collectives = self.collectives.take();
        let Some(e) = first else { return Ok(()) };
        let timed_out = matches!(e, Error::Timeout { .. });
        let e = self.recover(e);
        match collectives.and_then(|run| run.close(&e)) {
            Some(channel_error) if timed_out => Err(channel_error),
            _ => Err(e),
        }
    }

    fn submit_vals(&mut self, vals: &[i64], profiled: bool) -> Result<PlanRun<'_>> {
        // A leaked handle's run failing is that run's outcome, not this one's.
        let _ = self.drain();
        // A run refused before anything is queued leaves its channels: the peers fail now.
        let prepared = self.prepare().and_then(|()| {
            if profiled {
                self.prepare_profiling();
            }
            self.bind(vals, profiled)
        });
        if let Err(e) = prepared {
            return Err(self.leave_channels(e));
        }
        // The run's collectives (a plan without any allocates nothing here): the node index
        // of each, and its slot.
        let mut run = None;
        let mut slot_of = HashMap::new();
        if self.nodes.iter().any(|n| matches!(n.kind, NodeKind::Collective { .. })) {
            let (shared, slots) = RunCollectives::new(self.collective_nodes(), self.options.timeout);
            let nodes = self.nodes.iter().enumerate().filter(|(_, n)| matches!(n.kind, NodeKind::Collective { .. }));
            slot_of = nodes.map(|(i, _)| i).zip(slots).collect();
            run = Some(shared);
        }
        let (Some(schedule), Some(lanes)) = (self.schedule.as_ref(), self.lanes.as_mut()) else {
            return Err(Error::Invalid("plan has no schedule".into()));
        };
        let nq = lanes.queues.len();
        let mut submit_error = None;
        let mut scratch: Vec<&Buffer> = Vec::with_capacity(8);
        for q in 0..nq {
            let order = &schedule.order[q];
            if order.is_empty() {
                continue;
            }
            let queue = &mut lanes.queues[q];
            let mut at = 0;
            while at < order.len() {
                let mut n = order[at];
                at += 1;
                let node = &self.nodes[n];
                for w in &schedule.waits[n] {
                    queue.wait(&lanes.signals[w.queue], self.base[w.queue] + w.position);
                }
                if let Some(g) = self.segment_of[n].map(|g| &self.segments[g]) {
                    // Segments start at their first node and cover consecutive positions.
                    if let Some(k) = &g.kernel {
                        queue.exec(k, &[], &[]);
                    }
                    at += g.nodes.len() - 1;
                    n = g.nodes[g.nodes.len() - 1];
                } else {
                    match &node.kind {
                        NodeKind::Exec { kernel, bufs, var_index, vals_at } => {
                            scratch.clear();
                            scratch.extend(bufs.iter());
                            let vals = &self.node_vals[*vals_at..*vals_at + var_index.len()];
                            if profiled {
                                queue.exec_timed(kernel, &scratch, vals, &timer(&node.stamps));
                            } else {
                                queue.exec(kernel, &scratch, vals);
                            }
                        }
                        NodeKind::Copy { dst, src, markers } => match (profiled, markers) {
                            (true, Some((start, end))) => {
                                queue.exec(start, &[], &[]).copy(dst, src).exec(end, &[], &[]);
                            }
                            (true, None) => {
                                queue.copy_timed(dst, src, &timer(&node.stamps));
                            }
                            (false, _) => {
                                queue.copy(dst, src);
                            }
                        },
                        NodeKind::Collective { send, recv, .. } => {
                            let timer = profiled.then(|| timer(&node.stamps));
                            if let (Some(run), Some(slot)) = (&run, slot_of.get(&n)) {
                                queue.host(run.host_step(*slot, send, recv, timer));
                            }
                        }
                    }
                }
                if schedule.signal_after[n] {
                    queue.memory_barrier().signal(&lanes.signals[q], self.base[q] + schedule.position[n]);
                }
            }
            match queue.submit() {
                Ok(()) => self.in_flight.push((lanes.signals[q].clone(), self.base[q] + schedule.queue_len(q))),
                Err(e) => {
                    // Queues already submitted may wait on this queue or later ones, which
                    // will never signal: fail those signals so nothing hangs.
                    for s in &lanes.signals[q..] {
                        s.fail(e.clone());
                    }
                    submit_error = Some(e);
                    break;
                }
            }
        }
        for q in 0..nq {
            self.base[q] += schedule.queue_len(q);
        }
        self.collectives = run;
        Ok(PlanRun { plan: self, submit_error, waited: false })
    }

    fn prepare_profiling(&mut self) {
        let device = self.factory.dyn_device().clone();
        for node in &mut self.nodes {
            node.stamps.clear();
            // Markers are programs the queue must run itself: only on host memory.
            if let NodeKind::Copy { markers, dst, src } = &mut node.kind
                && markers.is_none()
                && dst.allocator().is_host()
                && src.allocator().is_host()
            {
                *markers = Some(profile::marker_kernels(&device, node.stamps.clone(), self.epoch));
            }
        }
    }

    /// After a failed run: the root cause among the failed signals; drops the queues and
    /// signals so the next run starts on fresh ones. After a timeout every signal is failed
    /// first, so queues still waiting on them stop instead of running into the next run.
    fn recover(&mut self, first: Error) -> Error {
        let Some(lanes) = self.lanes.take() else { return first };
        if matches!(first, Error::Timeout { .. }) {
            for s in &lanes.signals {
                s.fail(first.clone());
            }
        }
        let mut root: Option<Error> = None;
        for e in lanes.signals.iter().filter_map(|s| s.failure()) {
            if root.as_ref().is_none_or(|r| matches!(r, Error::SignalFailed(_))) {
                root = Some(e);
            }
        }
        match (root, first) {
            (Some(root), Error::SignalFailed(_)) => root,
            (_, first) => first,
        }
    }
}

/// A node's stamps as the timer its queue reports to.
fn timer(stamps: &Arc<Stamps>) -> Arc<dyn CommandTimer> {
    stamps.clone()
}

/// Adds the failing node to a launch check error.
fn with_node(e: Error, node: usize, name: &str) -> Error {
    match e {
        Error::Launch(m) => Error::Launch(format!("node {node} (`{name}`): {m}")),
        other => other,
    }
}

/// A submitted run. [`PlanRun::wait`] waits for every queue; dropping the handle waits too
/// (and discards the result), so a plan never starts a run while the previous one is in
/// flight.
pub struct PlanRun<'p> {
    plan: &'p mut ExecutionPlan,
    submit_error: Option<Error>,
    waited: bool,
}

impl PlanRun<'_> {
    /// Waits until every queue finished its part of the run (or stopped on a failure) and
    /// returns the first error: the failing node's own error, not the failures it caused
    /// downstream.
    ///
    /// # Errors
    /// The failing node's error (a kernel or copy that failed on its queue, or a queue that
    /// refused the submission), or [`Error::Timeout`] after [`PlanOptions::timeout`].
    pub fn wait(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.waited, true) {
            return Ok(());
        }
        let drained = self.plan.drain();
        match self.submit_error.take() {
            Some(e) => Err(self.plan.recover(e)),
            None => drained,
        }
    }
}

impl Drop for PlanRun<'_> {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

#[cfg(test)]
mod tests;
