//! The loaded kernel: a backend's [`Program`] with its metadata and its origin.
//!
//! What a device adds around the programs it loads is owned here, by the kernel, never by
//! the program: the [`Origin`] (the device generation's [`Stamp`], the launch gate, the
//! device's [`GraphFactory`]), the compiled form a reset device reloads from, and the
//! guarded form a launch falls back to ([`crate::guarded`]). Every launch path goes through
//! the kernel: [`Kernel::launch`] and [`Kernel::execute`] on the host, [`Kernel::admit`]
//! before a backend queue enqueues the program natively, and the origin's graph factory for
//! a replayed graph. A wrapper therefore has nothing to forward, and a program is only what
//! runs.

use std::sync::{Arc, OnceLock};

use kiln_ir::{Guarded, UOp};

use crate::buffer::{Allocator, Buffer, RawView};
use crate::context::Stamp;
use crate::error::{Error, Result};
use crate::graph::GraphFactory;
use crate::guarded::FaultWatch;
use crate::program::{CompiledSpec, LaunchDims, Program, ProgramSpec, RuntimeFactory};

/// Called before every launch of a device generation's kernels, whichever path launches
/// them (a host execute, a native enqueue, a graph replay), with the program's name; an
/// error refuses the launch. Fault injection (`faults`, feature `fault-injection`) is one.
pub type LaunchGate = Arc<dyn Fn(&str) -> Result<()> + Send + Sync>;

/// Where a kernel was loaded: one generation of one device. Shared by every kernel of the
/// generation.
pub struct Origin {
    stamp: Stamp,
    gate: Option<LaunchGate>,
    graphs: Option<Arc<dyn GraphFactory>>,
}

impl std::fmt::Debug for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Origin({:?}, generation {})", self.stamp.context(), self.stamp.minted())
    }
}

impl Origin {
    /// The origin of kernels loaded under `stamp`'s generation, with the generation's launch
    /// gate and graph factory (already guarded by the stamp).
    pub(crate) fn new(stamp: Stamp, gate: Option<LaunchGate>, graphs: Option<Arc<dyn GraphFactory>>) -> Origin {
        Origin { stamp, gate, graphs }
    }

    /// The generation the kernels were loaded under.
    pub fn stamp(&self) -> &Stamp {
        &self.stamp
    }

    /// Admits one launch of `program` of this generation, whose stamp the caller checked:
    /// the launch gate, its error observed by the stamp (a fatal one loses the device).
    ///
    /// # Errors
    /// The gate's refusal.
    pub fn admit_current(&self, program: &dyn Program) -> Result<()> {
        self.gate.as_ref().map_or(Ok(()), |gate| self.stamp.observe(gate(program.name())))
    }

    /// [`Stamp::check`], then [`Origin::admit_current`].
    ///
    /// # Errors
    /// [`Error::DeviceLost`] / [`Error::DeviceFailed`], or the gate's refusal.
    pub fn admit(&self, program: &dyn Program) -> Result<()> {
        self.stamp.check("a kernel")?;
        self.admit_current(program)
    }
}

/// Loads compiled kernels: the backend's [`RuntimeFactory`] and, for a device generation,
/// the origin every kernel it loads gets.
#[derive(Clone)]
pub struct Loader {
    runtime: RuntimeFactory,
    origin: Option<Arc<Origin>>,
}

impl From<RuntimeFactory> for Loader {
    /// Kernels of `runtime` with no origin: no generation, gate or graphs (tests, tools).
    fn from(runtime: RuntimeFactory) -> Loader {
        Loader { runtime, origin: None }
    }
}

impl Loader {
    /// The loader of one device generation.
    pub(crate) fn of_generation(runtime: RuntimeFactory, origin: Arc<Origin>) -> Loader {
        Loader { runtime, origin: Some(origin) }
    }

    /// Loads `compiled` (of `spec`) as a kernel that keeps its compiled form.
    ///
    /// # Errors
    /// [`Error::DeviceLost`] / [`Error::DeviceFailed`] for a stale or lost generation; the
    /// runtime's errors ([`Error::Load`], [`Error::Driver`]).
    pub fn load(&self, spec: Arc<ProgramSpec>, compiled: &CompiledSpec) -> Result<Kernel> {
        let program = match &self.origin {
            Some(o) => {
                o.stamp.check("a kernel")?;
                o.stamp.observe((self.runtime)(compiled))?
            }
            None => (self.runtime)(compiled)?,
        };
        let loaded = Loaded { program, origin: self.origin.clone(), compiled: Some(compiled.clone()) };
        Ok(Kernel { spec, loaded: Arc::new(loaded), fallback: None })
    }
}

