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
use crate::properties::DeviceProperties;
use crate::queue::DynQueueFactory;

/// A named (renderer, compiler) pair: one way a device turns kernels into programs. A device
/// offers one or more, the first being its default (the CPU: its C compiler for the host's
/// instruction set, then for older sets); [`crate::Device::compile_with`] picks one by name.
#[derive(Clone)]
pub struct CompilerPair {
    /// The pair's name on its device (`cc`, `cc-avx2`, `opencl-c`), as `--compiler`,
    /// Python's `compiler=` and `kiln devices` spell it.
    pub name: String,
    /// Turns kernels into the compiler's source.
    pub renderer: Arc<dyn Renderer>,
    /// Turns that source into programs.
    pub compiler: Arc<dyn Compiler>,
    /// What kernel generators should read when compiling with this pair, where it differs
    /// from the device's [`DeviceProperties`] (an older instruction set's vector width);
    /// `None`: the device's.
    pub properties: Option<DeviceProperties>,
}

impl CompilerPair {
    /// The pair `name` of `renderer` and `compiler`, described by the device's properties.
    pub fn new(name: impl Into<String>, renderer: Arc<dyn Renderer>, compiler: Arc<dyn Compiler>) -> CompilerPair {
        CompilerPair { name: name.into(), renderer, compiler, properties: None }
    }

    /// This pair described by `properties` instead of the device's.
    pub fn with_properties(mut self, properties: DeviceProperties) -> CompilerPair {
        self.properties = Some(properties);
        self
    }
}

impl std::fmt::Debug for CompilerPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompilerPair({})", self.name)
    }
}

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
    /// The pairs the backend has but cannot offer on this machine, each with why (a compiler
    /// library that is not installed): `kiln devices` lists them, and asking for one says why.
    pub missing: Vec<(String, String)>,
    /// Called before every launch of the generation's kernels (fault injection's hook).
    pub(crate) gate: Option<LaunchGate>,
}

impl DeviceParts {
    /// The parts every device has: memory, (renderer, compiler) pairs (the first is the
    /// default) and the program loader; no queues and no graphs.
    pub fn new(allocator: Arc<dyn Allocator>, compilers: Vec<CompilerPair>, runtime: RuntimeFactory) -> DeviceParts {
        DeviceParts { allocator, compilers, runtime, queues: None, graphs: None, missing: Vec::new(), gate: None }
    }

    /// These parts with the backend's hardware queues and signals.
    pub fn with_queues(mut self, queues: Arc<dyn DynQueueFactory>) -> DeviceParts {
        self.queues = Some(queues);
        self
    }

    /// These parts with the pairs the backend cannot offer here, each with why.
    pub fn with_missing(mut self, missing: Vec<(String, String)>) -> DeviceParts {
        self.missing = missing;
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
