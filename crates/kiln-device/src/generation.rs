//! One generation of a device's parts as callers see them: every part the backend built
//! ([`DeviceParts`]) behind the generation's [`Stamp`] (see [`crate::context`]), and the
//! [`Origin`] its kernels are loaded with.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kiln_ir::DeviceSpec;

use crate::buffer::{Allocator, AllocatorStats, RawPtr, RawView};
use crate::cache::Toolchain;
use crate::context::Stamp;
use crate::error::{Error, Result};
use crate::graph::{GraphFactory, GraphLaunch, LaunchGraph};
use crate::kernel::{Loader, Origin};
use crate::parts::{CompilerPair, DeviceParts};
use crate::program::RuntimeFactory;
use crate::queue::{DynQueue, DynQueueFactory};
use crate::signal::TimelineSignal;

/// One generation of a device's parts, as callers see them (wrapped in its stamp).
pub(crate) struct Generation {
    pub(crate) allocator: Arc<dyn Allocator>,
    pub(crate) compilers: Vec<CompilerPair>,
    /// The pairs the backend cannot offer here, with why.
    pub(crate) missing: Vec<(String, String)>,
    /// The backend's program loader, unwrapped.
    pub(crate) runtime: RuntimeFactory,
    /// Loads kernels of this generation (the runtime with the generation's origin).
    pub(crate) loader: Loader,
    pub(crate) queues: Option<Arc<dyn DynQueueFactory>>,
    /// Each pair's toolchain (with the compiler's fingerprint), made at the pair's first compile.
    pub(crate) toolchains: Vec<OnceLock<Arc<Toolchain>>>,
}

impl Generation {
    pub(crate) fn new(parts: DeviceParts, stamp: Stamp) -> Result<Generation> {
        let spec = stamp.context().spec();
        if parts.compilers.is_empty() {
            return Err(Error::Invalid(format!("device {spec} needs at least one renderer/compiler pair")));
        }
        for (i, pair) in parts.compilers.iter().enumerate() {
            if pair.name.is_empty() || parts.compilers[..i].iter().any(|p| p.name == pair.name) {
                return Err(Error::Invalid(format!(
                    "device {spec}: compiler pair {i} is named `{}`; every pair needs a name of its own",
                    pair.name
                )));
            }
        }
        let gate = parts.gate;
        let graphs = parts.graphs.map(|inner| {
            Arc::new(ContextGraphs { inner, stamp: stamp.clone(), gate: gate.clone() }) as Arc<dyn GraphFactory>
        });
        let origin = Arc::new(Origin::new(stamp.clone(), gate, graphs));
        Ok(Generation {
            allocator: Arc::new(ContextAllocator::new(parts.allocator, stamp.clone())),
            toolchains: parts.compilers.iter().map(|_| OnceLock::new()).collect(),
            compilers: parts.compilers,
            missing: parts.missing,
            loader: Loader::of_generation(parts.runtime.clone(), origin),
            runtime: parts.runtime,
            queues: parts.queues.map(|q| Arc::new(ContextQueues::new(q, stamp)) as Arc<dyn DynQueueFactory>),
        })
    }
}

/// The device's allocator as callers see it: the backend's allocator of one generation,
/// behind that generation's stamp. A stale buffer's memory returns to the allocator that
/// minted it (never to a newer generation's); host transfers and views of it fail.
pub struct ContextAllocator {
    inner: Arc<dyn Allocator>,
    stamp: Stamp,
}

impl ContextAllocator {
    /// Guards `inner` (the backend allocator of the generation `stamp` names); the stamp
    /// must be of the generation `inner` belongs to.
    pub fn new(inner: Arc<dyn Allocator>, stamp: Stamp) -> ContextAllocator {
        ContextAllocator { inner, stamp }
    }
}

impl Allocator for ContextAllocator {
    fn device(&self) -> &DeviceSpec {
        self.inner.device()
    }

    fn alloc(&self, bytes: usize) -> Result<RawPtr> {
        self.stamp.check("a buffer")?;
        self.stamp.observe(self.inner.alloc(bytes))
    }

    unsafe fn free(&self, ptr: RawPtr, bytes: usize) {
        // SAFETY: forwarded from this function's contract; `ptr` came from `inner.alloc`.
        unsafe { self.inner.free(ptr, bytes) }
    }

    unsafe fn copyin(&self, dst: RawView, src: &[u8]) -> Result<()> {
        self.stamp.check("a buffer")?;
        // SAFETY: forwarded from this function's contract.
        self.stamp.observe(unsafe { self.inner.copyin(dst, src) })
    }

