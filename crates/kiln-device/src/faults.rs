//! Fault injection (cargo feature `fault-injection`, compiled out without it): a device whose
//! parts fail on purpose, so the recovery paths of [`crate::context`] can be tested on every
//! backend.
//!
//! A [`FaultPlan`] counts the operations of one kind and injects a failure at the Nth:
//!
//! | kind | counted operation | the injected failure |
//! |---|---|---|
//! | `compile` | a [`Compiler::compile`] call | [`Error::Compile`] |
//! | `alloc` | an [`Allocator::alloc`] call | [`Error::OutOfMemory`] |
//! | `kernel` | a launch of a kernel of the device: a host execute, a native enqueue or one launch of a replayed graph (the generation's [`crate::LaunchGate`]) | a fatal [`Error::Driver`] with code [`KERNEL_FAULT`] |
//! | `timeout` | a host [`TimelineSignal::wait`] on a signal of the device, or a [`LaunchGraph::wait`] for one of its graphs | [`Error::Timeout`], at once |
//! | `loss` | an allocation, host transfer, program load or launch | a fatal [`Error::Driver`] with code [`DEVICE_LOSS`] |
//!
//! The wrapper sits over any backend's [`DeviceParts`] (as wgpu-hal's `noop` backend sits
//! beside the real ones): [`inject`] wraps the allocator, the compilers, the program loader
//! the queue factory's signals and the graphs' waits, adds a launch gate, and otherwise
//! forwards every call.
//! Programs are not wrapped: a backend queue still enqueues them natively and the device's
//! graphs still capture them. It never marks the
//! device lost itself: a fatal error it returns reaches the device's context the way a real
//! driver's does ([`crate::Stamp::observe`] in the context's allocator, kernel origin and
//! queue wrappers), so the scenarios test the real recovery path.
//!
//! Use [`crate::Device::with_faults`], or set `KILN_FAULTS` (e.g. `compile:3,alloc:2,kernel:5`:
//! the 3rd compile, the 2nd allocation and the 5th launch of every device this process
//! opens fail; counts start at 1).

use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kiln_ir::DeviceSpec;

use crate::buffer::{Allocator, AllocatorStats, RawPtr, RawView};
use crate::error::{Error, Result};
use crate::graph::{GraphFactory, GraphLaunch, LaunchGraph};
use crate::kernel::LaunchGate;
use crate::parts::{CompilerPair, DeviceParts, PartsBuilder};
use crate::program::{CompiledSpec, Compiler, ProgramSpec, RuntimeFactory};
use crate::queue::{DynQueue, DynQueueFactory};
use crate::signal::TimelineSignal;

/// The environment variable read by [`FaultPlan::from_env`].
pub const FAULTS_ENV: &str = "KILN_FAULTS";
/// The native code of an injected kernel fault (a fatal driver error).
pub const KERNEL_FAULT: i64 = -9001;
/// The native code of an injected device loss (a fatal driver error).
pub const DEVICE_LOSS: i64 = -9002;
/// The `backend` of the driver errors this module injects.
pub const BACKEND: &str = "fault-injection";

/// A kind of operation the plan counts, and the failure it injects (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// `compile`: a compiler call fails with [`Error::Compile`].
    Compile,
    /// `alloc`: an allocation fails with [`Error::OutOfMemory`].
    Alloc,
    /// `kernel`: a launch fails with a fatal driver error ([`KERNEL_FAULT`]).
    Kernel,
    /// `timeout`: a host signal wait returns [`Error::Timeout`] at once.
    Timeout,
    /// `loss`: a device operation fails with a fatal driver error ([`DEVICE_LOSS`]).
    Loss,
}

impl FaultKind {
    const ALL: [FaultKind; 5] =
        [FaultKind::Compile, FaultKind::Alloc, FaultKind::Kernel, FaultKind::Timeout, FaultKind::Loss];

    /// The name in `KILN_FAULTS`.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Compile => "compile",
            FaultKind::Alloc => "alloc",
            FaultKind::Kernel => "kernel",
            FaultKind::Timeout => "timeout",
            FaultKind::Loss => "loss",
        }
    }
}

#[derive(Default)]
struct Counts {
    /// Operations seen, per kind (`FaultKind as usize`).
    seen: [u64; 5],
    injected: [u64; 5],
    /// Pending injections: (kind, the operation number that fails).
    armed: Vec<(FaultKind, u64)>,
}

/// Which operations fail (see the module docs). Shared by every generation of a device, so
/// counts run on across [`crate::Device::reset`]; it also counts what it did not fail, which
/// makes it a counting wrapper for tests (e.g. compiles after a reset).
#[derive(Default)]
pub struct FaultPlan {
    counts: Mutex<Counts>,
}

