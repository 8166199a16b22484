//! What a backend builds for one device generation ([`DeviceParts`]), as tinygrad's
//! `Compiled(device, allocator, renderer, runtime, graph)`: memory, compilers, the program
//! loader, and optionally hardware queues and launch graphs.

use std::sync::Arc;

use crate::buffer::Allocator;
use crate::context::DeviceContext;
use crate::error::Result;
use crate::graph::GraphFactory;
use crate::kernel::LaunchGate;
use crate::program::{Compiler, Renderer, RuntimeFactory};
use crate::queue::DynQueueFactory;

/// A (renderer, compiler) pair. A device may offer several (e.g. two C compilers).
pub type CompilerPair = (Arc<dyn Renderer>, Arc<dyn Compiler>);

/// What a backend builds for one device generation: memory, compilers, the program loader
/// and (optionally) hardware queues.
pub struct DeviceParts {
    /// The generation's raw allocator; the device wraps it so stale buffers are refused.
    pub allocator: Arc<dyn Allocator>,
    /// Available (renderer, compiler) pairs; the first is the default.
    pub compilers: Vec<CompilerPair>,
    /// Loads compiled kernels into this generation's context.
    pub runtime: RuntimeFactory,
    /// The device's hardware queues and signals, if its backend offers them.
    pub queues: Option<Arc<dyn DynQueueFactory>>,
    /// The device's launch graphs ([`crate::graph`]), if its backend offers them.
    pub graphs: Option<Arc<dyn GraphFactory>>,
    /// Called before every launch of the generation's kernels (fault injection's hook).
    pub(crate) gate: Option<LaunchGate>,
}

impl DeviceParts {
    /// The parts every device has: memory, (renderer, compiler) pairs (the first is the
    /// default) and the program loader; no queues and no graphs.
    pub fn new(allocator: Arc<dyn Allocator>, compilers: Vec<CompilerPair>, runtime: RuntimeFactory) -> DeviceParts {
        DeviceParts { allocator, compilers, runtime, queues: None, graphs: None, gate: None }
    }

    /// These parts with the backend's hardware queues and signals.
    pub fn with_queues(mut self, queues: Arc<dyn DynQueueFactory>) -> DeviceParts {
        self.queues = Some(queues);
        self
    }

    /// These parts with the backend's launch graphs.
    pub fn with_graphs(mut self, graphs: Arc<dyn GraphFactory>) -> DeviceParts {
        self.graphs = Some(graphs);
        self
    }
}

/// Builds the backend state of a device, once when it opens and again at every
/// [`crate::Device::reset`] (then `context.generation()` is already the new generation). Each call
/// must return fresh state that shares no allocator, queue or loaded program with an earlier
/// call: the previous generation's objects may still be alive (held by stale handles).
pub type PartsBuilder = Arc<dyn Fn(&DeviceContext) -> Result<DeviceParts> + Send + Sync>;