    unsafe fn copyout(&self, dst: &mut [u8], src: RawView) -> Result<()> {
        self.stamp.check("a buffer")?;
        // SAFETY: forwarded from this function's contract.
        self.stamp.observe(unsafe { self.inner.copyout(dst, src) })
    }

    unsafe fn copy(&self, dst: RawView, src: RawView) -> Result<()> {
        self.stamp.check("a buffer")?;
        // SAFETY: forwarded from this function's contract.
        self.stamp.observe(unsafe { self.inner.copy(dst, src) })
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
        self.stamp.check("a buffer")
    }
}

/// The device's queue factory as callers see it: queues of one generation refuse to submit
/// after a reset or a loss, and every signal is failed when its generation ends.
pub struct ContextQueues {
    inner: Arc<dyn DynQueueFactory>,
    stamp: Stamp,
}

impl ContextQueues {
    /// Guards `inner` (the backend queue factory of the generation `stamp` names): its
    /// queues take the stamp, and their signals are registered for failure with it.
    pub fn new(inner: Arc<dyn DynQueueFactory>, stamp: Stamp) -> ContextQueues {
        ContextQueues { inner, stamp }
    }

    fn queue(&self, q: DynQueue) -> DynQueue {
        q.with_stamp(self.stamp.clone())
    }
}

impl DynQueueFactory for ContextQueues {
    fn create_dyn_compute_queue(&self) -> Result<DynQueue> {
        self.stamp.check("a queue")?;
        Ok(self.queue(self.stamp.observe(self.inner.create_dyn_compute_queue())?))
    }

    fn create_dyn_copy_queue(&self) -> Result<Option<DynQueue>> {
        self.stamp.check("a queue")?;
        Ok(self.stamp.observe(self.inner.create_dyn_copy_queue())?.map(|q| self.queue(q)))
    }

    fn create_dyn_signal(&self) -> Result<Arc<dyn TimelineSignal>> {
        self.stamp.check("a signal")?;
        let s = self.stamp.observe(self.inner.create_dyn_signal())?;
        self.stamp.context().track(&s);
        // A loss that raced with the creation: the signal missed the sweep, fail it here.
        if let Err(e) = self.stamp.check("a signal") {
            s.fail(e);
        }
        Ok(s)
    }

    fn dyn_device(&self) -> &DeviceSpec {
        self.inner.dyn_device()
    }
}

/// The device's graph factory as callers see it: capture is refused once the generation
/// ended, and its graphs are guarded like its kernels.
struct ContextGraphs {
    inner: Arc<dyn GraphFactory>,
    stamp: Stamp,
    gate: Option<crate::kernel::LaunchGate>,
}

impl GraphFactory for ContextGraphs {
    fn capture(&self, launches: &[GraphLaunch]) -> Result<Option<Box<dyn LaunchGraph>>> {
        self.stamp.check("a kernel graph")?;
        let graph = self.stamp.observe(self.inner.capture(launches))?;
        Ok(graph.map(|inner| {
            let names = launches.iter().map(|l| l.program.name().to_string()).collect();
            Box::new(ContextGraph { inner, stamp: self.stamp.clone(), gate: self.gate.clone(), names })
                as Box<dyn LaunchGraph>
        }))
    }
}

/// A launch graph of one generation: refused once the generation ended, every replayed
/// launch admitted by the generation's launch gate, and a fatal failure while it runs marks
/// the device lost.
struct ContextGraph {
    inner: Box<dyn LaunchGraph>,
    stamp: Stamp,
    gate: Option<crate::kernel::LaunchGate>,
    /// The programs of the captured launches, in order, for the gate.
    names: Vec<String>,
}

impl LaunchGraph for ContextGraph {
    fn update(&mut self, launches: &[GraphLaunch]) -> Result<bool> {
        self.stamp.check("a kernel graph")?;
        let updated = self.stamp.observe(self.inner.update(launches))?;
        if updated {
            self.names = launches.iter().map(|l| l.program.name().to_string()).collect();
        }
        Ok(updated)
    }

    unsafe fn launch(&mut self) -> Result<()> {
        self.stamp.check("a kernel graph")?;
        if let Some(gate) = &self.gate {
            for name in &self.names {
                self.stamp.observe(gate(name))?;
            }
        }
        // SAFETY: forwarded from this function's contract.
        self.stamp.observe(unsafe { self.inner.launch() })
    }

    fn wait(&mut self, timeout: Duration) -> Result<()> {
        self.stamp.observe(self.inner.wait(timeout))
    }
}