impl std::fmt::Debug for FaultPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = self.lock();
        write!(f, "FaultPlan(seen {:?}, armed {:?})", c.seen, c.armed)
    }
}

impl FaultPlan {
    /// A plan that injects nothing until armed.
    pub fn new() -> Arc<FaultPlan> {
        Arc::new(FaultPlan::default())
    }

    /// Parses `kind:n[,kind:n...]` (kinds `compile`, `alloc`, `kernel`, `timeout`, `loss`;
    /// `n` ≥ 1 counts from the plan's creation). An empty string injects nothing.
    ///
    /// # Errors
    /// [`Error::Config`] naming the item that has no `:`, names no fault kind or has no
    /// count ≥ 1.
    pub fn parse(spec: &str) -> Result<Arc<FaultPlan>> {
        let plan = FaultPlan::new();
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let bad = |why: &str| {
                Error::Config(format!(
                    "{FAULTS_ENV}: `{item}` {why}; write kind:n with kind one of compile, alloc, kernel, timeout, \
                     loss and n ≥ 1 (e.g. {FAULTS_ENV}=compile:3,alloc:2)"
                ))
            };
            let (kind, n) = item.split_once(':').ok_or_else(|| bad("has no `:`"))?;
            let kind = FaultKind::ALL
                .into_iter()
                .find(|k| k.name() == kind.trim())
                .ok_or_else(|| bad("names no fault kind"))?;
            let n: u64 = n.trim().parse().ok().filter(|&n| n >= 1).ok_or_else(|| bad("has no count ≥ 1"))?;
            plan.at(kind, n);
        }
        Ok(plan)
    }

    /// The plan in `KILN_FAULTS`, `None` when it is unset or empty.
    ///
    /// # Errors
    /// [`Error::Config`] when the variable is not UTF-8 or [`FaultPlan::parse`] refuses it.
    pub fn from_env() -> Result<Option<Arc<FaultPlan>>> {
        match std::env::var(FAULTS_ENV) {
            Ok(v) if !v.trim().is_empty() => FaultPlan::parse(&v).map(Some),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(Error::Config(format!("{FAULTS_ENV} is not UTF-8"))),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        // Nothing panics under this lock.
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fails the `nth` operation of `kind` counted since the plan was made (1 is the first;
    /// 0, or one already counted, never fires).
    pub fn at(&self, kind: FaultKind, nth: u64) -> &Self {
        self.lock().armed.push((kind, nth));
        self
    }

    /// Fails the `n`th operation of `kind` from now (1 is the next one).
    pub fn after(&self, kind: FaultKind, n: u64) -> &Self {
        let mut c = self.lock();
        let at = c.seen[kind as usize].saturating_add(n.max(1));
        c.armed.push((kind, at));
        self
    }

    /// Operations of `kind` counted so far (failed or not).
    pub fn seen(&self, kind: FaultKind) -> u64 {
        self.lock().seen[kind as usize]
    }

    /// Failures of `kind` injected so far.
    pub fn injected(&self, kind: FaultKind) -> u64 {
        self.lock().injected[kind as usize]
    }

    /// Counts one operation of `kind`; `Some(its number)` when it must fail.
    fn hit(&self, kind: FaultKind) -> Option<u64> {
        let mut c = self.lock();
        c.seen[kind as usize] += 1;
        let n = c.seen[kind as usize];
        let armed = c.armed.iter().position(|&a| a == (kind, n))?;
        c.armed.swap_remove(armed);
        c.injected[kind as usize] += 1;
        Some(n)
    }

    /// Counts a device operation (`what`) that a device loss can strike.
    fn device_op(&self, what: &str) -> Result<()> {
        match self.hit(FaultKind::Loss) {
            Some(n) => Err(fatal(DEVICE_LOSS, format!("injected device loss at device operation #{n} ({what})"))),
            None => Ok(()),
        }
    }

    /// Counts a launch of `program`: a kernel fault or a device loss may strike it.
    fn launch(&self, program: &str) -> Result<()> {
        if let Some(n) = self.hit(FaultKind::Kernel) {
            return Err(fatal(KERNEL_FAULT, format!("injected kernel fault in `{program}` (launch #{n})")));
        }
        self.device_op("a kernel launch")
    }

    /// An injected [`Error::Timeout`] for a wait for `target` (at `current`) of `timeout`.
    fn timeout(&self, target: u64, current: u64, timeout: Duration) -> Result<()> {
        match self.hit(FaultKind::Timeout) {
            Some(_) => {
                let waited_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                Err(Error::Timeout { target, current, waited_ms })
            }
            None => Ok(()),
        }
    }
}

fn fatal(code: i64, message: String) -> Error {
    Error::Driver { backend: BACKEND, code: Some(code), fatal: true, message }
}

/// `build` with the faults of `plan` injected into every generation it builds.
pub fn injecting(build: PartsBuilder, plan: Arc<FaultPlan>) -> PartsBuilder {
    Arc::new(move |ctx| Ok(inject(build(ctx)?, &plan)))
}

/// `parts` with the faults of `plan` injected (see the module docs).
pub fn inject(parts: DeviceParts, plan: &Arc<FaultPlan>) -> DeviceParts {
    let (runtime, loader) = (parts.runtime, plan.clone());
    let (inner_gate, launches) = (parts.gate, plan.clone());
    DeviceParts {
        allocator: Arc::new(FaultAllocator { inner: parts.allocator, plan: plan.clone() }),
        compilers: parts
            .compilers
            .into_iter()
            .map(|pair| CompilerPair {
                compiler: Arc::new(FaultCompiler { inner: pair.compiler, plan: plan.clone() }),
                ..pair
            })
            .collect(),
        runtime: Arc::new(move |compiled: &CompiledSpec| {
            loader.device_op("a program load")?;
            runtime(compiled)
        }) as RuntimeFactory,
        queues: parts
            .queues
            .map(|q| Arc::new(FaultQueues { inner: q, plan: plan.clone() }) as Arc<dyn DynQueueFactory>),
        missing: parts.missing,
        graphs: parts.graphs.map(|g| Arc::new(FaultGraphs { inner: g, plan: plan.clone() }) as Arc<dyn GraphFactory>),
        gate: Some(Arc::new(move |program: &str| {
            launches.launch(program)?;
            inner_gate.as_ref().map_or(Ok(()), |g| g(program))
        }) as LaunchGate),
    }
}

struct FaultCompiler {
    inner: Arc<dyn Compiler>,
    plan: Arc<FaultPlan>,
}

impl Compiler for FaultCompiler {
    fn compile(&self, spec: &ProgramSpec) -> Result<CompiledSpec> {
        if let Some(n) = self.plan.hit(FaultKind::Compile) {
            return Err(Error::Compile {
                message: format!("injected compile failure of `{}` (compile #{n})", spec.name),
                log: String::new(),
                line: None,
            });
        }
        self.inner.compile(spec)
    }

    /// The wrapped compiler's keys: injecting faults never changes a binary.
    fn cache_key(&self) -> &'static str {
        self.inner.cache_key()
    }

    fn fingerprint(&self) -> String {
        self.inner.fingerprint()
    }
}

struct FaultAllocator {
    inner: Arc<dyn Allocator>,
    plan: Arc<FaultPlan>,
}

impl Allocator for FaultAllocator {
    fn device(&self) -> &DeviceSpec {
        self.inner.device()
    }

    fn alloc(&self, bytes: usize) -> Result<RawPtr> {
        if self.plan.hit(FaultKind::Alloc).is_some() {
            let s = self.inner.stats();
            return Err(Error::OutOfMemory {
                device: self.inner.device().to_string(),
                requested: bytes,
                in_use: s.in_use,
                cached: s.cached,
                budget: s.budget,
            });
        }
        self.plan.device_op("an allocation")?;
        self.inner.alloc(bytes)
    }

    unsafe fn free(&self, ptr: RawPtr, bytes: usize) {
        // SAFETY: forwarded from this function's contract; `ptr` came from `inner.alloc`.
        unsafe { self.inner.free(ptr, bytes) }
    }

    unsafe fn copyin(&self, dst: RawView, src: &[u8]) -> Result<()> {
        self.plan.device_op("a host-to-device copy")?;
        // SAFETY: forwarded from this function's contract.
        unsafe { self.inner.copyin(dst, src) }
    }

    unsafe fn copyout(&self, dst: &mut [u8], src: RawView) -> Result<()> {
        self.plan.device_op("a device-to-host copy")?;
        // SAFETY: forwarded from this function's contract.
        unsafe { self.inner.copyout(dst, src) }
    }

    unsafe fn copy(&self, dst: RawView, src: RawView) -> Result<()> {
        self.plan.device_op("a device copy")?;
        // SAFETY: forwarded from this function's contract.
        unsafe { self.inner.copy(dst, src) }
    }

    fn is_host(&self) -> bool {
        self.inner.is_host()
    }

    fn dlpack_device_type(&self) -> Option<i32> {
        self.inner.dlpack_device_type()
    }

    fn stats(&self) -> AllocatorStats {
        self.inner.stats()
    }

    fn trim(&self) -> usize {
        self.inner.trim()
    }

    fn check(&self) -> Result<()> {
        self.inner.check()
    }
}

/// The backend's queues unchanged, its signals wrapped so host waits can time out.
struct FaultQueues {
    inner: Arc<dyn DynQueueFactory>,
    plan: Arc<FaultPlan>,
}

impl DynQueueFactory for FaultQueues {
    fn create_dyn_compute_queue(&self) -> Result<DynQueue> {
        self.inner.create_dyn_compute_queue()
    }

    fn create_dyn_copy_queue(&self) -> Result<Option<DynQueue>> {
        self.inner.create_dyn_copy_queue()
    }

    fn create_dyn_signal(&self) -> Result<Arc<dyn TimelineSignal>> {
        Ok(Arc::new(FaultSignal { inner: self.inner.create_dyn_signal()?, plan: self.plan.clone() }))
    }

    fn dyn_device(&self) -> &DeviceSpec {
        self.inner.dyn_device()
    }
}

/// A backend signal whose host waits can time out on purpose. Queues see through it: its
/// `as_any`/`into_any` are the backend signal's, so they downcast to their own type.
#[derive(Debug)]
struct FaultSignal {
    inner: Arc<dyn TimelineSignal>,
    plan: Arc<FaultPlan>,
}

impl TimelineSignal for FaultSignal {
    fn as_any(&self) -> &dyn Any {
        self.inner.as_any()
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self.inner.clone().into_any()
    }

    fn value(&self) -> u64 {
        self.inner.value()
    }

    fn set(&self, value: u64) {
        self.inner.set(value)
    }

    /// An injected timeout returns at once, as if `timeout` had passed: the signal is not
    /// failed and a later wait may succeed (the [`TimelineSignal`] contract of a timeout).
    fn wait(&self, value: u64, timeout: Duration) -> Result<()> {
        self.plan.timeout(value, self.inner.value(), timeout)?;
        self.inner.wait(value, timeout)
    }

    fn fail(&self, error: Error) {
        self.inner.fail(error)
    }

    fn failure(&self) -> Option<Error> {
        self.inner.failure()
    }

    fn is_reached(&self, value: u64) -> bool {
        self.inner.is_reached(value)
    }
}

/// A graph factory whose graphs' waits time out as the plan says.
struct FaultGraphs {
    inner: Arc<dyn GraphFactory>,
    plan: Arc<FaultPlan>,
}

impl GraphFactory for FaultGraphs {
    fn capture(&self, launches: &[GraphLaunch]) -> Result<Option<Box<dyn LaunchGraph>>> {
        let graph = self.inner.capture(launches)?;
        Ok(graph.map(|inner| Box::new(FaultGraph { inner, plan: self.plan.clone() }) as Box<dyn LaunchGraph>))
    }
}

struct FaultGraph {
    inner: Box<dyn LaunchGraph>,
    plan: Arc<FaultPlan>,
}

impl LaunchGraph for FaultGraph {
    fn update(&mut self, launches: &[GraphLaunch]) -> Result<bool> {
        self.inner.update(launches)
    }

    unsafe fn launch(&mut self) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.inner.launch() }
    }

    /// An injected timeout returns at once; the graph still runs, as after a real one.
    fn wait(&mut self, timeout: Duration) -> Result<()> {
        self.plan.timeout(1, 0, timeout)?;
        self.inner.wait(timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_and_fire_once_at_the_nth_operation() {
        let plan = FaultPlan::parse(" compile:2, loss:1 ,").unwrap();
        assert_eq!(plan.hit(FaultKind::Compile), None);
        assert_eq!(plan.hit(FaultKind::Compile), Some(2));
        assert_eq!(plan.hit(FaultKind::Compile), None);
        assert!(matches!(plan.device_op("x"), Err(Error::Driver { code: Some(DEVICE_LOSS), fatal: true, .. })));
        plan.device_op("x").unwrap();
        plan.after(FaultKind::Kernel, 2);
        plan.launch("k").unwrap();
        let e = plan.launch("k").unwrap_err();
        assert!(e.is_fatal() && e.to_string().contains("`k` (launch #2)"), "{e}");
        assert_eq!((plan.seen(FaultKind::Compile), plan.injected(FaultKind::Compile)), (3, 1));
        for bad in ["compile", "compile:0", "disk:1", "alloc:x"] {
            match FaultPlan::parse(bad) {
                Err(Error::Config(m)) => assert!(m.contains(bad) && m.contains("kind:n"), "{m}"),
                other => panic!("`{bad}` parsed: {other:?}"),
            }
        }
    }
}