/// A loaded kernel with its metadata: the safe way to run a [`Program`].
#[derive(Clone)]
pub struct Kernel {
    /// What the kernel takes (buffers, variables, launch sizes); every launch is checked
    /// against it.
    pub spec: Arc<ProgramSpec>,
    /// The program and where it came from, shared by every clone (one reference count for a
    /// clone to take: kernels are cloned on every cache hit).
    loaded: Arc<Loaded>,
    /// The guarded form a launch falls back to when its proof fails
    /// ([`crate::guarded`]); `None` for kernels proven when built, and under
    /// [`crate::BoundsPolicy::Refuse`].
    pub(crate) fallback: Option<Arc<Fallback>>,
}

/// What a [`Loader`] made of one compiled kernel.
struct Loaded {
    /// The backend's loaded program; reentrant, so clones of the kernel may launch from
    /// several threads at once.
    program: Arc<dyn Program>,
    /// The device generation it was loaded under; `None` for a kernel built by hand.
    origin: Option<Arc<Origin>>,
    /// The compiled form it was loaded from: a reset device reloads it without compiling.
    compiled: Option<CompiledSpec>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({} on {})", self.spec.name, self.spec.device)
    }
}

impl Kernel {
    /// A kernel of `spec` run by `program`, built by hand: no device origin (no generation
    /// check, launch gate or graphs), no compiled form, no guarded fallback (a launch that
    /// cannot be proven in bounds is refused).
    pub fn new(spec: Arc<ProgramSpec>, program: Arc<dyn Program>) -> Kernel {
        Kernel { spec, loaded: Arc::new(Loaded { program, origin: None, compiled: None }), fallback: None }
    }

    /// The backend's program, for a queue that enqueues it natively (downcast it: `Program:
    /// Any`) after [`Kernel::admit`]. Run it through [`Kernel::execute`] otherwise.
    pub fn program(&self) -> &Arc<dyn Program> {
        &self.loaded.program
    }

    /// The backend's program as its concrete type `P`, for a queue of backend `backend` (`"the
    /// OpenCL backend"`) that enqueues it natively after [`Kernel::admit`].
    ///
    /// # Errors
    /// [`Error::Launch`] when another backend loaded the kernel (it was compiled for another
    /// device), saying so.
    pub fn program_as<P: Program>(&self, backend: &str) -> Result<&P> {
        let program: &dyn std::any::Any = self.loaded.program.as_ref();
        program.downcast_ref::<P>().ok_or_else(|| {
            Error::Launch(format!(
                "kernel `{}` was loaded for {}, not by {backend}: compile it with a device of that backend",
                self.spec.name, self.spec.device
            ))
        })
    }

    /// The device generation the kernel was loaded under; `None` for one built by hand.
    pub fn origin(&self) -> Option<&Arc<Origin>> {
        self.loaded.origin.as_ref()
    }

    /// The graph factory of the kernel's device, when it has one ([`crate::graph`]).
    pub fn graphs(&self) -> Option<&Arc<dyn GraphFactory>> {
        self.loaded.origin.as_ref().and_then(|o| o.graphs.as_ref())
    }

    /// The compiled form the kernel was loaded from, when it was loaded by a device.
    pub fn compiled(&self) -> Option<&CompiledSpec> {
        self.loaded.compiled.as_ref()
    }

    /// Whether the kernel may still run: [`Error::DeviceLost`] once its device was reset (it
    /// belongs to the old context), [`Error::DeviceFailed`] while the device is lost. A kernel
    /// built by hand is always current.
    ///
    /// # Errors
    /// [`Error::DeviceLost`] or [`Error::DeviceFailed`], as above.
    pub fn check_current(&self) -> Result<()> {
        self.loaded.origin.as_ref().map_or(Ok(()), |o| o.stamp.check("a kernel"))
    }

    /// Admits one launch that a queue enqueues natively, just before the enqueue: the
    /// generation check and the launch gate ([`Origin::admit`]). An error refuses the launch
    /// and fails the queue there, as a failed launch would.
    ///
    /// # Errors
    /// [`Error::DeviceLost`] / [`Error::DeviceFailed`], or the gate's refusal.
    pub fn admit(&self) -> Result<()> {
        self.loaded.origin.as_ref().map_or(Ok(()), |o| o.admit(&*self.loaded.program))
    }

    /// Runs the program to completion on the calling thread after [`Kernel::admit`]; a fatal
    /// error marks the kernel's device lost.
    ///
    /// # Errors
    /// The errors of [`Kernel::admit`] and [`Program::execute`].
    ///
    /// # Safety
    /// The contract of [`Program::execute`]; [`Kernel::check`] or [`Kernel::prepare`] gives
    /// the views and sizes.
    pub unsafe fn execute(&self, views: &[RawView], vals: &[i64], dims: &LaunchDims) -> Result<()> {
        self.check_current()?;
        // SAFETY: forwarded from this function's contract.
        unsafe { self.execute_current(views, vals, dims) }
    }

    /// [`Kernel::execute`] without the generation check, for a caller that checked this
    /// kernel's [`Origin::stamp`] just before (a fused run of one generation's kernels).
    ///
    /// # Errors
    /// The gate's refusal and the errors of [`Program::execute`].
    ///
    /// # Safety
    /// As [`Kernel::execute`].
    pub unsafe fn execute_current(&self, views: &[RawView], vals: &[i64], dims: &LaunchDims) -> Result<()> {
        match &self.loaded.origin {
            None => {
                // SAFETY: forwarded from this function's contract.
                unsafe { self.loaded.program.execute(views, vals, dims) }
            }
            Some(o) => {
                o.admit_current(&*self.loaded.program)?;
                // SAFETY: forwarded from this function's contract.
                let result = unsafe { self.loaded.program.execute(views, vals, dims) };
                // Only an error goes through `observe`: passing every `Ok` through it moved
                // the whole (large) result once more per launch, which a plan replay felt.
                if result.is_err() { o.stamp.observe(result) } else { Ok(()) }
            }
        }
    }

    /// Whether a launch that cannot be proven in bounds runs the guarded form
    /// ([`Kernel::prepare`]) rather than being refused.
    pub fn has_fallback(&self) -> bool {
        self.fallback.is_some()
    }

    /// This kernel without its guarded fallback: every launch that cannot be proven in
    /// bounds is refused (the strict path, as under [`crate::BoundsPolicy::Refuse`]).
    pub fn refusing(&self) -> Kernel {
        Kernel { fallback: None, ..self.clone() }
    }

    /// Checks `bufs` and `vals` against the kernel and returns what `Program::execute` needs:
    /// one buffer per slot, each on this kernel's device, of the parameter's dtype and at
    /// least the parameter's declared size; variables within bounds; launch sizes ≥ 1; and
    /// every LOAD and STORE proven to stay inside its buffer's declared size for these
    /// values ([`ProgramSpec::check_bounds`]), else [`Error::OutOfBounds`] naming the access.
    ///
    /// Together these are the safe path's guarantee: a kernel that passes cannot read or
    /// write memory outside the buffers it is given. Queues and execution plans launch
    /// through this check (plans again whenever a run binds new variable values).
    ///
    /// # Errors
    /// [`Error::DeviceLost`] / [`Error::DeviceFailed`] when the kernel's device generation
    /// ended or failed; the errors of [`ProgramSpec::launch_dims`] and
    /// [`ProgramSpec::param_lens`]; [`Error::Launch`] for a wrong buffer count, or a buffer on
    /// another device, of another dtype or too short; [`Error::OutOfBounds`]; the errors of
    /// [`Buffer::raw`].
    pub fn check(&self, bufs: &[&Buffer], vals: &[i64]) -> Result<(Vec<RawView>, LaunchDims)> {
        self.check_current()?;
        let spec = &self.spec;
        let dims = spec.launch_dims(vals)?;
        if bufs.len() != spec.params.len() {
            return Err(Error::Launch(format!(
                "kernel `{}` takes {} buffer(s), got {}",
                spec.name,
                spec.params.len(),
                bufs.len()
            )));
        }
        let lens = spec.param_lens(vals)?;
        spec.check_bounds(vals, &dims, &lens)?;
        let mut views = Vec::with_capacity(bufs.len());
        for ((p, &want), b) in spec.params.iter().zip(&lens).zip(bufs) {
            if b.device().base_type() != spec.device.base_type() {
                return Err(Error::Launch(format!(
                    "buffer {} is on {}, the kernel runs on {}",
                    p.slot,
                    b.device(),
                    spec.device
                )));
            }
            if b.dtype() != p.scalar {
                return Err(Error::Launch(format!(
                    "buffer {} holds {}, the kernel expects {}",
                    p.slot,
                    b.dtype(),
                    p.scalar
                )));
            }
            if b.len() < want {
                return Err(Error::Launch(format!(
                    "buffer {} has {} elements, the kernel needs {want} for these variables",
                    p.slot,
                    b.len()
                )));
            }
            views.push(b.raw()?);
        }
        Ok((views, dims))
    }

    /// Runs the kernel to completion on the calling thread, after [`Kernel::prepare`]: a
    /// launch that could touch memory outside its buffers runs guarded or is refused, and a
    /// guarded access that tried to leave its buffer fails the launch.
    ///
    /// # Errors
    /// The errors of [`Kernel::prepare`], then those of [`Kernel::execute`] and
    /// [`FaultWatch::check`].
    pub fn launch(&self, bufs: &[&Buffer], vals: &[i64]) -> Result<()> {
        let launch = self.prepare(bufs, vals)?;
        // SAFETY: `prepare` checked the executed kernel's every buffer (count, device, dtype,
        // size), the variables' bounds, the launch sizes and that every access stays in
        // bounds (a guarded form's accesses by their own guards); the borrowed `bufs` and the
        // launch's fault record keep the memory alive for this synchronous call.
        unsafe { launch.kernel.execute(&launch.views, vals, &launch.dims) }?;
        launch.faults.as_ref().map_or(Ok(()), FaultWatch::check)
    }
}

/// Compiles a kernel of the device a [`Fallback`] belongs to (its cache and toolchain).
pub(crate) type CompileFn = dyn Fn(&Arc<UOp>) -> Result<Kernel> + Send + Sync;

/// A kernel's guarded form, compiled on first need (an error is not kept: the next launch
/// that needs the form tries again).
pub(crate) struct Fallback {
    compile: Box<CompileFn>,
    allocator: Arc<dyn Allocator>,
    built: OnceLock<(Arc<Guarded>, Kernel)>,
}

impl Fallback {
    pub(crate) fn new(compile: Box<CompileFn>, allocator: Arc<dyn Allocator>) -> Fallback {
        Fallback { compile, allocator, built: OnceLock::new() }
    }

    /// The guarded form of `kernel`: its accesses left open at build time guard themselves.
    fn get(&self, kernel: &Kernel) -> Result<&(Arc<Guarded>, Kernel)> {
        if let Some(built) = self.built.get() {
            return Ok(built);
        }
        let guarded = kiln_ir::guard(&kernel.spec.ast, &kernel.spec.bounds.pending_nodes())?;
        let compiled = (self.compile)(&guarded.sink)?;
        // Two launches racing here compile one kernel (the cache joins them); either wins.
        Ok(self.built.get_or_init(|| (Arc::new(guarded), compiled)))
    }
}

/// A launch checked and ready to run: the kernel to execute (the one launched, or its guarded
/// form) with its buffers' views and sizes, and the faults to check once it ran.
#[derive(Debug)]
pub struct PreparedLaunch {
    /// What to execute: the launched kernel, or its guarded form (one buffer more).
    pub kernel: Kernel,
    /// One view per buffer of `kernel`, checked by [`Kernel::check`].
    pub views: Vec<RawView>,
    /// The checked launch sizes.
    pub dims: LaunchDims,
    /// `Some` when `kernel` is a guarded form: check it after the run.
    pub faults: Option<FaultWatch>,
}

impl Kernel {
    /// The safe launch's check with its fallback: [`Kernel::check`], and when that refuses
    /// the launch only because an access could not be proven in bounds, the kernel's guarded
    /// form with a fresh fault record ([`crate::guarded`]). Queues, plans and
    /// [`Kernel::launch`] run what this returns and then [`FaultWatch::check`] the faults.
    ///
    /// # Errors
    /// The errors of [`Kernel::check`]; [`Error::OutOfBounds`] as `check` gives it when the
    /// device's policy is [`crate::BoundsPolicy::Refuse`] or the access cannot be guarded (its
    /// address is not an INDEX chain over a buffer); the errors of compiling the guarded
    /// form or allocating its record.
    pub fn prepare(&self, bufs: &[&Buffer], vals: &[i64]) -> Result<PreparedLaunch> {
        let refused = match self.check(bufs, vals) {
            Ok((views, dims)) => return Ok(PreparedLaunch { kernel: self.clone(), views, dims, faults: None }),
            Err(e @ Error::OutOfBounds { .. }) => e,
            Err(e) => return Err(e),
        };
        let Some(fallback) = &self.fallback else { return Err(refused) };
        let (guarded, kernel) = match fallback.get(self) {
            Ok(g) => g,
            Err(Error::Ir(_)) => return Err(refused), // not guardable: the proof's error says why
            Err(e) => return Err(e),
        };
        let record = Buffer::new(fallback.allocator.clone(), kiln_ir::Scalar::I64, 2 * guarded.accesses.len())?;
        let faults = FaultWatch::new(record, self.spec.name.clone(), guarded.clone(), self.spec.param_lens(vals)?);
        faults.arm()?;
        let mut all: Vec<&Buffer> = bufs.to_vec();
        all.push(faults.record());
        match kernel.check(&all, vals) {
            Ok((views, dims)) => Ok(PreparedLaunch { kernel: kernel.clone(), views, dims, faults: Some(faults) }),
            // The guards bound every access by its own buffer's size, which a launch may
            // still fail to prove when that size wraps in the kernel's arithmetic.
            Err(Error::OutOfBounds { .. }) => Err(refused),
            Err(e) => Err(e),
        }
    }
}
